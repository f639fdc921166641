"""Options and output handling shared by the verbs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from vramscope.errors import VramscopeError
from vramscope.report.model import Report
from vramscope.workload import PRECISIONS


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
        click.option("-q", "--quiet", is_flag=True, help="Do not print the report."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def tuning_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--precision/--accumulate/--allocator-config: override what the workload says."""
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
) -> None:
    """Print the report and write every file asked for."""
    if not quiet:
        from vramscope.report.terminal import print_report

        print_report(report)
    written = []
    if json_path:
        report.save(_writable(json_path))
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
        click.echo(f"vramscope: wrote {path}", err=True)


def check_paths(*paths: str | None) -> None:
    """Fail early, before a long run, when an output folder does not exist."""
    for path in paths:
        if path:
            _writable(path)
