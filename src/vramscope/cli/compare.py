"""``vramscope compare WORKLOAD [WORKLOAD...]``: strategies, or model variants, side by side."""

from __future__ import annotations

from typing import Any

import click

from vramscope.cli.common import (
    check_paths,
    emit,
    output_options,
    parallel_options,
    say,
    tuning_options,
)
from vramscope.cli.exits import answers
from vramscope.report.model import Report


@click.command(short_help="Memory-saving strategies or model variants side by side.")
@click.argument("workloads", nargs=-1, required=True)
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--gpu", help="Target GPU (default h200).")
@click.option("--budget", help="Memory the allocator may reserve, e.g. 20GiB.")
@click.option("--margin", default="5%", show_default=True)
@click.option(
    "--strategies", help="Comma-separated subset, e.g. baseline,bf16-mixed,checkpointing."
)
@tuning_options
@click.option("--estimate-only", is_flag=True, help="Estimate even when a GPU is present.")
@parallel_options(each_strategy=True)
@output_options
@answers
def command(
    workloads: tuple[str, ...],
    batch_size: int,
    gpu: str | None,
    budget: str | None,
    margin: str,
    strategies: str | None,
    precision: str | None,
    accumulate: int | None,
    allocator_config: str | None,
    estimate_only: bool,
    parallel: Any,
    parallel_each: bool,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> Report:
    """Compare memory-saving strategies for one WORKLOAD (baseline, bf16-mixed, 16-mixed,
    checkpointing, accumulation, expandable segments, optimizer choices, ...), measured on
    this GPU in fresh processes when there is one, estimated otherwise; or compare several
    WORKLOADS (model variants) with the per-module difference. With --world-size N and no
    --strategy: DDP, ZeRO-1, ZeRO-2, HSDP and FSDP per rank side by side."""
    from vramscope.fit.compare import compare
    from vramscope.fit.render import render_fit_report
    from vramscope.fit.strategies import get_strategy

    check_paths(json_path, html_path, trace_path, csv_path)
    names = [s.strip() for s in strategies.split(",") if s.strip()] if strategies else None
    if not parallel_each:
        for name in names or []:
            get_strategy(name)  # unknown names: one line, exit 2
    report = compare(
        list(workloads),
        batch_size=batch_size,
        gpu=gpu,
        budget=budget,
        margin=margin,
        strategies=names,
        precision=precision,
        accumulate=accumulate,
        allocator_config=allocator_config,
        measured=False if estimate_only else None,
        progress=lambda msg: say(f"vramscope compare: {msg}", quiet),
        parallel=parallel,
        parallel_each=parallel_each,
    )
    emit(report, json_path, html_path, trace_path, csv_path, quiet, render=render_fit_report)
    return report
