"""``vramscope run [OPTIONS] SCRIPT [ARGS...]``: an unmodified script under tracking."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from vramscope.cli.common import check_paths, emit, output_options, real_stdout
from vramscope.distributed import DEFAULT_TIMEOUT_S, VIA

# the timeline's sampling interval, shared by run and measure
interval_option = click.option(
    "--interval",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Timeline sampling interval in seconds [default: 0.1; 0.5 while the steps are so "
    "short that their phases are read on a sample of them].",
)


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
                "--module-steps",
                "module_steps",
                default="auto",
                show_default=True,
                metavar="auto|all|first|N",
                help="With --detail modules: the steps that place module markers. auto: every "
                "step while the markers cost under 2% of a step, else the first 3 and every "
                "N-th with N chosen to keep that; all: every step; first: the first 3; N: the "
                "first 3 and every N-th. A step after a new peak in a step without markers is "
                "marked too. Phase peaks cover every step either way; on CUDA the allocator's "
                "trace runs in the marked steps.",
            ),
            click.option(
                "--phase-steps",
                "phase_steps",
                default="auto",
                show_default=True,
                metavar="auto|all|N",
                help="On CUDA, the steps that read the allocator at every phase boundary. auto: "
                "every step while the reads cost under 0.5% of a step, else the first 5 and "
                "1 in N (0.1% on average); the steps between read nothing and are folded "
                "into the read step before them, whose peak includes theirs exactly. all: "
                "every step.",
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


def distributed_options(func):
    """--nproc, --gather-timeout, --gather-via: runs under torchrun."""
    for option in reversed(
        [
            click.option(
                "--nproc",
                type=click.IntRange(min=1),
                help="Start N ranks on this machine with torchrun (python -m "
                "torch.distributed.run --standalone) and write one report with a row per rank.",
            ),
            click.option(
                "--gather-timeout",
                type=click.FloatRange(min=0),
                default=DEFAULT_TIMEOUT_S,
                show_default=True,
                metavar="SECONDS",
                help="Under torchrun: how long rank 0 waits, once its script has ended, for the "
                "other ranks' reports; a rank that has not reported by then is marked timed out.",
            ),
            click.option(
                "--gather-via",
                type=click.Choice(VIA),
                default="auto",
                show_default=True,
                help="Under torchrun: auto sends each rank's report through the job's store "
                "(and files); files only through files beside --json (a shared folder for "
                "several machines).",
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
@interval_option
@click.option(
    "--allocator-config",
    help="PYTORCH_CUDA_ALLOC_CONF options for the run, e.g. expandable_segments:True.",
)
@detail_options
@distributed_options
@output_options
def command(
    script: str,
    args: tuple[str, ...],
    interval: float | None,
    allocator_config: str | None,
    detail: str,
    depth: int,
    module_steps: str,
    phase_steps: str,
    lines_of: tuple[str, ...],
    snapshot_path: str | None,
    nproc: int | None,
    gather_timeout: float,
    gather_via: str,
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
    interrupted script still leaves a partial report, and one whose process is killed
    (SIGKILL, the OOM killer, a segfault, os._exit) a report made from its journal
    (NAME.journal beside --json NAME.json, written as the run goes).

    Under torchrun (`torchrun --nproc-per-node N -m vramscope run ...`, or `--nproc N`)
    each rank tracks itself and rank 0 writes one report with a row per rank.
    """
    if nproc is not None:
        check_paths(json_path, html_path, trace_path, csv_path, snapshot_path)
        from vramscope.distributed.launch import launch

        forwarded = _run_options(click.get_current_context().params)

        def without_rank_0() -> None:  # rank 0 was killed: the job's report from its files
            if not json_path or json_path == "-":
                return
            from vramscope.distributed.journals import job_report_from_files

            folder = Path(json_path).with_name(Path(json_path).stem + ".ranks")
            report = job_report_from_files(folder, nproc)
            if report is not None:
                emit(report, json_path, html_path, trace_path, csv_path, quiet)
                click.echo(
                    f"vramscope: rank 0 ended without the job's report; it is made from the "
                    f"ranks' reports and journals in {folder}",
                    err=True,
                )

        code = launch(
            nproc,
            forwarded,
            script,
            list(args),
            stdout=real_stdout(),
            without_rank_0=without_rank_0,
        )
        if code:
            sys.exit(code)
        return
    from vramscope.distributed.rank import RankInfo

    child = None
    if RankInfo.from_env() is None:  # (torchrun's agent already watches each rank)
        check_paths(json_path, html_path, trace_path, csv_path, snapshot_path)
        outputs = dict(
            json_path=json_path,
            html_path=html_path,
            trace_path=trace_path,
            csv_path=csv_path,
            quiet=quiet,
        )
        child = _run_in_child(script, outputs)
    # torch is imported from here on: `--nproc` above starts torchrun without it, and the
    # process that watches the script's forks before it
    from vramscope.distributed.job import RankJob
    from vramscope.tracking.runner import StopSignals, apply_allocator_config, run_script
    from vramscope.tracking.session import Session

    job = RankJob.from_env(json_path=json_path, timeout_s=gather_timeout, via=gather_via)
    gatherer = job is None or job.is_gatherer
    said = "vramscope: " if job is None else f"vramscope: rank {job.info.rank}: "
    if gatherer:
        check_paths(json_path, html_path, trace_path, csv_path, snapshot_path)
    if job is not None and snapshot_path and job.info.world_size > 1:
        path = Path(snapshot_path)  # a snapshot per rank
        snapshot_path = str(path.with_name(f"{path.stem}.rank{job.info.rank}{path.suffix}"))
    apply_allocator_config(allocator_config)
    if snapshot_path and detail == "default":
        detail = "modules"
    session = Session(
        interval_s=interval,
        workload={"allocator_config": allocator_config},
        detail=detail,
        depth=depth,
        module_steps=module_steps,
        phase_steps=phase_steps,
        lines_of=list(lines_of) or [script],
        snapshot=snapshot_path,
        journal=child.journal if child is not None else None,
    )
    if job is not None:
        job.start(session)
    # SIGTERM/SIGHUP while the script runs end it; while the files are written, they wait
    with StopSignals() as stops:
        report, code = run_script(script, list(args), session, stops)
        sys.stdout.flush()
        status = report.exit.status
        snapshot = report.extra.get("snapshot")
        if job is not None:  # rank 0 gets the job's report; the other ranks None
            try:
                report = job.finish(report, stopping=lambda: stops.received is not None)
            except Exception as exc:  # never lose the rank's own report to the gathering
                click.echo(f"{said}the ranks' reports were not gathered: {exc}", err=True)
                report = report if gatherer else None
        if report is not None:
            emit(report, json_path, html_path, trace_path, csv_path, quiet)
        if child is not None:
            child.reported()
        if snapshot and not quiet:
            click.echo(f"{said}wrote {snapshot}", err=True)
    if stops.received is not None:
        code = stops.received.exit_code
        if status == "terminated":
            click.echo(f"{said}{script} was {stops.received}; the report is partial", err=True)
        else:
            click.echo(f"{said}{stops.received} after {script} ended", err=True)
    elif code:
        click.echo(f"{said}{script} exited with code {code}; the report is partial", err=True)
    if code:
        sys.exit(code)


def _run_in_child(script: str, outputs: dict[str, Any]) -> Any:
    """Fork the process that runs the script (see :mod:`vramscope.journal.supervise`); this
    one waits and makes the report from the journal if that process dies without one. In
    the child, its side (the journal's path); None where it cannot fork (the script then
    runs here, and a SIGKILL leaves no report)."""
    from vramscope.journal import files
    from vramscope.journal.supervise import supervise, why_not_supervised

    if why_not_supervised() is not None or not Path(script).is_file():
        return None
    json_path = outputs["json_path"]
    try:
        journal = files.beside(json_path) if json_path and json_path != "-" else None
        if journal is None:  # the private directory: runs that died there, pruned first
            from vramscope.journal.leftovers import prune

            prune()
            journal = files.private_path()
    except (files.StatusDirError, OSError) as exc:
        click.echo(f"vramscope: no journal ({exc}): a killed run leaves no report", err=True)
        return None

    def on_death(ending: Any) -> None:
        from vramscope.cli.recovered import report_on_death

        report_on_death(journal, script, ending, outputs)

    return supervise(journal, on_death)


def _run_options(params: dict[str, Any]) -> list[str]:
    """The options ``run`` was given, again, for each rank that ``--nproc`` starts."""
    names = {
        "interval": "--interval",
        "allocator_config": "--allocator-config",
        "detail": "--detail",
        "depth": "--depth",
        "module_steps": "--module-steps",
        "phase_steps": "--phase-steps",
        "snapshot_path": "--snapshot",
        "gather_timeout": "--gather-timeout",
        "gather_via": "--gather-via",
        "json_path": "--json",
        "html_path": "--html",
        "trace_path": "--trace",
        "csv_path": "--csv",
    }
    options = []
    for key, name in names.items():
        if params.get(key) is not None:
            value = params[key]
            options += [name, repr(value) if isinstance(value, float) else str(value)]
    for name in params.get("lines_of") or ():
        options += ["--lines-of", name]
    return options + (["--quiet"] if params.get("quiet") else [])
