"""One real trial in a fresh process: a clean allocator, OOM caught as OutOfMemoryError.

``run_trial`` starts ``python -m vramscope.fit.trial`` and reads the JSON report it writes;
an out-of-memory error is recognised from the report's exit status (the child caught
``torch.cuda.OutOfMemoryError``), never by matching error text. A child that fails for
another reason is a crash, reported as such, not counted as OOM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrialResult:
    batch_size: int
    status: str  # "fits" | "oom" | "crashed"
    peak: dict[str, Any] = field(default_factory=dict)
    step_time_s: float | None = None
    error: str | None = None
    report: dict[str, Any] | None = None

    @property
    def fits(self) -> bool:
        return self.status == "fits"


def run_trial(
    spec: str,
    batch_size: int,
    strategy: str = "baseline",
    precision: str | None = None,
    accumulate: int | None = None,
    allocator_config: str | None = None,
    budget_bytes: int | None = None,
    steps: int = 3,
    timeout_s: float = 900,
    history: str | Path | None = None,
) -> TrialResult:
    """Measure ``steps`` steps of ``spec`` at ``batch_size`` in a fresh Python process;
    ``history``: a file for the allocator's trace of the trial."""
    with tempfile.TemporaryDirectory(prefix="vramscope-trial-") as tmp:
        out = Path(tmp) / "report.json"
        args = [sys.executable, "-m", "vramscope.fit.trial", spec, str(batch_size), str(out)]
        args += ["--strategy", strategy, "--steps", str(steps)]
        if precision:
            args += ["--precision", precision]
        if accumulate:
            args += ["--accumulate", str(accumulate)]
        if allocator_config:
            args += ["--allocator-config", allocator_config]
        if budget_bytes:
            args += ["--budget-bytes", str(budget_bytes)]
        if history:
            args += ["--history", str(history)]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return TrialResult(batch_size, "crashed", error=f"timed out after {timeout_s:.0f} s")
        if not out.exists():
            tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            return TrialResult(batch_size, "crashed", error=tail[:300])
        report = json.loads(out.read_text())
    status = report["exit"]["status"]
    durations = [s["duration_s"] for s in report["steps"][1:]] or [
        s["duration_s"] for s in report["steps"]
    ]
    result = TrialResult(
        batch_size,
        "fits" if status == "ok" else "oom" if status == "oom" else "crashed",
        peak=report["peak"],
        step_time_s=statistics.median(durations) if durations else None,
        error=report["exit"].get("error"),
        report=report,
    )
    return result


def _child(argv: list[str] | None = None) -> int:
    """The child process: apply the strategy and budget, measure, write the report."""
    parser = argparse.ArgumentParser(prog="python -m vramscope.fit.trial")
    parser.add_argument("spec")
    parser.add_argument("batch_size", type=int)
    parser.add_argument("out")
    parser.add_argument("--strategy", default="baseline")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision")
    parser.add_argument("--accumulate", type=int)
    parser.add_argument("--allocator-config")
    parser.add_argument("--budget-bytes", type=int)
    parser.add_argument(
        "--history", help="also write the allocator's trace (gzip JSON rows) to this file"
    )
    a = parser.parse_args(argv)

    from vramscope.fit.strategies import get_strategy

    strategy = get_strategy(a.strategy)
    config = strategy.allocator_config or a.allocator_config
    if config:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = config
        os.environ["PYTORCH_ALLOC_CONF"] = config
    import torch

    from vramscope.tracking.runner import measure
    from vramscope.workload import resolve

    if a.budget_bytes and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.budget_bytes / total))
    if a.history and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(context=None, max_entries=2_000_000)
    spec = resolve(a.spec)
    builder = strategy.wrap(spec.builder)
    report = measure(
        builder,
        batch_size=strategy.micro_batch(a.batch_size),
        steps=a.steps,
        precision=strategy.precision or a.precision,
        accumulate=strategy.accumulate(a.accumulate),
        allocator_config=config,
        journal=None,  # a trial that dies is a row of the fit's own ("crashed"), not a report
    )
    report.workload["spec"] = a.spec
    report.workload["strategy"] = strategy.name
    report.save(a.out)
    if a.history and torch.cuda.is_available():
        _write_history(a.history)
    return 0


def _write_history(path: str) -> None:
    """The allocator's trace of this trial as ``[action, addr, size, stream]`` rows (the
    input of ``vramscope.estimate.allocator.events_from_device_trace``)."""
    import gzip

    import torch

    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    rows = [[e["action"], e.get("addr", 0), e.get("size", 0), e.get("stream", 0)] for e in trace]
    with gzip.open(path, "wt") as f:
        json.dump({"schema": "vramscope.alloc_trace/1", "trace": rows}, f)


if __name__ == "__main__":
    sys.exit(_child())
