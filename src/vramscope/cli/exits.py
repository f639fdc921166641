"""Exit codes: one policy for ``estimate``, ``fit``, ``compare`` and ``measure``, so that a
script can act on the answer without reading it: 0 answered and it fits, 1 answered and it
does not fit, 2 bad input, 128 + the signal's number when stopped (130 for Ctrl-C, 143 for
SIGTERM, 129 for SIGHUP). ``EXIT_CODES`` is the table ``docs/exit-codes.md`` shows; ``run``
exits with the script's own code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from vramscope.report.model import ExitInfo, Report
from vramscope.stops import Stopped, check, said, signal_of

FITS = 0
DOES_NOT_FIT = 1
BAD_INPUT = 2

# (code, meaning): the table docs/exit-codes.md shows
EXIT_CODES = (
    (
        FITS,
        "answered, and it fits: the estimate's verdict fits, `fit` found a batch size (or "
        "sequence) of 1 or more, a strategy `compare` put side by side fits, `measure`'s steps "
        "ran",
    ),
    (
        DOES_NOT_FIT,
        "answered, and it does not fit: the verdict does not fit, not even batch size 1 fits, "
        "no strategy compared fits, `measure` ran out of memory",
    ),
    (
        BAD_INPUT,
        "bad input: an unknown GPU, a budget of 0, options that cannot go together, a workload "
        "that cannot be built or whose step raised; one line on stderr says what and what to do",
    ),
    (
        130,
        "interrupted by Ctrl-C (SIGINT): one line says so, and what was done so far is written "
        "to `--json` (and the other files asked for), marked partial",
    ),
    (143, "stopped by SIGTERM (a scheduler, `timeout`, `kill`), the same way"),
    (129, "stopped by SIGHUP (a closed terminal), the same way"),
)


def fits(report: Report) -> bool | None:
    """Whether the report's answer fits: the fit's largest batch (or sequence) is 1 or more,
    a strategy compared fits, the estimate's verdict says so, a measured run did not run out
    of memory. None when the report answers no such question."""
    section = report.extra.get("fit")
    if isinstance(section, dict):
        rows = section.get("strategies")
        if isinstance(rows, list):
            return any(isinstance(r, dict) and r.get("fits") for r in rows)
        answer = section.get("answer")
        best = answer.get("max_batch_size") if isinstance(answer, dict) else None
        if best is None:
            best = section.get("max_batch_size", section.get("max_seq_len"))
        if isinstance(best, int):
            return best >= 1
    verdict = report.extra.get("verdict")
    if isinstance(verdict, dict) and isinstance(verdict.get("fits"), bool):
        return verdict["fits"]
    if report.exit.status == "oom":
        return False
    return None


def exit_code(report: Report) -> int:
    """The code the process ends with for ``report``: stopped (130, 143, 129), a workload
    that failed (2), and otherwise 0 when the answer fits, 1 when it does not."""
    status = report.exit.status
    if status in ("interrupted", "terminated"):
        return report.exit.code or 130
    if status == "error":
        return BAD_INPUT
    return DOES_NOT_FIT if fits(report) is False else FITS


def stopped_exit(exc: BaseException) -> ExitInfo:
    """How a report made before an interruption says it was stopped."""
    name, code = signal_of(exc)
    status = "interrupted" if name == "SIGINT" else "terminated"
    return ExitInfo(
        status=status, code=code, error=said(exc), signal=name, signal_number=code - 128
    )


def answers(func: Callable[..., Report | None]) -> Callable[..., None]:
    """For a verb that returns its Report after writing it: the process exits with the
    answer's code (:func:`exit_code`). Ctrl-C or a stop signal ends it in one line, with what
    it had (a partial Report the work attached to the exception) written to the files asked
    for, and the signal's code."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> None:
        try:
            check()  # Ctrl-C while the command was loading
            report = func(*args, **kwargs)
        except (KeyboardInterrupt, Stopped) as exc:
            stop(exc, getattr(exc, "partial_report", None), kwargs)
        if report is not None:
            code = exit_code(report)
            if code:
                sys.exit(code)

    return command


def stop(exc: BaseException, report: Report | None, options: dict[str, Any]) -> None:
    """Say in one line that the command was stopped, write ``report`` (what it had) where
    ``--json``/``--html``/``--trace``/``--csv`` asked, and exit with the signal's code."""
    from vramscope.cli.common import emit

    code = signal_of(exc)[1]
    files = [
        options.get(key)
        for key in ("json_path", "html_path", "trace_path", "csv_path")
        if options.get(key)
    ]
    line = said(exc)
    if report is not None and files:
        report.exit = stopped_exit(exc)
        try:
            emit(
                report,
                options.get("json_path"),
                options.get("html_path"),
                options.get("trace_path"),
                options.get("csv_path"),
                quiet=True,
            )
            shown = [f for f in files if f != "-"] or ["stdout"]
            line += f"; what it had is written, marked partial: {', '.join(shown)}"
        except Exception as error:  # the line below still goes out, with the code
            line += f"; the partial report was not written: {error}"
    elif files:
        line += "; nothing to write yet"
    click.echo(f"vramscope: {line}", err=True)
    sys.exit(code)
