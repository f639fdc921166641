"""``vramscope run [OPTIONS] SCRIPT [ARGS...]``: an unmodified script under tracking."""

from __future__ import annotations

import sys

import click

from vramscope.cli.common import check_paths, emit, output_options
from vramscope.tracking.runner import apply_allocator_config, run_script
from vramscope.tracking.session import Session


@click.command(
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False},
    short_help="Run a training or inference script under tracking.",
)
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.001),
    default=0.1,
    show_default=True,
    help="Timeline sampling interval in seconds.",
)
@click.option(
    "--allocator-config",
    help="PYTORCH_CUDA_ALLOC_CONF options for the run, e.g. expandable_segments:True.",
)
@output_options
def command(
    script: str,
    args: tuple[str, ...],
    interval: float,
    allocator_config: str | None,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> None:
    """Run SCRIPT with ARGS as `python SCRIPT ARGS` would, and report its memory.

    vramscope's options come before the script; everything after it is the script's.
    Phases (forward, backward, optimizer, zero_grad, data), steps and epochs are found
    without changing the script. The script's exit code is kept; a failing or
    interrupted script still leaves a partial report.
    """
    check_paths(json_path, html_path, trace_path, csv_path)
    apply_allocator_config(allocator_config)
    session = Session(interval_s=interval, workload={"allocator_config": allocator_config})
    report, code = run_script(script, list(args), session)
    sys.stdout.flush()
    emit(report, json_path, html_path, trace_path, csv_path, quiet)
    if code:
        click.echo(f"vramscope: {script} exited with code {code}; the report is partial", err=True)
        sys.exit(code)
