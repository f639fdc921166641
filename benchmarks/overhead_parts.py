"""Where default tracking's per-step cost goes, on a short launch-bound step.

Times the same step (nanoGPT's 10.7M-parameter character model, batch-1 inference or a
batch-8 training step) untracked and under variants of ``vramscope.track()`` with parts
switched off (hooks, the sampler thread, the status file), each step timed to a
synchronize, blocks interleaved and each paired with the same round's untracked block; then the cost of single allocator calls, and a cProfile of
tracked steps (the functions that take the most time, by own time).

Usage: python benchmarks/overhead_parts.py [--workload chargpt-infer-b1-64tok] [--out f.json]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import overhead
import vramscope
from vramscope.sources.allocator import LEDGER
from vramscope.workload import StepRunner

VARIANTS = {
    "default": {},
    "no hooks": {"hooks": False},
    "no sampler": {"interval_s": 1e6},
    "no status file": {"status": False},
    "no sampler, no status file": {"interval_s": 1e6, "status": False},
    "no hooks, sampler or status file": {"hooks": False, "interval_s": 1e6, "status": False},
}
# --detail modules taken apart: the allocator's history alone, markers to a depth, backward
# markers off (a variant is Session keyword arguments, or a function making a context manager)
MODULE_VARIANTS: dict = {
    "modules": {"detail": "modules"},
    "history only": lambda: history_only(),
    "modules depth 0": {"detail": "modules", "depth": 0},
    "modules depth 1": {"detail": "modules", "depth": 1},
    "modules, no backward markers": lambda: _no_backward_markers(),
    "modules, no status/sampler": {"detail": "modules", "status": False, "interval_s": 1e6},
}


@contextlib.contextmanager
def history_only():  # type: ignore[no-untyped-def]
    """The allocator's trace without stacks, as ``--detail modules`` records it, alone."""
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=300_000
    )
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


@contextlib.contextmanager
def _no_backward_markers():  # type: ignore[no-untyped-def]
    session = vramscope.Session(detail="modules")
    with session:
        recorder = session._attribution
        if recorder is not None:
            recorder.backward_depth = 0
        yield


def _variant(spec):  # type: ignore[no-untyped-def]
    return spec() if callable(spec) else vramscope.Session(**spec)


def call_cost(fn, n: int = 3000) -> float:  # type: ignore[no-untyped-def]
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="chargpt-infer-b1-64tok")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--detail", default="default", help="the detail the profile runs with")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--modules", action="store_true", help="take --detail modules apart instead of default"
    )
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    variants = MODULE_VARIANTS if args.modules else VARIANTS
    device = torch.device("cuda")
    builder, batch = overhead.WORKLOADS[args.workload]
    runner = StepRunner(builder(batch, device), device)
    for _ in range(5):
        runner()
    rounds, steps = overhead.block_plan(runner, args.rounds)
    times: dict[str, list[float]] = {"base": []}
    blocks: dict[str, list[float]] = {"base": []}  # each block's median step, per round
    order = ["base", *variants]
    for r in range(rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            if name == "base":
                values = overhead.timed_steps(runner, steps)
            else:
                with _variant(variants[name]):
                    values = overhead.timed_steps(runner, steps)
            times.setdefault(name, []).extend(values)
            blocks.setdefault(name, []).append(statistics.median(values))
    base = statistics.median(times["base"])
    result: dict = {"workload": args.workload, "step_ms": round(base * 1e3, 3), "variants": {}}
    print(f"{args.workload}: base {base * 1e3:.3f} ms/step (overhead paired by round)")
    for name in variants:
        # paired with the same round's untracked block: the device's drift between rounds cancels
        pct = overhead.paired_pct(blocks[name], blocks["base"])
        result["variants"][name] = {
            "overhead_pct": pct,
            "cost_us_per_step": round(base * pct * 1e4, 1),
            "pooled_cost_us_per_step": round((statistics.median(times[name]) - base) * 1e6, 1),
        }
        print(f"  {name:34s} {base * pct * 1e4:8.1f} µs/step  ({pct:+.2f}%)")
    index = torch.cuda.current_device()
    costs = {
        "_cuda_memoryStats": call_cost(lambda: torch._C._cuda_memoryStats(index)),
        "_cuda_resetPeakMemoryStats": call_cost(lambda: torch._C._cuda_resetPeakMemoryStats(index)),
        "LEDGER.read_for_tracking(reset=True)": call_cost(
            lambda: LEDGER.read_for_tracking(index, reset=True)
        ),
        "torch.compiler.is_compiling": call_cost(torch.compiler.is_compiling),
    }
    result["call_cost_us"] = {k: round(v, 2) for k, v in costs.items()}
    for name, us in costs.items():
        print(f"  {name:40s} {us:8.2f} µs")
    if args.no_profile:
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return
    profiler = cProfile.Profile()
    with vramscope.track(detail=args.detail):
        for _ in range(5):
            runner()
        profiler.enable()
        for _ in range(300):
            runner()
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    result["profile_detail"] = args.detail
    result["profile"] = text.getvalue()
    print(text.getvalue())
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
