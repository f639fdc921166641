"""``vramscope fit WORKLOAD (--gpu NAME | --budget SIZE)``: the largest batch that fits (the
longest sequence, with ``--seq-len``)."""

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
from vramscope.errors import VramscopeError
from vramscope.report.model import Report


@click.command(short_help="The largest batch size that fits a GPU or a budget.")
@click.argument("workload")
@click.option("--gpu", help="Target GPU (see `vramscope estimate --list-gpus`).")
@click.option(
    "--budget",
    help="Memory the allocator may reserve, e.g. 20GiB (as set_per_process_memory_fraction enforces).",
)
@click.option("--margin", default="5%", show_default=True, help="Safety margin below the target.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option(
    "--seq-len",
    is_flag=True,
    help="Find the longest sequence of an hf: model (its prompt, with @generate) instead, "
    "at --batch-size.",
)
@click.option(
    "-b",
    "--batch-size",
    type=click.IntRange(min=1),
    help="With --seq-len: the batch size.  [default: 1]",
)
@click.option(
    "--max-seq-len",
    type=click.IntRange(min=1),
    help="With --seq-len: the longest length tried.  [default: the model's positions]",
)
@click.option(
    "--effective-batch",
    type=click.IntRange(min=1),
    help="Also plan micro-batch × accumulation for this effective batch.",
)
@tuning_options
@click.option(
    "--verify",
    is_flag=True,
    help="Confirm with real runs on this machine's GPU, each in a fresh process.",
)
@parallel_options
@output_options
@answers
def command(
    workload: str,
    gpu: str | None,
    budget: str | None,
    margin: str,
    max_batch_size: int,
    seq_len: bool,
    batch_size: int | None,
    max_seq_len: int | None,
    effective_batch: int | None,
    precision: str | None,
    accumulate: int | None,
    allocator_config: str | None,
    verify: bool,
    parallel: Any,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> Report:
    """Find the largest batch size of WORKLOAD that fits --gpu NAME (device used) or
    --budget SIZE (reserved), from the estimator alone, in seconds, with no GPU needed.
    With --verify, real trials on this machine's GPU confirm it, and the verified batch
    size is the answer (the estimate's is shown beside it). With --seq-len, the longest
    sequence of an hf: model at --batch-size instead."""
    from vramscope.fit.render import render_fit_report
    from vramscope.fit.search import fit, fit_sequence

    check_paths(json_path, html_path, trace_path, csv_path)

    def progress(message: str) -> None:
        say(f"vramscope fit: {message}", quiet)

    common: dict[str, Any] = {
        "gpu": gpu,
        "budget": budget,
        "margin": margin,
        "precision": precision,
        "accumulate": accumulate,
        "allocator_config": allocator_config,
        "progress": progress,
        "parallel": parallel,
    }
    if seq_len:
        if verify or effective_batch:
            raise VramscopeError(
                f"--seq-len answers from the estimate alone; drop "
                f"{'--verify' if verify else '--effective-batch'}"
            )
        report = fit_sequence(
            workload, batch_size=batch_size or 1, max_seq_len=max_seq_len, **common
        )
        emit(report, json_path, html_path, trace_path, csv_path, quiet, render=render_fit_report)
        return report
    if batch_size is not None or max_seq_len is not None:
        raise VramscopeError(
            f"{'--batch-size' if batch_size is not None else '--max-seq-len'} goes with "
            "--seq-len (fit searches the batch size otherwise)"
        )
    if verify and parallel is not None:
        raise VramscopeError(
            "--verify runs trials on this machine's one GPU; with --world-size the answer is "
            "the estimate's"
        )
    if verify:
        import torch

        if not torch.cuda.is_available():
            raise VramscopeError(
                "--verify runs real trials and needs a CUDA GPU; this machine has none "
                "(drop --verify for the estimate alone)"
            )
    report = fit(
        workload,
        max_batch_size=max_batch_size,
        effective_batch=effective_batch,
        verify=verify,
        **common,
    )
    emit(report, json_path, html_path, trace_path, csv_path, quiet, render=render_fit_report)
    return report
