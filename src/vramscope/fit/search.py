"""``fit``: the largest batch (or sequence) that fits, the accumulation plans; ``compare`` is in
``fit/compare.py``.

Estimate-only answers come from the estimator (seconds, no GPU). ``verify`` confirms
with real trials, each in a fresh process, seeded by the estimate so that few are needed.
Both return a Report whose ``fit`` section (``report.extra["fit"]``) holds the answer.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vramscope import stops
from vramscope.errors import VramscopeError
from vramscope.fit.answer import final_answer
from vramscope.fit.strategies import NotApplicable, Strategy, get_strategy
from vramscope.fit.trial import TrialResult, run_trial
from vramscope.report.model import Finding, Report
from vramscope.report.words import count, spans
from vramscope.stops import partial_on_stop
from vramscope.units import format_bytes, format_percent, parse_percent, parse_size
from vramscope.workload import resolve

if TYPE_CHECKING:
    from vramscope.distributed.sharding import ParallelPlan
    from vramscope.zoo import HfSpec

Progress = Callable[[str], None]
# the share of its cap a capped allocator's allocated memory reaches before it runs out: real
# runs of the example CNN on an H200 ran out at 97.4% and 99.1% of a 2 and a 6 GiB cap
CAPPED_RUNS_OUT_AT = 0.985


@dataclass(frozen=True)
class Target:
    """What must fit: device used on a GPU profile, or reserved under a budget."""

    kind: str  # "gpu" | "budget"
    limit_bytes: int
    gpu: str  # the profile's name: its kernels and CUDA context, and under "gpu" its memory
    margin: float
    gpu_name: str = ""  # as the device calls itself
    gpu_given: bool = True  # named by the user (else the default GPU)
    gpu_total_bytes: int | None = None

    @property
    def usable_bytes(self) -> int:
        return int(self.limit_bytes * (1 - self.margin))

    def measure_of(self, peak: dict[str, Any]) -> int | None:
        """The number compared with the limit: device used for a GPU, reserved for a budget."""
        key = "device_used_bytes" if self.kind == "gpu" else "reserved_bytes"
        return peak.get(key)

    def describe(self) -> str:
        what = "device used" if self.kind == "gpu" else "reserved"
        return (
            f"{what} ≤ {format_bytes(self.usable_bytes)} ({format_bytes(self.limit_bytes)} "
            f"{'on ' + (self.gpu_name or self.gpu) if self.kind == 'gpu' else 'budget'}, "
            f"margin {format_percent(self.margin)})"
        )


DEFAULT_GPU = "h200"


def make_target(
    gpu: str | None,
    budget: str | int | None,
    margin: str | float | None,
    default_gpu: str | None = None,
) -> Target:
    """The target of ``fit`` and ``compare``: ``budget`` when given (what the allocator may
    reserve; the GPU, named or the default, gives the kernels and the CUDA context), else the
    memory of ``gpu``, or of ``default_gpu`` when none is named (``compare``; the target says
    it was not given). A budget of 0 bytes, or one larger than the GPU can give the
    allocator, is bad input (VramscopeError)."""
    from vramscope.estimate.profiles import get_profile

    fraction = parse_percent(margin) if margin is not None else 0.05
    if not 0 <= fraction < 0.9:
        raise VramscopeError(f"margin must be between 0% and 90%, not {margin}")
    profile = get_profile(gpu or default_gpu or DEFAULT_GPU)
    about = {
        "gpu_name": profile.display_name,
        "gpu_given": gpu is not None,
        "gpu_total_bytes": profile.total_bytes,
    }
    if budget is not None:
        limit = parse_size(budget)
        if limit <= 0:
            raise VramscopeError(
                f"--budget must be more than 0 bytes, not {budget!r}: it is what the "
                "allocator may reserve, e.g. 20GiB"
            )
        room = profile.total_bytes - profile.context_and_libraries_bytes
        if limit > room:
            whose = f"{profile.display_name}" + ("" if gpu else " (the default GPU)")
            raise VramscopeError(
                f"--budget {format_bytes(limit)} is more than {whose} can give the allocator "
                f"({format_bytes(room)}: its {format_bytes(profile.total_bytes)} less the "
                f"CUDA context); give a smaller budget, or --gpu a larger GPU"
            )
        return Target("budget", limit, profile.name, fraction, **about)
    if gpu is None and default_gpu is None:
        raise VramscopeError("say what must fit: --gpu NAME or --budget SIZE")
    return Target("gpu", profile.total_bytes, profile.name, fraction, **about)


def _peak_dict(report: Report) -> dict[str, Any]:
    p = report.peak
    return {
        "allocated_bytes": p.allocated_bytes,
        "reserved_bytes": p.reserved_bytes,
        "device_used_bytes": p.device_used_bytes,
    }


class Estimator:
    """Estimates of one workload and strategy at several batch sizes, cached."""

    def __init__(
        self,
        spec: str,
        target: Target,
        strategy: Strategy,
        precision: str | None,
        accumulate: int | None,
        allocator_config: str | None,
        progress: Progress | None = None,
        parallel: ParallelPlan | None = None,
        axis: SequenceAxis | None = None,
    ) -> None:
        self.spec = spec
        self.parallel = parallel
        self.resolved = resolve(spec)
        self.axis = axis  # None: the batch size grows; else the sequence length
        self.target = target
        self.strategy = strategy
        self.precision = precision
        self.accumulate = accumulate
        self.allocator_config = allocator_config
        self.progress = progress
        self.cache: dict[tuple[int, int | None], Report] = {}

    def report(self, batch_size: int, cap: int | None = None, capped: bool = True) -> Report:
        """The estimate at ``batch_size``; under a budget, with the allocator capped at
        ``cap`` bytes (the usable budget by default), as the memory fraction caps it: it
        frees its cache and retries before it runs out. ``capped=False``: no cap."""
        if not capped:
            cap = None
        elif cap is None and self.target.kind == "budget":
            cap = self.target.usable_bytes
        key = (batch_size, cap)
        if key not in self.cache:
            from vramscope.estimate.estimator import estimate

            stops.check()  # an interruption swallowed during the last one stops the search

            s = self.strategy
            builder, batch = self.resolved.builder, batch_size
            if self.axis is not None:  # batch_size counts the axis's steps of tokens here
                builder, batch = resolve(self.axis.spec_at(batch_size)).builder, self.axis.batch
            report = estimate(
                s.wrap(builder),
                batch_size=s.micro_batch(batch),
                gpu=self.target.gpu,
                precision=s.precision or self.precision,
                accumulate=s.accumulate(self.accumulate),
                allocator_config=s.allocator_config or self.allocator_config,
                reserved_limit=cap,
                parallel=self.parallel,
            )
            report.workload.update(spec=self.spec, batch_size=batch)
            report.workload["saving_strategy" if self.parallel else "strategy"] = s.name
            if self.axis is not None:
                report.workload.update(
                    spec=self.axis.spec_at(batch_size), seq_len=self.size(batch_size)
                )
            self.cache[key] = report
            if self.progress:
                used = format_bytes(self.target.measure_of(_peak_dict(report)))
                what = "batch" if self.axis is None else self.axis.describe_size()
                self.progress(f"estimated {what} {self.size(batch_size)}: {used}")
        return self.cache[key]

    def size(self, n: int) -> int:
        """The batch size, or the sequence length, that the search's ``n`` stands for."""
        return n if self.axis is None else self.axis.length(n)

    @property
    def batches(self) -> list[int]:
        return sorted({b for b, _ in self.cache})

    def value(self, batch_size: int, capped: bool = True) -> int:
        """What grows with the batch: device used on a GPU; under a budget, allocated (the
        capped allocator keeps reserved at the cap by freeing its cache)."""
        peak = _peak_dict(self.report(batch_size, capped=capped))
        if self.target.kind == "budget":
            return peak["allocated_bytes"] or 0
        return self.target.measure_of(peak) or 0

    def aim(self, limit: int) -> int:
        """Where ``value`` crosses the limit: the limit for a GPU; under a budget, the allocated
        bytes a capped allocator reaches before it runs out (``CAPPED_RUNS_OUT_AT`` of the cap).
        It guides the interpolation search and ``--verify``'s jumps; ``fits`` decides."""
        return limit if self.target.kind == "gpu" else int(limit * CAPPED_RUNS_OUT_AT)

    def fits(self, batch_size: int, limit: int | None = None) -> bool:
        """Whether ``batch_size`` fits ``limit`` (the usable bytes by default).

        Under a budget: the replay, capped at ``limit``, does not run out. On a GPU: the
        step does not run out of the GPU's memory, its device used stays within ``limit``,
        and below the GPU's full memory (a margin) the allocator never ran short: a step
        that filled the GPU and freed its cache to go on did not keep the margin free, however
        little it held after."""
        limit = self.target.usable_bytes if limit is None else limit
        if self.target.kind == "budget":
            verdict = self.report(batch_size, cap=limit).extra.get("verdict") or {}
            return verdict.get("oom_at") is None
        # a step that ran out of the GPU's memory does not fit, however little it had
        # reserved when the request failed (a huge batch fails on its first large tensor)
        verdict = self.report(batch_size).extra.get("verdict") or {}
        if verdict.get("oom_at") is not None or self.value(batch_size) > limit:
            return False
        return limit >= self.target.limit_bytes or not self.ran_short(batch_size, limit)

    def ran_short(self, batch_size: int, limit: int | None = None) -> bool:
        """Whether the allocator ran short at ``batch_size``: it freed its cache and retried,
        or a kernel ran a variant with a smaller workspace (under a budget: capped at
        ``limit``; on a GPU: at its full memory)."""
        limit = self.target.usable_bytes if limit is None else limit
        cap = limit if self.target.kind == "budget" else None
        allocator = self.report(batch_size, cap=cap).extra.get("allocator") or {}
        return bool(allocator.get("num_alloc_retries") or allocator.get("smaller_workspaces"))

    def estimated(self, limit: int | None = None) -> list[int]:
        """The batch sizes estimated so far whose verdict under ``limit`` is known without a
        new estimate (under a budget, those replayed with that cap)."""
        if self.target.kind != "budget":
            return self.batches
        limit = self.target.usable_bytes if limit is None else limit
        return sorted(b for b, cap in self.cache if cap == limit)


def largest_fitting(
    fits: Callable[[int], bool],
    value: Callable[[int], int],
    limit: int,
    cap: int,
    start: int | None = None,
) -> int:
    """The largest b in [1, cap] with fits(b), assuming memory grows with b.

    Interpolation search: the next probe is where the line through the two nearest known
    points crosses the limit (extrapolated while no upper bound is known), clamped inside
    the bracket; a bisection step whenever the bracket did not halve. A near-linear
    workload needs a handful of evaluations. 0 when even b=1 does not fit. The cap only
    clamps a probe that would pass it: below the cap, the probes do not depend on it.
    """
    if not fits(1):
        return 0
    lo, hi = 1, cap + 1  # lo fits; hi does not (cap + 1: not known yet)
    points = {1: value(1)}
    probe = start if start is not None else 16
    stalled = 0
    while hi - lo > 1:
        probe = max(lo + 1, min(hi - 1, probe))
        bounded = hi <= cap  # an upper bound was known before this probe
        width = hi - lo
        ok = fits(probe)
        points[probe] = value(probe)
        if ok:
            lo = probe
        else:
            hi = probe
        # a bracket that did not halve twice: bisect. Not while no upper bound is known:
        # extrapolating is what finds one, and bisecting up to a large cap wastes estimates
        stalled = stalled + 1 if bounded and (hi - lo) * 2 > width else 0
        if stalled >= 2:
            probe, stalled = (lo + hi) // 2, 0
            continue
        if hi <= cap:  # interpolate between the bracket's ends
            v_lo, v_hi = points[lo], points[hi]
            slope = (v_hi - v_lo) / (hi - lo)
        else:  # extrapolate from the two largest points that fit
            fitting = sorted(b for b in points if b <= lo)
            b0 = fitting[-2] if len(fitting) >= 2 else fitting[-1]
            v_lo = points[lo]
            slope = (v_lo - points[b0]) / (lo - b0) if lo != b0 else 0
        if slope <= 0:
            probe = lo * 2 if hi > cap else (lo + hi) // 2
        else:
            probe = lo + int((limit - v_lo) / slope)
            if probe <= lo:
                probe = lo + 1
            elif hi <= cap and probe >= hi:
                probe = hi - 1
    return lo


def edge_window(batch: int) -> int:
    """How far below a batch that runs out the search looks: 3% of it, at least 8 and at
    most 24 batch sizes."""
    return max(8, min(24, int(batch * 0.03)))


# the batch sizes just below one that runs out that are each estimated; further down the
# window, every third (which meets every batch size of a class that runs out every 2nd, 4th
# or 8th size: 3 shares no factor with them)
NEAR, STRIDE = 8, 3


def window_below(lowest: int, window: int) -> list[int]:
    """The batch sizes looked at below ``lowest``: the ``NEAR`` next ones, then every
    ``STRIDE``-th down to ``window`` below it."""
    near = list(range(lowest - 1, max(0, lowest - 1 - NEAR), -1))
    far = range(lowest - 1 - NEAR - (STRIDE - 1), max(0, lowest - 1 - window), -STRIDE)
    return near + list(far)


def lowest_failure(
    fits: Callable[[int], bool],
    first: int,
    window: Callable[[int], int] = edge_window,
) -> int:
    """The lowest batch size that runs out, looking down from ``first`` (one that runs out,
    or the search's cap + 1): ``first`` when every batch looked at below it runs.

    Near the limit memory is not monotone in the batch size: which cuDNN variant runs, when
    the allocator frees its cache and whether a block finds room in a cached segment depend
    on the exact sizes. Recorded on an H200 under a 2 GiB cap, the example CNN ran at batch
    217, ran out at 218 and 219, ran again at 220 to 224 and ran out from 225
    (``tests/data/fit_edges_h200.json``); on a GPU's full memory the estimate of the example
    CNN needs one more segment at every eighth batch size. A last, smaller batch of an epoch
    must fit too, so the answer is one below the lowest batch that runs out. Below each one
    found, the 8 next batch sizes are estimated, then every third down the window
    (:func:`window_below`), and the lowest found starts the next window. Batches that run
    out at a regular spacing (every eighth) are a class whose memory grows with the batch
    like the others: the search follows the class down (by doubling steps, then bisection)
    before it looks at the window below its lowest."""
    lowest = first
    while lowest > 1:
        failing = [b for b in window_below(lowest, window(lowest)) if not fits(b)]
        if not failing:
            return lowest
        lowest = min(failing)
        period = _spacing(failing)
        if period:
            lowest = _lowest_of_class(fits, lowest, period)
    return lowest


def _spacing(failing: list[int]) -> int | None:
    """The regular spacing of batches that run out apart from each other (the commonest gap
    of 2 or more between them, the smallest of equals), or None."""
    ordered = sorted(failing)
    gaps = [b - a for a, b in itertools.pairwise(ordered) if b - a >= 2]
    if not gaps:
        return None
    return min(set(gaps), key=lambda g: (-gaps.count(g), g))


def _lowest_of_class(fits: Callable[[int], bool], failing: int, period: int) -> int:
    """The lowest of ``failing - k * period`` that runs out, assuming that within this class
    memory grows with the batch: steps of 1, 2, 4, … periods down to one that runs, then
    bisection between them."""
    runs_out, step = 0, 1  # multiples of the period below ``failing``
    while True:
        b = failing - step * period
        if b < 1 or fits(b):
            runs = step
            break
        runs_out, step = step, step * 2
    while runs - runs_out > 1:
        mid = (runs + runs_out) // 2
        b = failing - mid * period
        if b >= 1 and not fits(b):
            runs_out = mid
        else:
            runs = mid
    return failing - runs_out * period


@dataclass(frozen=True)
class BatchSearch:
    """What the estimate's search found: the answer (the largest batch that runs with every
    smaller one), the largest batch found running on the way up (the answer's bracket), with
    the margin and without it."""

    runs: int
    best: int
    runs_without_margin: int | None = None
    best_without_margin: int | None = None


def largest_batch(
    est: Estimator, limit: int, max_batch_size: int, start: int | None = None
) -> tuple[int, int]:
    """(runs, best) under ``limit``: the largest batch the interpolation search found
    running, and the answer: one below the lowest batch that runs out (``lowest_failure``,
    from the lowest that any estimate so far found running out), or the cap when none
    does."""

    def fits(b: int) -> bool:
        return est.fits(b, limit)

    runs = largest_fitting(fits, est.value, est.aim(limit), max_batch_size, start=start)
    if runs == 0:
        return 0, 0
    known = [b for b in est.estimated(limit) if b <= max_batch_size and not fits(b)]
    if not known and runs == max_batch_size and est.value(runs) <= est.aim(limit) // 2:
        return runs, runs  # the cap holds half the limit or less: far from any edge
    first = min([*known, runs + 1])
    return runs, lowest_failure(fits, first) - 1


def search_batches(
    est: Estimator,
    max_batch_size: int,
    start: int | None = None,
    without_margin: bool = True,
) -> BatchSearch:
    """The largest batch within the target's margin (the search starts at ``start``, or 16),
    and when ``without_margin``, the same at the full target."""
    target = est.target
    runs, best = largest_batch(est, target.usable_bytes, max_batch_size, start)
    if not without_margin:
        return BatchSearch(runs, best)
    runs_full, best_full = largest_batch(
        est, target.limit_bytes, max_batch_size, start=max(best, 1) + 1
    )
    return BatchSearch(runs, best, runs_full, best_full)


def fit_section(est: Estimator, found: BatchSearch, max_batch_size: int) -> dict[str, Any]:
    """The report's ``fit`` section for an estimate-only answer: the answer, the target and
    every estimate made on the way (the curve of memory against batch size)."""
    key = "max_batch_size" if est.axis is None else "max_seq_len"
    without = found.best_without_margin
    # estimated above the answer and fitting: memory is not monotone in the batch there
    above = [b for b in est.estimated() if b > found.best and est.fits(b)]
    return {
        key: est.size(found.best),
        f"{key}_without_margin": est.size(without) if without is not None else None,
        # the largest size the estimate runs, when a smaller one runs out (best is below that)
        "largest_running": est.size(max(above)) if above else None,
        # the sizes estimated above the answer that fit, as [first, last] runs
        "fits_above": [[est.size(a), est.size(b)] for a, b in spans(above)],
        "target": {
            **_target_section(est.target),
            "compares": "device_used_bytes" if est.target.kind == "gpu" else "reserved_bytes",
        },
        "capped": found.best >= max_batch_size,
        "search_cap": est.size(max_batch_size),
        "method": "estimate",
        "estimates": len(est.cache),
        "curve": [
            {
                "batch_size" if est.axis is None else "seq_len": est.size(b),
                "peak": _peak_dict(est.report(b)),
                "fits": est.fits(b),
            }
            for b in est.batches
        ],
    }


def _target_section(target: Target) -> dict[str, Any]:
    return {
        "kind": target.kind,
        "gpu": target.gpu,
        "gpu_name": target.gpu_name,
        "gpu_given": target.gpu_given,
        "gpu_total_bytes": target.gpu_total_bytes,
        "limit_bytes": target.limit_bytes,
        "margin": target.margin,
        "usable_bytes": target.usable_bytes,
    }


def fit(
    workload: str,
    gpu: str | None = None,
    budget: str | int | None = None,
    margin: str | float | None = None,
    max_batch_size: int = 1024,
    precision: str | None = None,
    accumulate: int | None = None,
    allocator_config: str | None = None,
    effective_batch: int | None = None,
    verify: bool = False,
    progress: Progress | None = None,
    parallel: ParallelPlan | None = None,
) -> Report:
    """The largest batch size that fits, from the estimator; ``verify`` confirms it for real.
    With ``parallel``, the batch size per GPU of one rank of that job (and
    ``effective_batch`` is the job's: micro-batch × accumulation × world size)."""
    target = make_target(gpu, budget, margin)
    if max_batch_size < 1:
        raise VramscopeError(f"--max-batch-size must be 1 or more, not {max_batch_size}")
    if parallel is not None:
        parallel.check()
        if verify:
            raise VramscopeError(
                "--verify runs trials on this machine's one GPU; with --world-size the answer "
                "is the estimate's (benchmarks/distributed_accuracy.py compares a job)"
            )
        if effective_batch and effective_batch % parallel.dp_size:
            ranks = (
                f"the {parallel.dp_size} data-parallel ranks (--world-size / --tp)"
                if parallel.tensor_parallel
                else f"--world-size {parallel.world_size}"
            )
            raise VramscopeError(
                f"--effective-batch {effective_batch} is the job's batch: it must be a "
                f"multiple of {ranks}"
            )
    base = get_strategy("baseline")
    est = Estimator(
        workload, target, base, precision, accumulate, allocator_config, progress, parallel
    )
    with partial_on_stop(lambda: partial_report(est)):
        found = search_batches(est, max_batch_size)
        best = found.best
        runs_no_margin = found.runs_without_margin or 0
        best_no_margin = found.best_without_margin or 0
        section = fit_section(est, found, max_batch_size)
        report = est.report(max(best, 1))
        findings: list[Finding] = []
        probed = est.batches
        if best > 0 and len(probed) >= 2 and est.value(probed[-1]) <= est.value(probed[0]) * 1.001:
            findings.append(
                Finding(
                    "fit",
                    "warning",
                    f"memory does not grow with the batch size (batch {count(probed[0])} and "
                    f"batch {count(probed[-1])} both need {format_bytes(est.value(probed[0]))}): "
                    "the build function may not use batch_size as the first dimension of its "
                    "inputs, so the answer is only the --max-batch-size cap",
                    {},
                )
            )
            section["batch_size_has_no_effect"] = True
        if best == 0:
            # what batch size 1 needs of what the target compares, on a GPU large enough
            section["needed_at_batch_1_bytes"] = target.measure_of(
                _peak_dict(est.report(1, capped=False))
            )
            section["parameters_bytes"] = est.report(1, capped=False).categories_at_peak.parameters
            section["closest_strategy"] = _closest_strategy(
                workload, target, precision, accumulate, allocator_config, parallel
            )
        if parallel is not None:
            section["per_rank"] = {
                "world_size": parallel.world_size,
                "dp_size": parallel.dp_size,
                "strategy": parallel.strategy,
                "summary": parallel.describe(),
                # the ranks of a tensor-parallel group share one micro-batch
                "job_batch_size": best * parallel.dp_size,
            }
            if parallel.pipeline:
                # each step runs the micro-batches through every stage: the answer is the
                # micro-batch of the most loaded stage
                job = report.extra.get("distributed") or {}
                section["per_rank"].update(
                    pp=parallel.pp,
                    microbatches=parallel.microbatch_count,
                    schedule=parallel.schedule,
                    job_batch_size=best * parallel.microbatch_count * parallel.dp_size,
                    most_loaded_stage=(job.get("pipeline") or {}).get("stage"),
                )
        if effective_batch:
            per_gpu = effective_batch // (parallel.dp_size if parallel else 1)
            section["plans"] = _plans(est, per_gpu, best, target)
            if parallel is not None:
                section["plans_per_gpu_of"] = effective_batch
            recommended = next((p for p in section["plans"] if p["fits"]), None)
            section["recommended_plan"] = recommended
        if verify:
            seed = best_no_margin or 1
            slope = (est.value(seed) - est.value(1)) / (seed - 1) if seed > 1 else None
            section["verify"] = _verify(
                workload,
                target,
                seed,
                sorted({best_no_margin + 1, runs_no_margin + 1}),
                precision,
                accumulate,
                allocator_config,
                max_batch_size,
                progress,
                slope_bytes=slope,
                aim_bytes=est.aim(target.limit_bytes) if target.kind == "budget" else None,
            )
            if section["verify"].get("max_batch_size") is not None:
                section["method"] = "estimate+verify"
        section["answer"] = final_answer(section)
        report.extra["fit"] = section
        report.findings = answer_findings(section) + findings + report.findings
        return report


def partial_report(est: Estimator) -> Report | None:
    """What a search stopped before its answer has: its estimates so far, and the largest
    size that fits with every smaller one estimated so far (not an answer: ``max_batch_size``
    is null). None before the first estimate."""
    done = est.estimated()
    if not done:
        return None
    so_far = 0
    for b in done:  # ascending: up to the first that does not fit
        if not est.fits(b):
            break
        so_far = b
    cap = est.target.usable_bytes if est.target.kind == "budget" else None
    report = est.cache[(so_far or done[0], cap)]
    key = "max_batch_size" if est.axis is None else "max_seq_len"
    report.extra["fit"] = {
        key: None,
        "interrupted": True,
        "fits_so_far": est.size(so_far),
        "target": _target_section(est.target),
        "method": "estimate",
        "estimates": len(est.cache),
        "curve": [
            {
                "batch_size" if est.axis is None else "seq_len": est.size(b),
                "peak": _peak_dict(est.cache[(b, cap)]),
                "fits": est.fits(b),
            }
            for b in done
        ],
    }
    return report


def answer_findings(section: dict[str, Any]) -> list[Finding]:
    """The fit's answer as findings, in the headline's words: the answer and its target
    (an error when nothing fits), and a warning where memory is not monotone."""
    from vramscope.fit import wording

    answer = wording.answer_line(section)
    nothing = answer.startswith("Does not fit")
    findings = [
        Finding(
            "fit",
            "error" if nothing else "info",
            f"{answer}; {wording.target_line(section)}; {wording.method_line(section)}",
            {"part": "answer"},
        )
    ]
    for line in (wording.not_verified_line(section), wording.not_monotone_line(section)):
        if line:
            findings.append(Finding("fit", "warning", line, {"part": "answer"}))
    return findings


@dataclass(frozen=True)
class SequenceAxis:
    """``fit --seq-len``: what grows is an ``hf:`` spec's sequence length (the prompt's, for
    ``@generate``: its new tokens stay), at a fixed batch size."""

    spec: HfSpec
    batch: int
    step: int = 16  # tokens: the answer is a multiple of this

    def length(self, n: int) -> int:
        return n * self.step

    @classmethod
    def of(cls, workload: str, batch_size: int) -> SequenceAxis:
        from vramscope.zoo import parse_hf

        text = workload.strip()
        if not text.startswith("hf:"):
            raise VramscopeError(
                "--seq-len searches the sequence length of an hf: model (its /seq=N option); "
                f"{text} is not one"
            )
        parsed = parse_hf(text[3:])
        task = parsed.config()[1]
        if task not in _TEXT_TASKS:
            raise VramscopeError(
                f"--seq-len needs a model that reads text; the task of {text} is {task}"
            )
        return cls(parsed, batch_size)

    def spec_at(self, n: int) -> str:
        return self.spec.with_length(self.length(n))

    def describe_size(self) -> str:
        return "prompt length" if self.spec.generate else "sequence length"

    def longest(self) -> int | None:
        """The longest length the model's positions allow (the prompt's: less the new
        tokens)."""
        positions = self.spec.max_positions()
        if positions is None:
            return None
        return max(1, positions - self.spec.new_tokens)


_TEXT_TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "sequence-classification", "contrastive")


# --seq-len without --max-seq-len and a model that names no longest sequence
DEFAULT_MAX_SEQ_LEN = 131_072


def fit_sequence(
    workload: str,
    gpu: str | None = None,
    budget: str | int | None = None,
    margin: str | float | None = None,
    batch_size: int = 1,
    max_seq_len: int | None = None,
    precision: str | None = None,
    accumulate: int | None = None,
    allocator_config: str | None = None,
    progress: Progress | None = None,
    parallel: ParallelPlan | None = None,
) -> Report:
    """The longest sequence of an ``hf:`` model that fits at ``batch_size``, from the
    estimator (``fit --seq-len``); for ``@generate`` the longest prompt before its new
    tokens. ``parallel``: per rank of a data-parallel job, as :func:`fit`."""
    target = make_target(gpu, budget, margin)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise VramscopeError(f"batch size must be a whole number of 1 or more, not {batch_size!r}")
    axis = SequenceAxis.of(workload, batch_size)
    longest = max_seq_len or axis.longest() or DEFAULT_MAX_SEQ_LEN
    cap = longest // axis.step  # in steps of tokens
    if cap < 1:
        raise VramscopeError(
            f"the longest {axis.describe_size()} tried, {longest}, is shorter than the "
            f"{axis.step} tokens the search counts in"
        )
    base = get_strategy("baseline")
    est = Estimator(
        workload,
        target,
        base,
        precision,
        accumulate,
        allocator_config,
        progress,
        parallel=parallel,
        axis=axis,
    )
    with partial_on_stop(lambda: partial_report(est)):
        found = search_batches(est, cap, start=min(cap, 512 // axis.step))
    section = fit_section(est, found, cap)
    new = axis.spec.new_tokens
    section.update(
        axis="seq_len",
        step=axis.step,
        batch_size=batch_size,
        max_seq_len_cap=axis.length(cap),
        # where the cap came from: --max-seq-len, the model's positions, or the default
        cap_from="option" if max_seq_len else "positions" if axis.longest() else "default",
        new_tokens=new or None,
        # the answer in one place, as a batch-size fit has it (no trials verify a length)
        answer={
            "max_seq_len": section.get("max_seq_len"),
            "source": "estimate",
            "real_trials": 0,
            "margin_applied": True,
        },
    )
    report = est.report(max(found.best, 1))
    if found.best == 0:
        section["needed_at_shortest_bytes"] = target.measure_of(
            _peak_dict(est.report(1, capped=False))
        )
    report.extra["fit"] = section
    report.findings = [*answer_findings(section), *report.findings]
    return report


def _plans(est: Estimator, effective: int, best: int, target: Target) -> list[dict[str, Any]]:
    """micro-batch × accumulation plans that reach ``effective``, largest micro-batch first."""
    plans = []
    divisors = sorted(
        {
            d
            for i in range(1, math.isqrt(effective) + 1)
            if effective % i == 0
            for d in (i, effective // i)
        },
        reverse=True,
    )  # (found up to the square root: an effective batch of billions is instant)
    nearest = min(divisors, key=lambda d: abs(d - best))
    for micro in divisors:
        if micro > max(best, 1) * 2 and micro != nearest:
            continue  # far above what fits: not worth an estimate
        steps = effective // micro
        with contextlib.suppress(NotApplicable):
            plan_est = Estimator(
                est.spec,
                target,
                est.strategy,
                est.precision,
                steps,  # the plan's own accumulation: micro-batch × steps is the effective batch
                est.allocator_config,
                parallel=est.parallel,
            )
            plans.append(
                {
                    "micro_batch": micro,
                    "accumulate": steps,
                    "peak": _peak_dict(plan_est.report(micro)),
                    "fits": plan_est.fits(micro),
                }
            )
        if len([p for p in plans if p["fits"]]) >= 3:
            break
    return plans


def _verify(
    spec: str,
    target: Target,
    seed: int,
    edges: list[int],
    precision: str | None,
    accumulate: int | None,
    allocator_config: str | None,
    cap: int,
    progress: Progress | None,
    slope_bytes: float | None = None,
    aim_bytes: int | None = None,
) -> dict[str, Any]:
    """Real trials in fresh processes, starting at the estimate: exact with few trials.

    ``edges`` are the batch sizes where the estimate runs out first (just above its answer,
    and above the largest batch it runs): tried first with the batch below each, they settle
    an exact estimate in two trials (``_at_the_edges``). Otherwise, after a trial that fits,
    its *measured* peak and the estimate's bytes per sample predict where the limit is
    crossed, so an estimate a few percent off still needs only a few trials. Under a budget
    the capped allocator holds reserved near the cap, so the prediction follows allocated
    memory instead, towards ``aim_bytes``: real runs under a cap ran out with allocated at
    97.4-99.1% of it (example CNN, H200).
    """
    import torch

    if not torch.cuda.is_available():
        return {"error": "--verify needs a CUDA device on this machine", "trials": []}
    budget = target.limit_bytes if target.kind == "budget" else None
    trials: list[TrialResult] = []
    crashed: list[TrialResult] = []

    def fits(b: int) -> bool:
        for t in trials:
            if t.batch_size == b:
                return t.fits
        if progress:
            progress(f"trial {len(trials) + 1}: batch {b} in a fresh process …")
        result = run_trial(
            spec,
            b,
            precision=precision,
            accumulate=accumulate,
            allocator_config=allocator_config,
            budget_bytes=budget,
        )
        if result.status == "fits" and target.kind == "gpu":
            used = target.measure_of(result.peak) or 0
            if used > target.limit_bytes:
                result.status = "oom"
        trials.append(result)
        if progress:
            progress(f"trial {len(trials)}: batch {b}: {result.status}")
        if result.status == "crashed":
            crashed.append(result)
            raise _Crashed(result)
        return result.fits

    aim = target.limit_bytes
    measure: Callable[[dict[str, Any]], int | None] = target.measure_of
    if target.kind == "budget" and aim_bytes:
        aim = aim_bytes

        def measure(peak: dict[str, Any]) -> int | None:
            return peak.get("allocated_bytes")

    def predict(b: int) -> int | None:
        """Where the limit is crossed, from the measured peak at ``b``: the slope between two
        fitting trials when there are two, else the estimate's bytes per sample."""
        measured_at = {t.batch_size: measure(t.peak) for t in trials if t.fits and t.peak}
        measured = measured_at.get(b)
        if not measured:
            return None
        slope = slope_bytes
        others = [(abs(o - b), o) for o in measured_at if o != b and measured_at[o]]
        if others:
            other = min(others)[1]
            secant = (measured - measured_at[other]) / (b - other)
            if secant > 0:
                slope = secant
        if not slope or slope <= 0:
            return None
        return b + int((aim - measured) / slope)

    answer: int | None
    try:
        answer = _at_the_edges(fits, edges, cap)
        if answer is None:
            ran = [t.batch_size for t in trials if t.fits]
            answer = _search_from(fits, max(ran) if ran else seed, cap, predict)
    except _Crashed as exc:
        answer = None
        crash = exc.result
        return {
            "max_batch_size": None,
            "error": f"trial at batch {crash.batch_size} crashed (not an OOM): {crash.error}",
            "trials": [_trial_row(t) for t in trials],
        }
    return {
        "max_batch_size": answer,
        "trials": [_trial_row(t) for t in trials],
        "real_trials": len(trials),
    }


def _at_the_edges(fits: Callable[[int], bool], edges: list[int], cap: int) -> int | None:
    """Try the estimate's edges, lowest first: the batch below the edge, then the edge (where
    the estimate runs out). The first runs and the edge runs out: that is the answer, two
    trials when the estimate is right. An edge that runs refutes it and the next is tried.
    None when the batch below an edge runs out (the estimate was high: search below) or the
    estimate missed every edge (search above)."""
    for edge in edges:
        if edge < 2 or edge - 1 > cap:
            continue
        if not fits(edge - 1):
            return None
        if edge > cap or not fits(edge):
            return edge - 1
    return None


class _Crashed(Exception):
    def __init__(self, result: TrialResult) -> None:
        self.result = result


def _search_from(
    fits: Callable[[int], bool],
    seed: int,
    cap: int,
    predict: Callable[[int], int | None] | None = None,
) -> int:
    """Largest fitting b, starting from a good guess: jump to where a fitting trial's
    measured peak says the limit is (``predict``), gallop away from it, then bisect."""
    seed = max(1, min(cap, seed))
    if fits(seed):
        lo, hi = seed, None
        settled = True  # the last prediction put the limit at lo
        for _ in range(3):  # each jump lands closer: the second uses two measured peaks
            guess = predict(lo) if predict else None
            settled = guess is None or guess <= lo
            if settled:
                break
            guess = min(cap, guess)
            if fits(guess):
                lo = guess
                if lo == cap:
                    break
                continue
            hi = guess  # just past the limit, most likely: its neighbour settles it
            if hi - 1 > lo:
                if fits(hi - 1):
                    lo = hi - 1
                else:
                    hi -= 1
            break
        step = 1 if settled else max(1, lo // 100)  # unsettled jumps leave ~1% of doubt
        while hi is None and lo < cap:
            probe = min(cap, lo + step)
            if fits(probe):
                lo, step = probe, step * 2
            else:
                hi = probe
        if hi is None:
            return lo
    else:
        hi, step = seed, 1
        lo = 0
        while hi > 1:
            probe = max(1, hi - step)
            if fits(probe):
                lo = probe
                break
            hi, step = probe, step * 2
        if lo == 0:
            return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _trial_row(t: TrialResult) -> dict[str, Any]:
    return {
        "batch_size": t.batch_size,
        "status": t.status,
        "peak": t.peak,
        "step_time_s": t.step_time_s,
        "error": t.error if t.status != "fits" else None,
    }


def _closest_strategy(
    spec: str,
    target: Target,
    precision: str | None,
    accumulate: int | None,
    config: str | None,
    parallel: ParallelPlan | None = None,
) -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    for name in ("bf16+checkpointing+expandable", "bf16-mixed", "checkpointing", "sgd"):
        try:
            est = Estimator(
                spec, target, get_strategy(name), precision, accumulate, config, parallel=parallel
            )
            value = est.value(1, capped=False)
        except VramscopeError:  # not applicable here, or could not be estimated
            continue
        if best is None or value < best["value_bytes"]:
            best = {"name": name, "value_bytes": value, "fits": value <= target.usable_bytes}
    return best
