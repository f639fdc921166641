"""``vramscope measure WORKLOAD``: build a workload and measure real steps on this device."""

from __future__ import annotations

import sys

import click

from vramscope.cli.common import check_paths, emit, output_options, workload_options
from vramscope.cli.exits import exit_code
from vramscope.cli.run import detail_options, interval_option
from vramscope.journal import files
from vramscope.tracking.runner import StopSignals, measure


@click.command(short_help="Measure real steps of a workload.")
@click.argument("workload")
@workload_options
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Steps to measure, the first included.",
)
@click.option("--device", help="cuda, cuda:N or cpu (default: CUDA when present).")
@interval_option
@detail_options
@output_options
def command(
    workload: str,
    batch_size: int,
    precision: str | None,
    accumulate: int | None,
    allocator_config: str | None,
    steps: int,
    device: str | None,
    interval: float | None,
    detail: str,
    depth: int,
    module_steps: str,
    phase_steps: str,
    lines_of: tuple[str, ...],
    snapshot_path: str | None,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> None:
    """Build WORKLOAD (path/to/file.py:function or example:cnn, example:gpt, ...) and
    measure STEPS real steps on the local device, the first step included.

    The run's journal is written as the steps go (NAME.journal beside --json NAME.json,
    removed once the report is written): if the process is killed, `vramscope report
    NAME.journal` makes its report."""
    check_paths(json_path, html_path, trace_path, csv_path, snapshot_path)
    journal = files.beside(json_path) if json_path and json_path != "-" else None
    with StopSignals() as stops:  # SIGTERM/SIGHUP end the steps and leave the report
        report = measure(
            workload,
            batch_size=batch_size,
            steps=steps,
            device=device,
            precision=precision,
            accumulate=accumulate,
            allocator_config=allocator_config,
            interval_s=interval,
            detail="modules" if snapshot_path and detail == "default" else detail,
            depth=depth,
            module_steps=module_steps,
            phase_steps=phase_steps,
            lines_of=list(lines_of) or None,
            snapshot=snapshot_path,
            stops=stops,
            journal=journal or True,  # (True: the private directory, removed at the end)
        )
        emit(report, json_path, html_path, trace_path, csv_path, quiet)
        if journal is not None:
            files.remove(journal)  # the report has everything it held
        if report.extra.get("snapshot") and not quiet:
            click.echo(f"vramscope: wrote {report.extra['snapshot']}", err=True)
    if stops.received is not None and report.exit.status == "ok":
        click.echo(f"vramscope: {stops.received} after the steps ended", err=True)
        sys.exit(stops.received.exit_code)
    if report.exit.status != "ok":
        said = {
            "oom": "ran out of memory",
            "interrupted": "was interrupted (Ctrl-C)",
            "terminated": f"was {report.exit.error or 'stopped'}",
        }.get(report.exit.status, f"failed: {report.exit.error}")
        partial = "; the report is partial" if report.exit.status != "oom" else ""
        click.echo(f"vramscope: the workload {said}{partial}", err=True)
    code = exit_code(report)  # 0 fits, 1 out of memory, 2 the workload failed, 130/143 stopped
    if code:
        sys.exit(code)
