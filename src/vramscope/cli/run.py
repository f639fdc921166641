"""``vramscope run [OPTIONS] SCRIPT [ARGS...]``: an unmodified script under tracking."""

from __future__ import annotations

import sys

import click

from vramscope.cli.common import check_paths, emit, output_options
from vramscope.tracking.runner import StopSignals, apply_allocator_config, run_script
from vramscope.tracking.session import Session


def detail_options(func):
    """--detail/--depth/--lines-of/--snapshot (attribution), shared by run and measure."""
    for option in reversed(
        [
            click.option(
                "--detail",
                type=click.Choice(["default", "modules", "lines"]),
                default="default",
                show_default=True,
                help="modules: module tree, exact categories and the tensors of the peak; "
                "lines: also a memory table per source line.",
            ),
            click.option(
                "--depth",
                type=click.IntRange(min=0),
                default=3,
                show_default=True,
                help="Module tree depth shown with --detail modules.",
            ),
            click.option(
                "--lines-of",
                "lines_of",
                multiple=True,
                metavar="NAME",
                help="With --detail lines: a function name or a .py file to profile "
                "(repeatable; default: the script's own lines).",
            ),
            click.option(
                "--snapshot",
                "snapshot_path",
                type=click.Path(dir_okay=False),
                help="Write a snapshot for PyTorch's memory viewer (pytorch.org/memory_viz), "
                "with module and phase names; implies --detail modules.",
            ),
        ]
    ):
        func = option(func)
    return func


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
@detail_options
@output_options
def command(
    script: str,
    args: tuple[str, ...],
    interval: float,
    allocator_config: str | None,
    detail: str,
    depth: int,
    lines_of: tuple[str, ...],
    snapshot_path: str | None,
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
    check_paths(json_path, html_path, trace_path, csv_path, snapshot_path)
    apply_allocator_config(allocator_config)
    if snapshot_path and detail == "default":
        detail = "modules"
    session = Session(
        interval_s=interval,
        workload={"allocator_config": allocator_config},
        detail=detail,
        depth=depth,
        lines_of=list(lines_of) or [script],
        snapshot=snapshot_path,
    )
    # SIGTERM/SIGHUP while the script runs end it; while the files are written, they wait
    with StopSignals() as stops:
        report, code = run_script(script, list(args), session, stops)
        sys.stdout.flush()
        emit(report, json_path, html_path, trace_path, csv_path, quiet)
        if report.extra.get("snapshot") and not quiet:
            click.echo(f"vramscope: wrote {report.extra['snapshot']}", err=True)
    if stops.received is not None:
        code = stops.received.exit_code
        if report.exit.status == "terminated":
            click.echo(f"vramscope: {script} was {stops.received}; the report is partial", err=True)
        else:
            click.echo(f"vramscope: {stops.received} after {script} ended", err=True)
    elif code:
        click.echo(f"vramscope: {script} exited with code {code}; the report is partial", err=True)
    if code:
        sys.exit(code)
