"""``vramscope report FILE.json``: re-render a saved report, or ``--diff`` two of them;
``vramscope report RUN.journal``: make the report of a run from its journal."""

from __future__ import annotations

import json
from pathlib import Path

import click

from vramscope.cli.common import check_paths, emit, human_console, output_options, say, write_json
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
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--diff",
    "diff_path",
    type=click.Path(dir_okay=False),
    help="Compare with this report: what changed from PATH to it (terminal; HTML with --html).",
)
@output_options
def command(
    path: str,
    diff_path: str | None,
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
    """
    report, damaged = load(path)
    if diff_path is None:
        emit(report, json_path, html_path, trace_path, csv_path, quiet)
        if damaged:
            raise VramscopeError(damaged)
        return
    if damaged:
        raise VramscopeError(damaged)
    if trace_path or csv_path:
        raise VramscopeError("--trace and --csv export one report; drop them when using --diff")
    check_paths(json_path, html_path)
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
