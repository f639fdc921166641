"""Step-time overhead of vramscope's tracking methods side by side, in short interleaved blocks.

The overhead a user pays (a session's start and end included, and its steady steps over
whole blocks) is ``overhead.py``'s; this harness compares the ways to see memory (the
details, MemTracker, the profiler, naive hooks) on the steps in the middle of a session,
which is what its figures describe (``overhead.py``'s docstring says how they differ).

Each workload runs in this one process: after warm-up, each round runs the tracked blocks
(order rotated; each a fresh ``vramscope.track()`` session, as a user's run would be) each
between two untracked blocks, every step timed to a ``torch.cuda.synchronize()``. A tracked
block is set against the mean of the untracked blocks just before and after it (the device's
speed drifts by tens of percent over seconds on short steps; neighbours share the drift), and
the overhead is the median of those ratios, less one; the cost per step in microseconds is
that share of the baseline step. The ratio of the pooled medians is kept beside it
(``pooled_overhead_pct``), and the same pairing of the blocks' mean steps
(``mean_overhead_pct``: it keeps the steps a median leaves out, such as the 1 step in N that
reads the allocator on short steps). A tracked block's first steps are not kept: a session's first
steps (its calibration with ``--detail modules``; on short steps, the first steps that the
default detail reads phase by phase) happen once per run. On short steps a random number of
further steps (up to one sampler interval's worth) comes before the timed ones, so that the
sampler thread's ticks fall on the timed steps as often as they do in a long run. The workloads include short,
launch-bound steps (a 10.7M-parameter GPT: 3.5-15 ms a step, one of them compiled), where a
fixed cost per step or per module call shows most.
Also prints the cost of one allocator read, vramscope's way and torch.cuda's.

Usage: python benchmarks/overhead_methods.py [--quick] [--out results.json] [--only NAME ...]
       python benchmarks/overhead_methods.py --merge long.json short.json --out results.json
       [--methods default modules lines memtracker profiler naive-hooks]

``--methods`` compares, for the same workloads in the same process, vramscope's default,
``--detail modules`` and ``--detail lines``, MemTracker (real tensors), torch.profiler with
memory/shapes/stacks and naive per-module forward hooks reading memory_allocated(). A
method that fails prints an error row and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vramscope
from vramscope.sources import allocator, nvml
from vramscope.tracking.marking import SETTLED
from vramscope.tracking.phase_reads import FIRST_STEPS as PHASE_FIRST_STEPS
from vramscope.tracking.session import SAMPLE_INTERVAL_S
from vramscope.workload import StepRunner, Workload
from vramscope.zoo import hf_builder, torchvision_builder


def mlp(batch_size: int, device: torch.device) -> Workload:
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(4096, 1000)).to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch_size, 4096, device=device), torch.randint(
            0, 1000, (batch_size,), device=device
        )

    def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(x), y)

    return Workload(
        model=model, optimizer=torch.optim.AdamW(model.parameters()), batch=batch, loss=loss
    )


def with_precision(builder: Callable, precision: str) -> Callable:
    def build(batch_size: int, device: torch.device) -> Workload:
        w = builder(batch_size, device)
        w.precision = precision
        return w

    return build


class CharGPT(torch.nn.Module):
    """nanoGPT's character-level Shakespeare model: 6 layers, width 384, 10.7M parameters."""

    def __init__(self, vocab: int = 65, width: int = 384, layers: int = 6, heads: int = 6):
        super().__init__()
        from vramscope.examples import Block

        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(256, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def char_gpt(seq: int = 256, training: bool = True, compiled: bool = False) -> Callable:
    def build(batch_size: int, device: torch.device) -> Workload:
        model = CharGPT().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True) if training else None
        if compiled:
            model = torch.compile(model)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randint(0, 65, (batch_size, seq), device=device)
            return x, torch.roll(x, -1, dims=1)

        def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = m(x)
            if not training:
                return logits
            return torch.nn.functional.cross_entropy(logits.view(-1, 65), y.view(-1))

        return Workload(model=model, optimizer=opt, batch=batch, loss=loss, precision="bf16-mixed")

    return build


# name → (builder, batch size); the first six have long steps (36-180 ms on an H200)
WORKLOADS: dict[str, tuple[Callable, int]] = {
    "mlp-4096x8": (mlp, 2048),
    "resnet50-fp32": (torchvision_builder("resnet50@sgdm"), 128),
    "resnet50-bf16-mixed": (
        with_precision(torchvision_builder("resnet50@sgdm"), "bf16-mixed"),
        256,
    ),
    "vit_b_16-fp32": (torchvision_builder("vit_b_16"), 64),
    "gpt2-seq1024-bf16-mixed": (with_precision(hf_builder("gpt2/seq=1024"), "bf16-mixed"), 16),
    "llama-1b-bf16-true": (with_precision(hf_builder("llama-1b/seq=1024"), "bf16-true"), 8),
    "chargpt-b64-bf16": (char_gpt(), 64),
    "chargpt-b8-bf16": (char_gpt(), 8),
    "chargpt-infer-b1-64tok": (char_gpt(seq=64, training=False), 1),
    "chargpt-b64-bf16-compiled": (char_gpt(compiled=True), 64),
}
LONG_STEPS = tuple(list(WORKLOADS)[:6])
SHORT_STEPS = tuple(list(WORKLOADS)[6:])


def timed_steps(
    runner: StepRunner, steps: int, after_step: Callable | None = None, warmup: int = 1
) -> list[float]:
    """Each step's time, the device synchronized before and after it; the block's first
    ``warmup`` steps are run (each synchronized too) but not kept: a new session's one-time
    work (finding the model, counting its bytes; with ``--detail modules`` its first marked
    steps and the step it times without markers) happens there once per run, not per step.
    Unsynchronized, a long warmup of a GPU-bound step kept the GPU busy without a gap for up
    to half a second before the timed steps of a tracked block only."""
    times = []
    # synchronized as the timed steps are: the GPU's recent duty cycle (clocks, power) is
    # then the same before every block's timed steps, whatever the length of its warmup
    for _ in range(warmup):
        runner()
        if after_step is not None:
            after_step()
        torch.cuda.synchronize()
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner()
        if after_step is not None:
            after_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def spread_pct(times: list[float], center: float) -> float:
    """The p10-p90 range of per-step times, as a share of ``center``."""
    q = statistics.quantiles(times, n=10)
    return round(100 * (q[-1] - q[0]) / center, 2)


def median_ci95(values: list[float]) -> list[float] | None:
    """A 95 % confidence interval of the median of ``values`` from their order statistics
    (distribution-free: the ranks the binomial distribution of a median's sample puts
    around it); None under 6 values."""
    n = len(values)
    if n < 6:
        return None
    ordered = sorted(values)
    half = 1.96 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return [ordered[low], ordered[high]]


def pct_interval(ratios: list[float]) -> list[float] | None:
    ci = median_ci95(ratios)
    return [round(100 * ci[0], 2), round(100 * ci[1], 2)] if ci is not None else None


def tick_phases(runner: StepRunner, seed: int = 0) -> Callable[[float | None], int]:
    """Extra untimed steps for a tracked block, uniform over one interval of its sampler.

    A tracked block is a fresh session whose sampler ticks at its start and every interval
    after (0.1 s, or 0.5 s once the phases are read on a sample of short steps). With a fixed
    number of steps before the timed ones, the same tick fell inside (or outside) the timed
    steps of every short-step block: at 0.1 s twice the share of ticks a long run's steps
    see, at 0.5 s none. A random start, seeded, spreads the ticks over the steps as a long
    run does. The returned function takes the interval the block's sampler runs at (the
    previous block of the same kind tells); None or over a second: no ticks to spread."""
    step_s = statistics.median(timed_steps(runner, 5))
    rng = random.Random(seed)

    def extra(interval_s: float | None) -> int:
        if interval_s is None or interval_s > 1.0:
            return 0
        return rng.randrange(max(1, math.ceil(interval_s / step_s)))

    return extra


def sampler_interval(context: object) -> float | None:
    """The interval a tracked block's sampler runs at (read inside the block), or None."""
    sampler = getattr(context, "_sampler", None)
    return getattr(sampler, "interval_s", None)


SHORT_STEP_S = 0.02  # steps shorter than this: many short blocks, the device's moods average out


def block_plan(runner: StepRunner, rounds: int) -> tuple[int, int, bool]:
    """(rounds, steps per block, whether the steps are short): blocks of about 0.3 s, or for
    short steps 40+ rounds of 0.05 s blocks: their step times drift by tens of percent from
    block to block on an H200 (16 rounds of 0.12 s left ±5% between runs), so many short
    interleaved blocks."""
    t = statistics.median(timed_steps(runner, 11))  # 3 steps once misjudged a 14 ms step
    if t < SHORT_STEP_S:  # 12+ steps a block: a median of 4 moved by several percent
        return max(rounds, 60), max(12, min(30, round(0.05 / t))), True
    return rounds, max(6, min(60, round(0.3 / t))), False


# ---- --methods: the ways to see memory, side by side ----------------------------------------

METHODS = ("default", "modules", "lines", "memtracker", "profiler", "naive-hooks")
SLOW_METHODS = ("memtracker", "profiler")  # fewer rounds and steps: they are 2-30x slower


class _NaiveHooks:
    """Forward pre/post hooks on every module reading torch.cuda.memory_allocated()."""

    def __enter__(self) -> _NaiveHooks:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self.readings: list[int] = []
        read = self.readings.append
        self.handles = [
            register_module_forward_pre_hook(lambda m, a: read(torch.cuda.memory_allocated())),
            register_module_forward_hook(lambda m, a, o: read(torch.cuda.memory_allocated())),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()


def _method_context(method: str, name: str):
    """(context manager, called after every step or None) for one method."""
    if method == "default":
        return vramscope.track(name=name), None
    if method == "modules":
        return vramscope.track(name=name, detail="modules"), None
    if method == "lines":
        return (
            vramscope.track(
                name=name, detail="lines", lines_of=[StepRunner.__call__, StepRunner.micro_batch]
            ),
            None,
        )
    if method == "memtracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        return tracker, tracker.reset_mod_stats
    if method == "profiler":
        from torch.profiler import ProfilerActivity, profile

        return (
            profile(
                activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            ),
            None,
        )
    if method == "naive-hooks":
        return _NaiveHooks(), None
    raise ValueError(f"unknown method {method!r}; use {', '.join(METHODS)}")


def interleave(
    runner: StepRunner,
    names: list[str],
    block: Callable[[str, int], list[float] | None],
    rounds: int,
    steps: int,
    failed: Callable[[str], None] | None = None,
    mean_ratios: dict[str, list[float]] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, str]]:
    """Untracked blocks and ``block(name, round)`` for each name, in one process: every round
    runs the names (order rotated) each between two untracked blocks, and a block is set
    against the mean of those two (the device's speed drifts by tens of percent over seconds
    on short steps; neighbours share the drift). Returns the step times per name (and
    ``"base"``), each block's ratio less one per name (of medians), and the names whose block
    raised. ``mean_ratios``, when given, receives the same ratios of the blocks' means: these
    keep the steps a median leaves out (a step that reads the allocator, the sampler thread's
    turn at the interpreter lock)."""
    times: dict[str, list[float]] = {"base": []}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str] = {}

    def base_block() -> tuple[float, float]:
        values = timed_steps(runner, steps, warmup=2)
        times["base"].extend(values)
        return statistics.median(values), statistics.fmean(values)

    for r in range(rounds):
        shift = r % len(names)
        before = base_block()
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            try:
                values = block(name, r)
            except Exception as exc:  # one failing variant must not stop the others
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
                if failed is not None:
                    failed(name)
                continue
            if values is None:
                continue
            times.setdefault(name, []).extend(values)
            after = base_block()
            ratios[name].append(statistics.median(values) / ((before[0] + after[0]) / 2) - 1)
            if mean_ratios is not None:
                mean = statistics.fmean(values)
                mean_ratios.setdefault(name, []).append(mean / ((before[1] + after[1]) / 2) - 1)
            before = after
    return times, ratios, errors


def bench_methods(
    name: str, builder: Callable, batch: int, methods: list[str], rounds: int, steps: int
) -> dict:
    """Baseline and each method in one process: every round runs the methods (order rotated)
    each between two baseline blocks, and a method's block is set against the mean of those
    two (the device's speed drifts by tens of percent over seconds on short steps; its
    neighbours share the drift)."""
    device = torch.device("cuda")
    w = builder(batch, device)
    runner = StepRunner(w, device)
    for _ in range(3):
        runner()
    rounds, planned, short = block_plan(runner, rounds)
    steps = max(steps, planned)
    # steps a tracked block runs before it keeps any, the same for every method: a session's
    # first steps (--detail modules: its calibration, marking.py; the default detail on short
    # steps: the first steps read phase by phase, phase_reads.py) happen once per run
    warmup = 1
    if "modules" in methods:
        warmup = SETTLED
    if short and "default" in methods:
        warmup = max(warmup, PHASE_FIRST_STEPS + 2)
    phase_reads: dict[str, dict] = {}  # method -> its last block's phase-read schedule
    extra = tick_phases(runner) if short else (lambda interval_s: 0)
    # the sampler's interval each method's blocks run at, as its last block ended
    intervals: dict[str, float | None] = dict.fromkeys(methods, SAMPLE_INTERVAL_S)

    def block(method: str, r: int) -> list[float] | None:
        if method in SLOW_METHODS and r >= 2:
            return None
        context, after = _method_context(method, name)
        with context:
            values = timed_steps(
                runner,
                min(steps, 3) if method in SLOW_METHODS else steps,
                after,
                warmup=warmup + extra(intervals[method]),
            )
            intervals[method] = sampler_interval(context)
        schedule = getattr(context, "_phase_reads", None)
        if schedule is not None:  # the last block's: which steps read phase by phase
            phase_reads[method] = schedule.summary()
        return values

    def failed(method: str) -> None:
        if w.optimizer is not None:
            w.optimizer.zero_grad(set_to_none=True)

    mean_ratios: dict[str, list[float]] = {}
    times, ratios, errors = interleave(runner, methods, block, rounds, steps, failed, mean_ratios)
    base = statistics.median(times["base"])
    result: dict = {
        "workload": name,
        "batch_size": batch,
        "step_ms_baseline": round(base * 1000, 3),
        "baseline_spread_pct": spread_pct(times["base"], base),
        "rounds": rounds,
        "steps_per_block": steps,
        "warmup_steps_per_block": warmup,
        # short steps: plus 0..N-1 more (uniform, seeded), N steps making one sampler
        # interval, so that its ticks fall on the timed steps as often as in a long run
        "random_extra_warmup": short,
        "pairing": "each method block against the mean of the baseline blocks around it",
        "methods": {},
    }
    for method in methods:
        if method in errors:
            result["methods"][method] = {"error": errors[method]}
            continue
        t = statistics.median(times[method])
        paired = round(100 * statistics.median(ratios[method]), 2)
        result["methods"][method] = {
            "step_ms": round(t * 1000, 3),
            "overhead_pct": paired,
            "cost_us_per_step": round(base * paired * 1e4, 1),
            "pooled_overhead_pct": round(100 * (t - base) / base, 2),
            # the same pairing with each block's mean step: every step counts
            "mean_overhead_pct": round(100 * statistics.median(mean_ratios[method]), 2),
            # 95 % intervals of the two medians over the rounds
            "overhead_ci95_pct": pct_interval(ratios[method]),
            "mean_overhead_ci95_pct": pct_interval(mean_ratios[method]),
            # each round's ratio, so that runs of the same code can be pooled
            "round_overhead_pct": [round(100 * x, 3) for x in ratios[method]],
            "steps": len(times[method]),
            # the interval its sampler ran at (the random extra warmup spans one of these)
            "sampler_interval_s": intervals[method],
        }
        if method in phase_reads:
            result["methods"][method]["phase_reads"] = phase_reads[method]
    default = result["methods"].get("default", {})
    if "step_ms" in default:  # the keys of the default comparison, kept
        result["step_ms_tracked"] = default["step_ms"]
        result["overhead_pct"] = default["overhead_pct"]
        result["cost_us_per_step"] = default["cost_us_per_step"]
        result["pooled_overhead_pct"] = default["pooled_overhead_pct"]
    runner = w = None  # type: ignore[assignment]  # free the model before the next workload
    torch.cuda.empty_cache()
    return result


def print_methods(results: list[dict], methods: list[str], meta: dict) -> None:
    print(f"\n{'workload':28s} {'base ms':>9s}" + "".join(f" {m:>24s}" for m in methods))
    for r in results:
        if "error" in r:
            print(f"{r['workload']:28s} ERROR {r['error']}")
            continue
        cells = []
        for m in methods:
            x = r["methods"].get(m, {})
            cells.append(
                f" {'ERROR':>24s}"
                if "error" in x  # the tracked step, the overhead, and what it is a step
                else f" {x['step_ms']:8.2f} {x['overhead_pct']:+6.1f}% {x['cost_us_per_step']:5.0f}µs"
            )
        print(f"{r['workload']:28s} {r['step_ms_baseline']:9.2f}" + "".join(cells))
    for r in results:
        for m, x in r.get("methods", {}).items():
            if "error" in x:
                print(f"  {r['workload']} / {m}: {x['error']}")
    intervals = [
        (r["workload"], m, x)
        for r in results
        for m, x in r.get("methods", {}).items()
        if x.get("overhead_ci95_pct") and m in methods
    ]
    if intervals:
        print("\n95 % intervals of the medians over the rounds (median; with every step counted):")
    for workload, m, x in intervals:
        low, high = x["overhead_ci95_pct"]
        line = f"  {workload:28s} {m:8s} {low:+6.2f}% .. {high:+6.2f}%"
        if x.get("mean_overhead_ci95_pct"):
            low, high = x["mean_overhead_ci95_pct"]
            line += f";  {low:+6.2f}% .. {high:+6.2f}%"
        print(line)
    print()
    for m in methods:
        values = {
            r["workload"]: r["methods"][m]["overhead_pct"]
            for r in results
            if "methods" in r and "overhead_pct" in r["methods"].get(m, {})
        }
        if values:
            print(
                f"{m:12s} median overhead {statistics.median(values.values()):7.2f}%, "
                f"worst {max(values.values()):7.2f}%  ({meta['gpu']}, torch {meta['torch']})"
            )
            print_targets(m, values)
        means = [
            r["methods"][m]["mean_overhead_pct"]
            for r in results
            if "mean_overhead_pct" in r.get("methods", {}).get(m, {})
        ]
        if means:
            print(
                f"{'':12s} with every step counted (blocks' means, the {len(means)} rows "
                f"that have them): median {statistics.median(means):.2f}%, worst "
                f"{max(means):.2f}%"
            )


TARGETS = {  # method -> what it should meet
    "default": "median <= 1% and worst <= 2% over all workloads",
    "modules": "median <= 3% over the six long-step workloads, <= 10% on each short one",
    "lines": "median <= 10%",
}


def print_targets(method: str, values: dict[str, float]) -> None:
    """Whether the measured overheads meet the method's targets."""
    if method not in TARGETS or not values:
        return
    allv = list(values.values())
    if method == "default":
        met = statistics.median(allv) <= 1.0 and max(allv) <= 2.0
    elif method == "modules":
        long = [v for k, v in values.items() if k in LONG_STEPS]
        short = [v for k, v in values.items() if k in SHORT_STEPS]
        met = (not long or statistics.median(long) <= 3.0) and all(v <= 10.0 for v in short)
    else:
        met = statistics.median(allv) <= 10.0
    print(f"  target {TARGETS[method]}: {'met' if met else 'NOT met'}")


def merge(paths: list[str], out: str | None) -> None:
    """One table and one results file from several runs of --methods."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    by_name: dict[str, dict] = {}
    for d in docs:  # a later file's methods replace an earlier one's, method by method
        for r in d["results"]:
            cells = {
                m: {
                    **x,
                    "measured": d["meta"]["date"],
                    "step_ms_baseline": r.get("step_ms_baseline"),
                }
                for m, x in r.get("methods", {}).items()
            }
            earlier = by_name.get(r["workload"], {})
            by_name[r["workload"]] = {
                **r,
                "methods": {**earlier.get("methods", {}), **cells},
            }
    results = [by_name[name] for name in WORKLOADS if name in by_name]
    methods = list(next((r["methods"] for r in results if "methods" in r), {}))
    meta = dict(docs[0]["meta"])
    meta["dates"] = sorted({d["meta"]["date"] for d in docs})
    meta["date"] = meta["dates"][-1]
    meta["sources"] = [  # later files' cells replace earlier ones', method by method
        {
            "file": Path(path).name,
            "date": d["meta"]["date"],
            "cells": {r["workload"]: sorted(r.get("methods", {})) for r in d["results"]},
        }
        for path, d in zip(paths, docs, strict=True)
    ]
    print_methods(results, methods, meta)
    if out:
        doc = {"meta": meta, "read_cost_us": docs[-1]["read_cost_us"], "results": results}
        Path(out).write_text(json.dumps(doc, indent=1))


def read_costs(n: int = 2000) -> dict:
    index = torch.cuda.current_device()
    costs = {}
    for label, fn in (
        ("torch.cuda.memory_allocated", lambda: torch.cuda.memory_allocated()),
        ("torch.cuda.memory_stats", lambda: torch.cuda.memory_stats()),
        ("vramscope allocator.read (nested stats)", lambda: allocator.read(index)),
        ("torch.cuda.mem_get_info", lambda: torch.cuda.mem_get_info()),
    ):
        fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        costs[label] = round((time.perf_counter() - start) / n * 1e6, 2)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", nargs="*")
    parser.add_argument(
        "--rounds", type=int, default=None, help="at least this many rounds (short steps: 60)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="no measuring: join the --methods results of several runs (say, the long and "
        "the short workloads, each run alone) into one table and --out",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        help="compare these ways of seeing memory (default: vramscope's default only)",
    )
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    if not torch.cuda.is_available():
        sys.exit("overhead_methods.py needs a CUDA device")
    rounds, steps = (4, 5) if args.quick else (8, 6)
    if args.methods:
        rounds, steps = (4, 4) if args.quick else (6, 6)
    rounds = max(rounds, args.rounds or 0)
    results = []
    for name, (builder, batch) in WORKLOADS.items():
        if args.only and name not in args.only:
            continue
        try:
            if args.methods:
                results.append(bench_methods(name, builder, batch, args.methods, rounds, steps))
            else:
                # the default detail alone: the same interleaving, two kinds of block
                results.append(bench_methods(name, builder, batch, ["default"], rounds, steps))
        except Exception as exc:  # report and go on with the next workload
            results.append({"workload": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(results[-1]), flush=True)
    costs = read_costs()
    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": props.name,
        "driver": nvml.driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "vramscope": vramscope.__version__,
    }
    if args.methods:
        print_methods(results, args.methods, meta)
        if args.out:
            Path(args.out).write_text(
                json.dumps({"meta": meta, "read_cost_us": costs, "results": results}, indent=1)
            )
        return
    print("\nread cost (µs per call):")
    for label, us in costs.items():
        print(f"  {label:45s} {us:8.2f}")
    print(
        f"\n{'workload':28s} {'batch':>5s} {'base ms':>9s} {'tracked ms':>11s} {'overhead':>9s} "
        f"{'µs/step':>8s} {'spread':>7s}"
    )
    ok = [r for r in results if "error" not in r]
    for r in results:
        if "error" in r:
            print(f"{r['workload']:28s} ERROR {r['error']}")
            continue
        print(
            f"{r['workload']:28s} {r['batch_size']:5d} {r['step_ms_baseline']:9.2f} "
            f"{r['step_ms_tracked']:11.2f} {r['overhead_pct']:8.2f}% "
            f"{r['cost_us_per_step']:8.1f} {r['baseline_spread_pct']:6.2f}%"
        )
    if ok:
        overheads = {r["workload"]: r["overhead_pct"] for r in ok}
        print(
            f"\nmedian overhead {statistics.median(overheads.values()):.2f}%, "
            f"worst {max(overheads.values()):.2f}%  ({meta['gpu']}, torch {meta['torch']})"
        )
        print_targets("default", overheads)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"meta": meta, "read_cost_us": costs, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
