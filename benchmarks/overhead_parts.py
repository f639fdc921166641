"""Where default tracking's per-step cost goes, on a short launch-bound step.

Times the same step (nanoGPT's 10.7M-parameter character model, batch-1 inference or a
batch-8 training step) untracked and under variants of ``vramscope.track()`` with parts
switched off (hooks, the sampler thread, the status file), each step timed to a
synchronize, each block set against the untracked blocks just before and after it
(``overhead.interleave``); then the time spent inside the session's callbacks, the cost of
single allocator calls, and a cProfile of tracked steps (by own time).

Usage: python benchmarks/overhead_parts.py [--workload chargpt-infer-b1-64tok] [--out f.json]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import gc
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

import overhead_methods as overhead
import vramscope
from vramscope.sources.allocator import LEDGER
from vramscope.tracking.phase_reads import FIRST_STEPS as PHASE_FIRST_STEPS
from vramscope.tracking.session import SAMPLE_INTERVAL_S, SPACED_SAMPLE_INTERVAL_S
from vramscope.workload import StepRunner

VARIANTS = {
    "default": {},
    "phase reads every step": {"phase_steps": "all"},
    "hooks, callbacks do nothing": lambda: _callbacks_off(transitions_only=False),
    "hooks and callbacks, no phase bookkeeping": lambda: _callbacks_off(transitions_only=True),
    # (without phase reads nothing slows the sampler: these two run it at the paced interval)
    "no hooks": {"hooks": False, "interval_s": SPACED_SAMPLE_INTERVAL_S},
    "no sampler, no status file": {"interval_s": 1e6, "status": False},
    "hooks only, callbacks do nothing, no sampler": lambda: _callbacks_off(
        transitions_only=False, quiet=True
    ),
    "default, garbage collector off": lambda: _gc_off(),
    "sampler reads nothing": lambda: _sampler_reads_nothing(),
    "no status file": {"status": False},
    "sampler at 0.1 s throughout": {"interval_s": 0.1},
    "sampler without host memory": lambda: _sampler_without_host_memory(),
}
CALLBACKS = (
    "on_forward_start",
    "on_backward_start",
    "on_optimizer_start",
    "on_optimizer_end",
    "on_zero_grad",
    "on_data",
    "_sample",
    "_tick",
)
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
        yield session


@contextlib.contextmanager
def _callbacks_off(transitions_only: bool, quiet: bool = False):  # type: ignore[no-untyped-def]
    """Default tracking with the session's hook callbacks (or only its phase and step
    bookkeeping) doing nothing but closing the discovery window once the model is found (as
    the first step's end does): what the hooks' own machinery costs. Its sampler runs at
    the interval the default's slows to on short steps (nothing here reads the phases, which
    is what slows it). ``quiet``: without the sampler thread and status file too."""
    quietly = {"interval_s": 1e6, "status": False}
    session = vramscope.Session(**(quietly if quiet else {"interval_s": SPACED_SAMPLE_INTERVAL_S}))

    def close_discovery(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        hooks = session._hooks
        if hooks is not None and hooks.discovering:
            hooks.set_discovery(False)

    if transitions_only:
        session._transition = close_discovery  # type: ignore[method-assign]
    else:
        for name in CALLBACKS[:6]:
            setattr(session, name, close_discovery)
    with session:
        yield session


@contextlib.contextmanager
def _gc_off():  # type: ignore[no-untyped-def]
    """Default tracking with Python's garbage collector off: whether the bookkeeping's
    objects make the collector run more often in the user's steps."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with vramscope.Session() as session:
            yield session
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _sampler_reads_nothing():  # type: ignore[no-untyped-def]
    """Default tracking with the sampler thread waking as usual but reading nothing: what
    the thread's reads cost the user's steps."""
    session = vramscope.Session()
    nothing = (None, None, None, None)
    session._sample = lambda t: (t - session._t0, *nothing)  # type: ignore[method-assign]
    with session:
        yield session


@contextlib.contextmanager
def _sampler_without_host_memory():  # type: ignore[no-untyped-def]
    """Default tracking with the sampler's host RSS read left out (a system call a tick,
    the interpreter lock given up and taken back)."""
    session = vramscope.Session()
    session._rss_sampler.read = lambda: None  # type: ignore[method-assign]
    with session:
        yield session


def callback_times(runner: StepRunner, steps: int) -> dict:
    """Wall time spent inside the session's callbacks, per step, on the user's thread (and
    per sample on the sampler's): what the hooks cost where they run, GIL waits included."""
    session = vramscope.Session()
    spent: dict[str, list[int]] = {name: [] for name in CALLBACKS}  # ns of each call

    def timed(name, function):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            start = time.perf_counter_ns()
            try:
                return function(*args)
            finally:
                spent[name].append(time.perf_counter_ns() - start)

        return call

    for name in CALLBACKS:
        setattr(session, name, timed(name, getattr(session, name)))
    with session:
        hooks = session._hooks  # the machinery around on_forward_start (which runs inside)
        if hooks is not None:
            for name in ("_enter", "_exit"):
                spent["hooks." + name] = []
                setattr(hooks, name, timed("hooks." + name, getattr(hooks, name)))
        overhead.timed_steps(runner, PHASE_FIRST_STEPS + 2)
        for entry in spent.values():
            entry.clear()
        start = time.perf_counter()
        overhead.timed_steps(runner, steps)
        wall = time.perf_counter() - start
    # the mean keeps the calls that waited for the sampler thread's turn at the interpreter
    # lock; the median is what a call itself takes
    out = {
        name: {
            "calls": len(ns),
            "us_per_call": round(statistics.fmean(ns) / 1e3, 2),
            "median_us_per_call": round(statistics.median(ns) / 1e3, 2),
            "us_per_step": round(sum(ns) / steps / 1e3, 2),
        }
        for name, ns in spent.items()
        if ns
    }
    out["steps"] = steps
    out["wall_s"] = round(wall, 3)
    if session._phase_reads is not None:
        out["phase_reads"] = session._phase_reads.summary()
    return out


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
    parser.add_argument("--variants", nargs="+", default=None, help="only these variants")
    args = parser.parse_args()
    variants = MODULE_VARIANTS if args.modules else VARIANTS
    if args.variants:
        unknown = sorted(set(args.variants) - set(variants))
        if unknown:
            parser.error(f"unknown variants {unknown}; known: {sorted(variants)}")
        variants = {name: variants[name] for name in args.variants}
    device = torch.device("cuda")
    builder, batch = overhead.WORKLOADS[args.workload]
    runner = StepRunner(builder(batch, device), device)
    for _ in range(5):
        runner()
    rounds, steps, _short = overhead.block_plan(runner, args.rounds)
    # a block's first steps are not kept: a session's first steps read phase by phase
    warmup = PHASE_FIRST_STEPS + 2

    extra = overhead.tick_phases(runner)  # the sampler's ticks where a long run has them
    intervals: dict[str, float | None] = dict.fromkeys(variants, SAMPLE_INTERVAL_S)

    def block(name: str, r: int) -> list[float]:
        with _variant(variants[name]) as session:
            values = overhead.timed_steps(runner, steps, warmup=warmup + extra(intervals[name]))
            intervals[name] = overhead.sampler_interval(session)
        return values

    mean_ratios: dict[str, list[float]] = {}
    times, ratios, _errors = overhead.interleave(
        runner, list(variants), block, rounds, steps, mean_ratios=mean_ratios
    )
    base = statistics.median(times["base"])
    result: dict = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
        },
        "workload": args.workload,
        "step_ms": round(base * 1e3, 3),
        "variants": {},
    }
    print(f"{args.workload}: base {base * 1e3:.3f} ms/step (against the untracked blocks around)")
    for name in variants:
        # against the untracked blocks around it: the device's drift cancels
        pct = round(100 * statistics.median(ratios[name]), 2)
        mean_pct = round(100 * statistics.median(mean_ratios[name]), 2)
        result["variants"][name] = {
            "overhead_pct": pct,
            "cost_us_per_step": round(base * pct * 1e4, 1),
            "pooled_cost_us_per_step": round((statistics.median(times[name]) - base) * 1e6, 1),
            "mean_overhead_pct": mean_pct,  # every step counted (the blocks' means)
            # 95 % intervals of the two medians over the rounds
            "overhead_ci95_pct": overhead.pct_interval(ratios[name]),
            "mean_overhead_ci95_pct": overhead.pct_interval(mean_ratios[name]),
            "sampler_interval_s": intervals[name],
        }
        ci = result["variants"][name]["overhead_ci95_pct"]
        within = f", 95 % CI {ci[0]:+.2f}..{ci[1]:+.2f}%" if ci else ""
        print(
            f"  {name:34s} {base * pct * 1e4:8.1f} µs/step  ({pct:+.2f}%{within}; every "
            f"step counted {mean_pct:+.2f}%)"
        )
    timings = callback_times(runner, max(200, steps * 10))
    result["callbacks"] = timings
    print(f"  phase reads: {timings.get('phase_reads')}")
    for name, entry in timings.items():
        if isinstance(entry, dict) and "calls" in entry:
            calls = (
                f"{entry['calls']} calls, {entry['us_per_call']} µs each, "
                f"median {entry['median_us_per_call']} µs"
            )
            print(f"  in {name:31s} {entry['us_per_step']:8.1f} µs/step  ({calls})")
    index = torch.cuda.current_device()
    costs = {
        "_cuda_memoryStats": call_cost(lambda: torch._C._cuda_memoryStats(index)),
        "_cuda_resetPeakMemoryStats": call_cost(lambda: torch._C._cuda_resetPeakMemoryStats(index)),
        "LEDGER.read_for_tracking(reset=True)": call_cost(
            lambda: LEDGER.read_for_tracking(index, reset=True)
        ),
        "torch.compiler.is_compiling": call_cost(torch.compiler.is_compiling),
        "time.perf_counter": call_cost(time.perf_counter),
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
    # no paths of the machine it ran on in the results: the repository's and the libraries'
    profile = text.getvalue().replace(str(Path(__file__).resolve().parents[1]) + "/", "")
    profile = profile.replace(str(Path(torch.__file__).parents[1]) + "/", "site-packages/")
    result["profile_detail"] = args.detail
    result["profile"] = profile
    print(profile)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
