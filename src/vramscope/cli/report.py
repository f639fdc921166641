"""``vramscope report FILE.json``: re-render a saved report, or ``--diff`` two of them;
``vramscope report RUN.journal``: make the report of a run from its journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from vramscope.cli.common import (
    check_paths,
    emit,
    human_console,
    output_options,
    say,
    write_json,
)
from vramscope.errors import VramscopeError
from vramscope.report.model import Report


def reworded(report: Report) -> Report:
    """A saved report with its sentences made again from its numbers (a file written by an
    older version says them in today's words): the findings, and an estimate's verdict."""
    from vramscope.report.findings import reword
    from vramscope.report.verdict import sentence

    reword(report)
    verdict = report.extra.get("verdict")
    if isinstance(verdict, dict) and isinstance(verdict.get("fits"), bool):
        for finding in report.findings:
            if finding.kind == "verdict":
                finding.message = sentence(verdict)
    return report


def _labels(a: str, b: str) -> tuple[str, str]:
    """Short names for the two files: their names, or their paths when the names agree."""
    name_a, name_b = Path(a).name, Path(b).name
    return (a, b) if name_a == name_b else (name_a, name_b)


def load(path: str) -> tuple[Report, str | None]:
    """The report in ``path`` (a report's JSON, or a run's journal), and the line that says
    the journal is damaged (None: nothing to say)."""
    from vramscope.journal.files import SUFFIX
    from vramscope.journal.reader import looks_like_journal

    if path.endswith(SUFFIX) or looks_like_journal(path):
        from vramscope.cli.recovered import load_journal_report

        return load_journal_report(path)
    return reworded(Report.load(path)), None


@click.command(short_help="Re-render a saved report, or compare two.")
@click.argument("path", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--diff",
    "diff_path",
    type=click.Path(dir_okay=False),
    help="Compare with this report: what changed from PATH to it (terminal; HTML with --html).",
)
@click.option(
    "--list",
    "list_journals",
    is_flag=True,
    help="List the journals in your private directory (those of runs that died) and prune "
    "the old ones; with --json, as JSON.",
)
@output_options
def command(
    path: str | None,
    diff_path: str | None,
    list_journals: bool,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> None:
    """Print the report saved in PATH (written with --json) and write other formats.

    PATH may be a run's journal (NAME.journal, written as the run goes): the report is
    made from it, as `vramscope run` makes it when the script's process dies. A damaged
    journal gives the report of what is intact, then one line and exit code 2.

    With --diff OTHER.json, show what changed from PATH (the baseline) to OTHER: peaks,
    what the peak is made of, each phase and module, with absolute and % changes;
    --html and --json then write the diff.

    With --list, the journals in your private directory ($XDG_RUNTIME_DIR/vramscope, else
    /tmp/vramscope-UID): those of track(), measure(), @vramscope.profile, the pytest
    plugin, %%vramscope and `vramscope run` without --json. One whose process no longer
    runs is a left-over of a run that died: `vramscope report PATH` makes its report.
    Left-overs are removed after 7 days, and beyond the 20 newest.
    """
    if list_journals:
        if path or diff_path or html_path or trace_path or csv_path:
            raise click.UsageError("--list takes no PATH, and of the outputs only --json")
        show_journals(json_path, quiet)
        return
    if path is None:
        raise click.UsageError("give the PATH of a report or a journal (or --list)")
    if diff_path is not None and (trace_path or csv_path):
        raise VramscopeError("--trace and --csv export one report; drop them when using --diff")
    check_paths(json_path, html_path, trace_path, csv_path)  # before anything is printed
    report, damaged = load(path)
    if diff_path is None:
        emit(report, json_path, html_path, trace_path, csv_path, quiet)
        if damaged:
            raise VramscopeError(damaged)
        return
    if damaged:
        raise VramscopeError(damaged)
    from vramscope.report.diff import diff_reports, print_diff, write_html

    other, damaged = load(diff_path)
    if damaged:
        raise VramscopeError(damaged)
    label_a, label_b = _labels(path, diff_path)
    diff = diff_reports(report, other, label_a, label_b)
    if not quiet:
        print_diff(diff, human_console())
    try:
        if html_path:
            write_html(diff, html_path, report, other)
            say(f"vramscope: wrote {html_path}", quiet)
    except OSError as exc:
        raise VramscopeError(f"cannot write {exc.filename}: {exc.strerror or exc}") from None
    if json_path:
        write_json(json.dumps(diff.to_dict(), indent=1), json_path)
        if json_path != "-":
            say(f"vramscope: wrote {json_path}", quiet)


def show_journals(json_path: str | None, quiet: bool) -> None:
    """``--list``: the private directory's journals, as a table (and JSON with --json);
    the left-overs past the rule are pruned first."""
    from vramscope.journal import leftovers
    from vramscope.tracking.status import StatusDirError

    try:
        found = leftovers.list_journals()
    except StatusDirError as exc:
        raise VramscopeError(str(exc)) from None
    except OSError as exc:
        raise VramscopeError(
            f"cannot list {leftovers.directory()}: {exc.strerror or exc}"
        ) from None
    if json_path:
        listing = {
            "directory": str(leftovers.directory()),
            "keep_days": leftovers.KEEP_DAYS,
            "keep_count": leftovers.KEEP_COUNT,
            "journals": [entry.to_dict() for entry in found],
        }
        write_json(json.dumps(listing, indent=1), json_path)
        if json_path != "-":
            say(f"vramscope: wrote {json_path}", quiet)
    if quiet:
        return
    # one line per fact, never wrapped: a path or a command stays whole to copy
    human_console().print(journals_text(found, leftovers.directory()), soft_wrap=True)


def journals_text(found: list, directory: Path) -> Any:
    """What ``--list`` prints: each journal's path, then its start, pid, whether its process
    runs, steps and size, then its run's name and command line (text from the user's
    machine: never read as markup)."""
    import datetime
    import os
    import shlex

    from rich.text import Text

    from vramscope.journal import leftovers
    from vramscope.units import format_bytes

    rule = (
        f"A left-over is removed after {leftovers.KEEP_DAYS} days, and beyond the "
        f"{leftovers.KEEP_COUNT} newest."
    )
    if not found:
        return Text(f"No journals in {directory}: no tracked run died there. {rule}")
    text = Text(f"Journals in {directory} (a left-over's process died):\n")
    for entry in found:
        when = datetime.datetime.fromtimestamp(entry.started or entry.modified)
        process = "running" if entry.alive else "died"
        if entry.ended and not entry.alive:
            process += f" ({entry.ended})"
        steps = "? steps" if entry.steps is None else f"{entry.steps} steps"
        text.append(f"\n  {entry.path}\n", style="dim" if entry.alive else "bold")
        text.append(
            f"    started {when:%Y-%m-%d %H:%M:%S} · pid {entry.pid} · {process} · {steps} · "
            f"{format_bytes(entry.size)}\n"
        )
        command = list(entry.command)
        if command:
            command[0] = os.path.basename(command[0]) or command[0]
        run = " · ".join(w for w in (entry.name, shlex.join(command)) if w)
        if run:
            text.append(f"    {run}\n")
        if entry.problem:
            text.append(f"    {entry.problem}\n", style="yellow")
    dead = [entry for entry in found if not entry.alive and entry.steps is not None]
    if dead:
        newest = max(dead, key=lambda entry: entry.modified)
        text.append(
            f"\nvramscope report {newest.path} --json run.json --html run.html makes a "
            f"left-over's report (one whose process runs is a run in progress). {rule}"
        )
    elif all(entry.alive for entry in found):
        text.append(f"\nNone is a left-over: each one's process still runs. {rule}")
    else:
        text.append(f"\n{rule}")
    return text
