"""``vramscope report FILE.json``: re-render a saved report."""

from __future__ import annotations

import click

from vramscope.cli.common import emit, output_options
from vramscope.report.model import Report


@click.command(short_help="Re-render a saved report.")
@click.argument("path", type=click.Path(dir_okay=False))
@output_options
def command(
    path: str,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> None:
    """Print the report saved in PATH (written with --json) and write other formats."""
    emit(Report.load(path), json_path, html_path, trace_path, csv_path, quiet)
