"""Where default tracking's per-step cost goes, on a short launch-bound step.

Times the same step (nanoGPT's 10.7M-parameter character model, batch-1 inference or a
batch-8 training step) untracked and under variants of ``vramscope.track()`` with parts
switched off (hooks, the sampler thread, the status file), each step timed to a
synchronize, blocks interleaved; then the cost of single allocator calls, and a cProfile of
tracked steps (the functions that take the most time, by own time).

Usage: python benchmarks/overhead_parts.py [--workload chargpt-infer-b1-64tok] [--out f.json]
"""

from __future__ import annotations

import argparse
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
}


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
    args = parser.parse_args()
    device = torch.device("cuda")
    builder, batch = overhead.WORKLOADS[args.workload]
    runner = StepRunner(builder(batch, device), device)
    for _ in range(5):
        runner()
    rounds, steps = overhead.block_plan(runner, args.rounds)
    times: dict[str, list[float]] = {"base": []}
    order = ["base", *VARIANTS]
    for r in range(rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            if name == "base":
                times["base"] += overhead.timed_steps(runner, steps)
                continue
            session = vramscope.Session(**VARIANTS[name])
            with session:
                times.setdefault(name, []).extend(overhead.timed_steps(runner, steps))
    base = statistics.median(times["base"])
    result: dict = {"workload": args.workload, "step_ms": round(base * 1e3, 3), "variants": {}}
    print(f"{args.workload}: base {base * 1e3:.3f} ms/step")
    for name in VARIANTS:
        t = statistics.median(times[name])
        result["variants"][name] = {"cost_us_per_step": round((t - base) * 1e6, 1)}
        print(f"  {name:16s} {(t - base) * 1e6:8.1f} µs/step  ({100 * (t - base) / base:+.2f}%)")
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
