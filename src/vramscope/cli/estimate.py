"""``vramscope estimate WORKLOAD --gpu NAME``: predict GPU memory without that GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from vramscope.cli.common import (
    check_paths,
    emit,
    output_options,
    parallel_options,
    workload_options,
)
from vramscope.cli.exits import answers
from vramscope.errors import VramscopeError
from vramscope.report.model import Report
from vramscope.report.validation import validation
from vramscope.report.verdict import sentence as verdict_sentence
from vramscope.stops import partial_on_stop
from vramscope.units import format_bytes, parse_size


@click.command(short_help="Predict peak GPU memory on a named GPU, without it.")
@click.argument("workload", required=False)
@workload_options
@click.option(
    "--gpu",
    default="h200",
    show_default=True,
    help="GPU to predict for (see --list-gpus).",
)
@click.option("--memory", help="Override the GPU's total memory, e.g. 24GiB or 80GB.")
@click.option(
    "--steps",
    type=click.IntRange(min=2),
    default=2,
    show_default=True,
    help="Steps to trace (the allocator replay repeats the last until reserved is stable).",
)
@click.option("--list-gpus", is_flag=True, help="List the GPU profiles and exit.")
@click.option(
    "--validate",
    is_flag=True,
    help="Also measure for real on this machine's GPU and print estimated vs measured.",
)
@parallel_options
@output_options
@answers
def command(
    workload: str | None,
    batch_size: int,
    precision: str | None,
    accumulate: int | None,
    allocator_config: str | None,
    gpu: str,
    memory: str | None,
    steps: int,
    list_gpus: bool,
    validate: bool,
    parallel: Any,
    json_path: str | None,
    html_path: str | None,
    trace_path: str | None,
    csv_path: str | None,
    quiet: bool,
) -> Report | None:
    """Trace real steps of WORKLOAD (path/to/file.py:function, example:gpt, hf:gpt2, ...)
    with fake tensors on an emulated GPU and predict peak allocated, reserved and device-used
    memory, with a verdict: does it fit, and with how much room. Needs no GPU."""
    from vramscope.estimate.profiles import get_profile, list_text

    if list_gpus:
        click.echo(list_text())
        return None
    if not workload:
        raise click.UsageError("missing WORKLOAD (or give --list-gpus)")
    profile = get_profile(gpu)  # unknown names fail here, before any work
    if memory is not None:
        parse_size(memory)
    if validate:
        if parallel is not None:
            raise VramscopeError(
                "--validate measures one process on this GPU; a per-rank estimate is "
                "compared with a job by benchmarks/distributed_accuracy.py"
            )
        _check_can_validate()
    check_paths(json_path, html_path, trace_path, csv_path)
    from vramscope.estimate.estimator import estimate

    with partial_on_stop(lambda: _request(workload, batch_size, profile)):
        report = estimate(
            workload,
            batch_size=batch_size,
            gpu=profile,
            precision=precision,
            accumulate=accumulate,
            allocator_config=allocator_config,
            memory=memory,
            steps=steps,
            parallel=parallel,
        )
        if validate:
            report.extra["validation"] = validate_report(
                report, workload, batch_size, precision, accumulate, allocator_config
            )
    emit(report, json_path, html_path, trace_path, csv_path, quiet)
    if not quiet:
        click.echo(verdict_line(report))
        if validate:
            click.echo(validation_table(report.extra["validation"]))
    return report


def _request(workload: str, batch_size: int, profile: Any) -> Report:
    """What an estimate stopped before its answer has to say: what was asked."""
    return Report(
        kind="estimated",
        workload={"spec": workload, "batch_size": batch_size},
        device={"type": "cuda", "name": profile.display_name, "profile": profile.name},
    )


def verdict_line(report: Report) -> str:
    """The estimate's last line: the verdict's sentence, and where the peak is when it fits
    (where it runs out is in the sentence when it does not)."""
    v = report.extra["verdict"]
    where = ""
    if v.get("fits") and report.peak.step is not None:
        where = f"; the peak is in the {report.peak.phase} phase of step {report.peak.step}"
    job = report.extra.get("distributed")
    if isinstance(job, dict) and job.get("estimated"):
        where += f" (per rank: rank {job.get('rank')} of {job.get('summary')})"
    return f"vramscope: {verdict_sentence(v)}{where}"


def _check_can_validate() -> None:
    import torch

    if not torch.cuda.is_available():
        raise VramscopeError(
            "--validate measures for real and needs a CUDA GPU; this machine has none"
        )


def validate_report(
    report: Report,
    workload: str,
    batch_size: int,
    precision: str | None,
    accumulate: int | None,
    allocator_config: str | None,
) -> dict[str, Any]:
    """Measure the same workload in a fresh process (a clean allocator and CUDA context) and
    compare its peaks with the estimate's."""
    steps = max(3, int(report.workload.get("steps") or 3))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        cmd = [sys.executable, "-m", "vramscope", "measure", workload, "-b", str(batch_size)]
        if precision:
            cmd += ["--precision", precision]
        if accumulate:
            cmd += ["--accumulate", str(accumulate)]
        if allocator_config:
            cmd += ["--allocator-config", allocator_config]
        cmd += ["--steps", str(steps), "-q", "--json", str(out)]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        if proc.returncode != 0 or not out.exists():
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise VramscopeError(f"--validate: measuring {workload} failed: {last}")
        measured = json.loads(out.read_text())
    return validation(report, measured, steps)


def validation_table(v: dict[str, Any]) -> str:
    lines = [
        f"validation against a real run on {v.get('device')} (torch {v.get('torch_version')}):"
    ]
    lines.append(f"  {'':12s} {'estimated':>12s} {'measured':>12s} {'error':>8s}")
    for key in ("allocated", "reserved", "device_used"):
        est = v["estimated"].get(f"{key}_bytes")
        real = v["measured"].get(f"{key}_bytes")
        err = v["error_pct"].get(key)
        lines.append(
            f"  {key.replace('_', ' '):12s} {format_bytes(est):>12s} {format_bytes(real):>12s} "
            + (f"{err:+7.2f}%" if err is not None else "    n/a")
        )
    return "\n".join(lines)
