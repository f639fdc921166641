"""Options and output handling shared by the verbs."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from vramscope.errors import VramscopeError
from vramscope.report.model import Report


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--json/--html/--trace/--csv/--quiet, accepted by every verb that makes a report."""
    options = [
        click.option(
            "--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON."
        ),
        click.option(
            "--html",
            "html_path",
            type=click.Path(dir_okay=False),
            help="Write a self-contained HTML report.",
        ),
        click.option(
            "--trace",
            "trace_path",
            type=click.Path(dir_okay=False),
            help="Write a Chrome/Perfetto trace.",
        ),
        click.option(
            "--csv", "csv_path", type=click.Path(dir_okay=False), help="Write the steps as CSV."
        ),
        click.option(
            "-q",
            "--quiet",
            is_flag=True,
            help="Print nothing but errors; files are still written.",
        ),
    ]

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("json_path") != "-":
            return func(*args, **kwargs)
        with json_on_stdout():
            return func(*args, **kwargs)

    for option in reversed(options):
        command = option(command)
    return command


class _JsonStdout:
    """Where ``--json -`` writes while everything else that would go to stdout goes to stderr."""

    fd: int | None = None  # a duplicate of the real stdout's file descriptor
    stream: Any = None  # the real sys.stdout, when it has no file descriptor


@contextlib.contextmanager
def json_on_stdout() -> Iterator[None]:
    """``--json -``: stdout carries the JSON alone. Meanwhile text for people (the report,
    a script's own prints, its subprocesses' output) goes to stderr, at the Python level and
    at the file-descriptor level; ``write_json`` writes to the real stdout."""
    real = sys.stdout
    real.flush()
    fd: int | None
    try:
        fd, err_fd = real.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        fd = err_fd = None
    saved = None
    if fd is not None and err_fd is not None:
        saved = os.dup(fd)
        os.dup2(err_fd, fd)
    _JsonStdout.fd, _JsonStdout.stream = saved, real
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout = real
        if saved is not None and fd is not None:
            os.dup2(saved, fd)
            os.close(saved)
        _JsonStdout.fd = _JsonStdout.stream = None


def real_stdout() -> int | None:
    """Under ``--json -``: a descriptor of the real stdout, for a child process that writes
    the JSON (None otherwise: the child inherits stdout)."""
    return _JsonStdout.fd


def write_json(text: str, path: str) -> None:
    """Write JSON ``text`` to ``path``; ``-`` is stdout (the real one under ``--json -``)."""
    if not text.endswith("\n"):
        text += "\n"
    if path != "-":
        try:
            _writable(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise VramscopeError(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    if _JsonStdout.fd is not None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(_JsonStdout.fd, data) :]
    else:
        stream = _JsonStdout.stream or sys.stdout
        stream.write(text)
        stream.flush()


def human_console() -> Any:
    """A rich Console for text meant for people: stdout, which ``--json -`` points at stderr."""
    from rich.console import Console

    return Console()


def say(message: str, quiet: bool = False) -> None:
    """One line of progress or a note on stderr, unless ``--quiet``."""
    if not quiet:
        click.echo(message, err=True)


def _trust_remote_code(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        from vramscope.hf_models import trust_remote_code_for_process

        trust_remote_code_for_process()


def tuning_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--precision/--accumulate/--allocator-config: override what the workload says;
    --trust-remote-code: ``hf:`` models may run code from their repositories."""
    from vramscope.workload import PRECISIONS  # imports torch: only verbs that build workloads

    options = [
        click.option(
            "--precision",
            type=click.Choice(PRECISIONS),
            help="Override the workload's precision.",
        ),
        click.option(
            "--accumulate",
            type=click.IntRange(min=1),
            help="Micro-batches per optimizer step (overrides the workload).",
        ),
        click.option(
            "--allocator-config",
            help="PYTORCH_CUDA_ALLOC_CONF options, e.g. expandable_segments:True.",
        ),
        click.option(
            "--trust-remote-code",
            is_flag=True,
            expose_value=False,
            callback=_trust_remote_code,
            help="Let an hf: model run the code its repository ships (its config's auto_map).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--batch-size and the tuning options, for verbs that run one batch size."""
    func = tuning_options(func)
    return click.option(
        "-b",
        "--batch-size",
        type=click.IntRange(min=1),
        default=8,
        show_default=True,
        help="Micro-batch size passed to the build function.",
    )(func)


def _writable(path: str) -> Path:
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise VramscopeError(f"cannot write {target}: folder {target.parent} does not exist")
    return target


def emit(
    report: Report,
    json_path: str | None = None,
    html_path: str | None = None,
    trace_path: str | None = None,
    csv_path: str | None = None,
    quiet: bool = False,
    render: Callable[[Report], Any] | None = None,
) -> None:
    """Print the report (``render``'s view of it, else the standard one) unless ``quiet``,
    and write every file asked for; ``json_path`` ``-`` is stdout."""
    if not quiet:
        if render is not None:
            human_console().print(render(report))
        else:
            from vramscope.report.terminal import print_report

            print_report(report, human_console())
    written = []
    if json_path:
        write_json(report.to_json(), json_path)
        if json_path != "-":
            written.append(json_path)
    exporters = {"html": html_path, "trace": trace_path, "csv": csv_path}
    for kind, path in exporters.items():
        if not path:
            continue
        target = _writable(path)
        try:
            from vramscope.report import exports
        except ImportError:
            raise VramscopeError(f"--{kind} is not available in this version") from None
        exports.write(kind, report, target)
        written.append(path)
    for path in written:
        say(f"vramscope: wrote {path}", quiet)


def check_paths(*paths: str | None) -> None:
    """Fail early, before a long run, when an output folder does not exist."""
    for path in paths:
        if path:
            _writable(path)
