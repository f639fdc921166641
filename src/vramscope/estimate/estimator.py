"""``vramscope.estimate()``: predict a workload's GPU memory on a named GPU, without that GPU.

Pipeline: trace real steps with fake tensors on an emulated CUDA device
(:mod:`~vramscope.estimate.trace`, with :mod:`~vramscope.estimate.kernels` adding what CUDA
kernels allocate for themselves) → replay the allocations through the caching-allocator
simulator (:mod:`~vramscope.estimate.allocator`) for reserved memory, repeating the steady
step until the allocator's reserved memory stops changing → add the profile's context and
library memory for device used → the same :class:`~vramscope.report.model.Report` a measured
run gives, with ``kind="estimated"`` and a verdict.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vramscope import __version__
from vramscope.errors import VramscopeError
from vramscope.estimate.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from vramscope.estimate.allowance import device_used_allowance
from vramscope.estimate.profiles import GpuProfile, get_profile
from vramscope.estimate.scalars import HEAVY, LIGHT
from vramscope.estimate.trace import Trace, trace_workload
from vramscope.report.aggregate import PHASE_ORDER, phases_of
from vramscope.report.findings import add_findings
from vramscope.report.model import (
    AllocatorSlack,
    Categories,
    Finding,
    Peak,
    PhaseStats,
    Reconciliation,
    Report,
    Startup,
    StepStats,
)
from vramscope.report.verdict import sentence as verdict_sentence
from vramscope.units import format_bytes, parse_size
from vramscope.workload import Builder, normalize_precision, resolve

if TYPE_CHECKING:
    from vramscope.distributed.sharding import ParallelPlan

MAX_SIMULATED_STEPS = 8
UNBOUNDED_BYTES = 1 << 62  # the memory of "a GPU large enough": what a step needs, unbounded
MIN_SIMULATED_STEPS = 3
_KIND_TO_COLUMN = {
    "parameter": "parameters_bytes",
    "buffer": "buffers_bytes",
    "gradient": "gradients_bytes",
    "optimizer_state": "optimizer_state_bytes",
}
_KIND_TO_CATEGORY = {
    "parameter": "parameters",
    "buffer": "buffers",
    "gradient": "gradients",
    "optimizer_state": "optimizer_state",
    "activation": "activations",
    "temporary": "temporaries",
    "data": "temporaries",
    "workspace": "other",
    "other": "other",
}


def estimate(
    workload: str | Builder,
    batch_size: int,
    gpu: str | GpuProfile = "h200",
    precision: str | None = None,
    accumulate: int | None = None,
    allocator_config: str | None = None,
    memory: str | int | None = None,
    steps: int = 2,
    reserved_limit: int | None = None,
    parallel: ParallelPlan | None = None,
    trust_remote_code: bool = False,
) -> Report:
    """Predict peak allocated, reserved and device-used memory of ``workload`` on ``gpu``.

    ``workload`` is a spec (``file.py:fn``, ``example:gpt``, ``hf:gpt2``…) or a build function
    ``build(batch_size, device) -> Workload``. ``steps`` real steps are traced (at least 2:
    the first step, and a steady one with optimizer state); the allocator replay repeats the
    steady step until reserved memory stops growing. ``memory`` (``"24GiB"``) overrides the
    GPU's total. ``allocator_config`` is ``PYTORCH_CUDA_ALLOC_CONF`` syntax; when None, the
    ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` of this process apply, as on the GPU.
    ``reserved_limit`` caps what the allocator may reserve, as
    ``torch.cuda.set_per_process_memory_fraction`` does: it frees its cache and retries
    before it runs out, and the verdict's ``oom_at`` says where it still did.
    ``parallel`` estimates one rank of a data-parallel job (DDP, FSDP2, HSDP, ZeRO; see
    :mod:`vramscope.estimate.distributed`): the report is per rank, the heaviest one's.
    ``trust_remote_code``: an ``hf:`` model may run the code its repository ships.
    """
    from vramscope.hf_models import trusting_remote_code

    started = time.perf_counter()
    profile = get_profile(gpu)
    total = parse_size(memory) if memory is not None else profile.total_bytes
    if total <= 0:
        raise VramscopeError(f"--memory must be more than 0, not {memory!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise VramscopeError(f"batch size must be a whole number of 1 or more, not {batch_size!r}")
    if precision is not None:
        precision = normalize_precision(precision)
    if accumulate is not None and int(accumulate) < 1:
        raise VramscopeError(f"accumulate must be 1 or more, not {accumulate}")
    if not isinstance(steps, int) or steps < 1:
        raise VramscopeError(f"steps must be 1 or more, not {steps!r}")
    config_text = (
        allocator_config
        if allocator_config is not None
        else os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    )
    config = AllocatorConfig.parse(config_text)
    spec = resolve(workload)
    with trusting_remote_code(trust_remote_code):
        if parallel is not None:
            from vramscope.estimate.distributed import estimate_ranks

            parallel.check()
            if parallel.pipeline and accumulate is not None and accumulate > 1:
                raise VramscopeError(
                    "--accumulate with --pp: a pipeline's micro-batches are its accumulation; "
                    "give --microbatches"
                )
            report = estimate_ranks(
                spec,
                batch_size,
                profile,
                total,
                config,
                config_text,
                parallel,
                precision=precision,
                accumulate=accumulate,
                steps=max(steps, 2),
                reserved_limit=reserved_limit,
                replay_report=replay_report,
            )
        else:

            def traced(variant: str, draws_at_top: bool = False) -> tuple[Report, Trace]:
                trace = trace_workload(
                    spec,
                    batch_size,
                    profile,
                    precision=precision,
                    accumulate=accumulate,
                    steps=max(steps, 2),
                    variant=variant,
                    draws_at_top=draws_at_top,
                )
                report, _ = replay_report(
                    spec.spec,
                    batch_size,
                    profile,
                    total,
                    config,
                    config_text,
                    trace,
                    reserved_limit,
                )
                return report, trace

            report, trace = _drawn_at_top(*traced(HEAVY), traced)
            report = _bounded_by_assumptions(
                report, trace, functools.partial(traced, draws_at_top=trace.draws_at_top)
            )
    report.extra["estimate"]["seconds"] = round(time.perf_counter() - started, 3)
    return report


def _the_larger(
    report: Report, trace: Trace, traced_other: Callable[[], tuple[Report, Trace]]
) -> tuple[Report, Trace, Report | None, str | None]:
    """This estimate and another traced beside it: the larger (by its allocated peak) with
    its trace, the other one (None when it could not be traced) and why it could not."""
    try:
        other, other_trace = traced_other()
    except VramscopeError as exc:
        return report, trace, None, str(exc)
    if other.peak.allocated_bytes > report.peak.allocated_bytes:
        return other, other_trace, report, None
    return report, trace, other, None


def _drawn_at_top(
    report: Report, trace: Trace, traced: Callable[..., tuple[Report, Trace]]
) -> tuple[Report, Trace]:
    """A random integer draw of the step made a size (sequence lengths packed, a count):
    the run draws again in every step and its peak follows the longest draw, so the step is
    traced again with every such draw at the top of its range
    (:data:`~vramscope.estimate.scalars.INTEGER_DRAW`) and the larger estimate kept; the
    report says which draws and how many bytes depend on them."""
    if not trace.sized_by_draws:
        return report, trace
    chosen, chosen_trace, other, failed = _the_larger(
        report, trace, lambda: traced(HEAVY, draws_at_top=True)
    )
    top = None if other is None else chosen if chosen_trace.draws_at_top else other
    draws = "; ".join(trace.sized_by_draws)
    extra = chosen.extra.setdefault("estimate", {})
    extra["integer_draws"] = {
        "draws": trace.sized_by_draws,
        "at_top": chosen_trace.draws_at_top,
        "peak_as_drawn": dataclasses.asdict(report.peak),
        "peak_at_top": dataclasses.asdict(top.peak) if top is not None else None,
        "error_at_top": failed,
    }
    if other is None:
        tail = f"; traced at the top of its range it failed ({failed}): the draw as made is kept"
    else:
        depends = abs(chosen.peak.allocated_bytes - other.peak.allocated_bytes)
        kept = "the top of its range" if chosen_trace.draws_at_top else "the values drawn"
        tail = (
            f"; traced as drawn and at the top of its range, the larger kept ({kept}): "
            f"{format_bytes(depends)} of the peak depends on the draw"
        )
    chosen.findings.append(
        Finding(
            "assumption",
            "warning" if chosen_trace.draws_at_top else "info",
            f"a random integer draw made a size ({draws}); each step of a run draws again" + tail,
            {"draws": trace.sized_by_draws},
        )
    )
    return chosen, chosen_trace


def _bounded_by_assumptions(
    report: Report, trace: Trace, traced: Callable[[str], tuple[Report, Trace]]
) -> Report:
    """Values the trace could not know were assumed the way that needs the most memory
    (:mod:`~vramscope.estimate.scalars`): every row routed to the same positions, every
    element selected. The light variant (rows spread evenly, nothing selected) is traced
    too; the estimate is the larger of the two (routing capped by an expert's capacity can
    need more when spread), and the report says what was assumed and how many bytes of the
    peak depend on it."""
    if not trace.assumptions:
        return report
    chosen, chosen_trace, alternative, failed = _the_larger(report, trace, lambda: traced(LIGHT))
    variant = chosen_trace.variant
    rows = [
        {
            "kind": a.kind,
            "op": a.what,
            "where": a.where,
            "assumed": a.heavy if variant == HEAVY else a.light,
            "alternative": a.light if variant == HEAVY else a.heavy,
        }
        for a in (chosen_trace.assumptions or trace.assumptions)
    ]
    extra = chosen.extra.setdefault("estimate", {})
    extra["assumptions"] = rows
    extra["assumption_variant"] = variant
    if alternative is not None:
        depends = {
            key: abs(getattr(chosen.peak, key) - getattr(alternative.peak, key))
            for key in ("allocated_bytes", "reserved_bytes", "device_used_bytes")
        }
        extra["alternative_peak"] = dataclasses.asdict(alternative.peak)
        extra["assumption_bytes"] = depends
        tail = (
            f"; with the alternative ({rows[0]['alternative']}) the peak would be "
            f"{format_bytes(alternative.peak.allocated_bytes)} allocated: "
            f"{format_bytes(depends['allocated_bytes'])} of the peak depends on it"
        )
    else:
        extra["alternative_error"] = failed
        tail = "; the alternative could not be traced"
    first = rows[0]
    more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
    chosen.findings.append(
        Finding(
            "assumption",
            "warning",
            f"values the estimate cannot know were assumed at {first['op']} "
            f"({first['where']}){more}: {first['assumed']}{tail}",
            {"assumptions": rows},
        )
    )
    return chosen


def replay_report(
    spec: str,
    batch_size: int,
    profile: GpuProfile,
    total: int,
    config: AllocatorConfig,
    config_text: str | None,
    trace: Trace,
    reserved_limit: int | None = None,
) -> tuple[Report, Replay]:
    """Replay a trace through the allocator simulator and make its report."""
    context = context_bytes(profile, trace)
    capacity = max(0, total - context)
    if reserved_limit is not None:
        capacity = min(capacity, reserved_limit)
    result = replay_trace(trace, config, capacity, total)
    needs = None
    if result.oom:  # what the step needs on a GPU large enough: the same replay, unbounded
        unbounded = replay_trace(trace, config, UNBOUNDED_BYTES, total)
        reserved = max(unbounded.peak_reserved, unbounded.after_build_reserved)
        needs = {
            "allocated_bytes": unbounded.peak_allocated,
            "reserved_bytes": reserved,
            "device_used_bytes": reserved + context,
            "device_used_upper_bytes": reserved
            + context
            + sum(n for _, n in device_used_allowance(profile, trace, reserved)),
        }
    report = _report(
        spec, batch_size, profile, total, config, config_text, trace, result, needs, reserved_limit
    )
    return report, result


def _context_words(profile: GpuProfile, trace: Trace) -> str:
    """The context an estimate adds, in the words ``estimate --list-gpus`` uses."""
    text = profile.describe_context(
        training=trace.backward_ran,
        cudnn="cudnn" in trace.libraries,
        cudnn_backward="cudnn_backward" in trace.libraries,
        cublas_threads=cublas_threads(trace),
    )
    if trace.communicator_bytes:
        text += f", and {format_bytes(trace.communicator_bytes)} for NCCL's communicators"
    return text


def cublas_threads(trace: Trace) -> int:
    """The threads of the step that set up a cuBLAS handle (ran a GEMM): the main thread,
    autograd's device thread."""
    return sum(1 for name in trace.libraries if name.startswith("cublas:"))


def context_bytes(profile: GpuProfile, trace: Trace) -> int:
    """The profile's context and library memory for what this step uses (and NCCL's
    communicators, for a rank of a distributed job)."""
    return (
        profile.context_bytes(
            training=trace.backward_ran,
            cudnn="cudnn" in trace.libraries,
            cudnn_backward="cudnn_backward" in trace.libraries,
            cublas_threads=cublas_threads(trace),
        )
        + trace.communicator_bytes
    )


# ---- replay ---------------------------------------------------------------------------------


@dataclass
class PhaseRun:
    step: int
    name: str
    start_allocated: int = 0
    end_allocated: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    count: int = 1


@dataclass
class Replay:
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_step: int | None = None
    peak_phase: str | None = None
    peak_live: dict[int, int] = field(default_factory=dict)  # block -> allocated size, at peak
    peak_fragmentation: int = 0
    peak_requested: int = 0
    after_build_allocated: int = 0
    after_build_reserved: int = 0
    steps: dict[int, list[PhaseRun]] = field(default_factory=dict)
    step_bounds: dict[int, tuple[int, int]] = field(default_factory=dict)  # start/end alloc
    traced_steps: int = 0
    simulated_steps: int = 0
    oom: bool = False
    oom_request: int | None = None
    oom_where: tuple[int, str] | None = None
    oom_reserved: int | None = None  # reserved when the first request failed
    num_alloc_retries: int = 0
    fallbacks: int = 0  # allocations that ran out and took a kernel's smaller variant
    num_segments: int = 0
    reserved_at_end: int = 0
    activations: dict[int, str] = field(default_factory=dict)  # block -> kind at peak
    module_activations: dict[str, int] = field(default_factory=dict)
    origins: dict[int, int] = field(default_factory=dict)  # a repeat's block -> trace block
    stable: bool = True


def _slices(trace: Trace) -> list[tuple[int, int, int]]:
    """(step, first event, end event) of each traced step."""
    end = next((i for i, s, p in trace.marks if p == "end"), len(trace.events))
    bounds = [*trace.step_starts, end]
    return [(i, bounds[i], bounds[i + 1]) for i in range(len(trace.step_starts))]


def _repeatable(trace: Trace, start: int, end: int) -> tuple[list[int], list[int]] | None:
    """Blocks a steady step frees that an earlier step made (carry-in) and blocks it leaves
    alive (carry-out); the step repeats only if they match in size, one for one."""
    allocated: set[int] = set()
    carry_in: list[int] = []
    for event in trace.events[start:end]:
        if event[0] == "alloc":
            allocated.add(event[1])
        elif event[0] == "free" and event[1] not in allocated:
            carry_in.append(event[1])
    freed = {e[1] for e in trace.events[start:end] if e[0] == "free"}
    carry_out = [b for b in allocated if b not in freed]
    carry_out.sort()
    sizes_in = sorted(trace.blocks[b].size for b in carry_in)
    sizes_out = sorted(trace.blocks[b].size for b in carry_out)
    if sizes_in != sizes_out:
        return None
    return carry_in, carry_out


def replay_trace(trace: Trace, config: AllocatorConfig, capacity: int, total: int) -> Replay:
    """Run the trace's allocations through the simulator: build, set-up, the traced steps,
    then the last traced step again until reserved memory is stable. With ``capacity`` the
    memory the allocator can get, an out-of-memory stops nothing: the replay continues
    without the failed block and the report says where it happened."""
    sim = CachingAllocatorSim(config, capacity, device_total_bytes=total)
    out = Replay()
    blocks = trace.blocks
    fallbacks = trace.fallbacks
    kinds: dict[int, str] = {}
    ids: dict[int, int] = {}  # trace block id (or synthetic) -> sim id
    sizes: dict[int, int] = {}
    failed: set[int] = set()
    # Every change of ``sizes`` and ``kinds`` in order: (_ALLOC, key, size), (_FREE, key,
    # None), (_KIND, key, kind). The live blocks and their kinds at the peak are rebuilt from
    # it once at the end, rather than copied at each of the (thousand) new peaks on the way.
    history: list[tuple[int, int, Any]] = []
    log = history.append
    peak_at = -1  # len(history) at the peak
    backward_starts: list[tuple[int, int]] = []  # (len(history), step) where a backward began

    plans: dict[Any, int] = {}  # a kernel's plan key -> the size of the variant that ran

    def alloc(key: int, size: int, where: tuple[int, str], fallback: Any, stream: int) -> None:
        plan: Any = None
        ladder: tuple[int, ...] = ()
        if fallback is not None:
            plan, ladder = fallback
            size = plans.get(plan, size)  # a plan that ran before runs again
            ladder = tuple(s for s in ladder if s < size)
        if size <= 0:  # the variant without a workspace
            failed.add(key)
            return
        try:
            ids[key] = sim.malloc(size, stream)
        except SimulatedOOM:
            # a kernel with a smaller variant (cuDNN's other engines) makes do with less
            for smaller in ladder:
                if smaller <= 0:
                    failed.add(key)
                    plans[plan] = 0
                    out.fallbacks += 1
                    return
                try:
                    ids[key] = sim.malloc(smaller, stream)
                except SimulatedOOM:
                    continue
                out.fallbacks += 1
                size = plans[plan] = smaller
                break
            else:
                failed.add(key)
                if not out.oom:
                    out.oom, out.oom_request, out.oom_where = True, size, where
                    out.oom_reserved = sim.reserved_bytes
                return
        sizes[key] = size
        log((_ALLOC, key, size))

    def free(key: int) -> None:
        if key in failed:
            failed.discard(key)
            return
        sid = ids.pop(key, None)
        if sid is not None:
            sim.free(sid)
            sizes.pop(key, None)
            log((_FREE, key, None))

    # build and set-up
    for event in trace.events[: trace.setup_end]:
        if event[0] == "alloc":
            alloc(event[1], event[2], (-1, "build"), None, event[3])
            kinds[event[1]] = blocks[event[1]].kind
            log((_KIND, event[1], kinds[event[1]]))
        elif event[0] == "free":
            free(event[1])
        elif event[0] == "empty_cache":
            sim.empty_cache()
    out.after_build_allocated = sim.allocated_bytes
    out.after_build_reserved = sim.reserved_bytes

    marks_by_index: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for index, step, phase in trace.marks:
        marks_by_index[index].append((step, phase))
    slices = _slices(trace)
    out.traced_steps = len(slices)

    def run(step: int, start: int, end: int, mapping: dict[int, int] | None) -> None:
        """Replay events [start, end) as ``step``; ``mapping`` renames trace ids (repeats)."""
        nonlocal peak_at
        phases: list[PhaseRun] = []
        current: PhaseRun | None = None
        alloc_before = sim.allocated_bytes
        # a long generate() replays hundreds of thousands of events: lookups kept local
        events, marks_at, fallback_of = trace.events, marks_by_index.get, fallbacks.get
        where = (step, "data")
        for index in range(start, end):
            marks = marks_at(index)
            if marks:
                for _, phase in marks:
                    if current is not None:
                        current.end_allocated = sim.allocated_bytes
                    current = _open_phase(
                        phases, step, phase, sim.allocated_bytes, sim.reserved_bytes
                    )
                    where = (step, phase)
                    if phase == "backward":
                        backward_starts.append((len(history), step))
                        _mark_activations(
                            sizes, kinds, blocks, mapping, out, step, len(slices) - 1, log
                        )
            event = events[index]
            kind = event[0]
            if kind == "alloc":
                bid = event[1]
                if mapping is None:
                    key = bid
                else:
                    key = mapping.get(bid)
                    if key is None:
                        key = mapping[bid] = _fresh()
                        out.origins[key] = bid
                block_kind = kinds[key] = blocks[bid].kind
                log((_KIND, key, block_kind))
                alloc(key, event[2], where, fallback_of(bid), event[3])
                allocated = sim.allocated_bytes
                reserved = sim.reserved_bytes
                if current is not None:
                    if allocated > current.peak_allocated:
                        current.peak_allocated = allocated
                    if reserved > current.peak_reserved:
                        current.peak_reserved = reserved
                if allocated > out.peak_allocated:
                    out.peak_allocated = allocated
                    out.peak_step = step
                    out.peak_phase = where[1]
                    peak_at = len(history)
                    out.peak_fragmentation = sim.inactive_split_bytes
                    out.peak_requested = sim.requested_bytes
                if reserved > out.peak_reserved:
                    out.peak_reserved = reserved
            elif kind == "free":
                key = event[1] if mapping is None else mapping.get(event[1], event[1])
                free(key)
            elif kind == "empty_cache":
                sim.empty_cache()
        if current is not None:
            current.end_allocated = sim.allocated_bytes
        out.steps[step] = phases
        out.step_bounds[step] = (alloc_before, sim.allocated_bytes)

    for step, start, end in slices:
        run(step, start, end, None)

    # the steady step again, until reserved stops moving
    last_step, start, end = slices[-1]
    carry = _repeatable(trace, start, end) if len(slices) >= 2 else None
    step = last_step
    if carry is not None:
        carry_in, carry_out = carry
        previous_out = list(carry_out)
        while step + 1 < MAX_SIMULATED_STEPS:
            reserved_before = sim.reserved_bytes
            step += 1
            mapping: dict[int, int] = {}
            # carry-in frees of this repeat are the previous repeat's carry-out blocks
            by_size: dict[int, list[int]] = defaultdict(list)
            for b in previous_out:
                by_size[sizes.get(b, -1)].append(b)
            for b in carry_in:
                bucket = by_size.get(blocks[b].size)
                if bucket:
                    mapping[b] = bucket.pop(0)
            run(step, start, end, mapping)
            previous_out = [mapping.get(b, b) for b in carry_out]
            if step + 1 >= MIN_SIMULATED_STEPS and sim.reserved_bytes == reserved_before:
                break
        out.stable = sim.reserved_bytes == reserved_before if step > last_step else True
    out.simulated_steps = step + 1
    if peak_at >= 0:
        saved = _saved_later(history, peak_at, backward_starts, out.peak_step)
        out.peak_live, out.activations = _state_at(history, peak_at, saved)
    out.num_alloc_retries = sim.num_alloc_retries
    out.num_segments = sim.num_segments
    out.reserved_at_end = sim.reserved_bytes
    return out


_FRESH = [1 << 40]
_ALLOC, _FREE, _KIND = 0, 1, 2


def _fresh() -> int:
    _FRESH[0] += 1
    return _FRESH[0]


def _saved_later(
    history: list[tuple[int, int, Any]],
    end: int,
    backward_starts: list[tuple[int, int]],
    step: int | None,
) -> set[int]:
    """The blocks the first backward of ``step`` after the first ``end`` changes found alive
    (made by its forward and saved for it): at a peak inside a forward, what is already
    made and will be saved is an activation, as a measured run's trace labels it."""
    start = next((at for at, s in backward_starts if at >= end and s == step), None)
    saved: set[int] = set()
    if start is None:
        return saved
    for code, key, value in history[start:]:
        if code != _KIND or value != "activation":
            break
        saved.add(key)
    return saved


def _state_at(
    history: list[tuple[int, int, Any]],
    end: int,
    saved: set[int] = frozenset(),  # type: ignore[assignment]
) -> tuple[dict[int, int], dict[int, str]]:
    """The live blocks (block -> size, in allocation order) and their kinds after the first
    ``end`` changes of the replay's history; ``saved``: blocks that are activations there
    though relabelled so only later, where their backward began."""
    live: dict[int, int] = {}
    kind_of: dict[int, str] = {}
    for code, key, value in history[:end]:
        if code == _ALLOC:
            live[key] = value
        elif code == _FREE:
            live.pop(key, None)
        else:
            kind_of[key] = value
    kinds = {k: kind_of.get(k, "temporary") for k in live}
    for key in saved:
        if kinds.get(key) in ("temporary", "data"):
            kinds[key] = "activation"
    return live, kinds


def _open_phase(
    phases: list[PhaseRun], step: int, name: str, allocated: int, reserved: int
) -> PhaseRun:
    run = PhaseRun(step, name, allocated, allocated, allocated, reserved)
    phases.append(run)
    return run


def _mark_activations(
    sizes: dict[int, int],
    kinds: dict[int, str],
    blocks: dict[int, Any],
    mapping: dict[int, int] | None,
    out: Replay,
    step: int,
    last_traced: int,
    log: Any,
) -> None:
    """Where backward begins, what forward made and is still alive is saved for backward."""
    reverse = {v: k for k, v in mapping.items()} if mapping else {}
    for key in sizes:
        if kinds.get(key) in ("temporary", "data"):
            original = reverse.get(key, key)
            meta = blocks.get(original)
            if meta is not None and meta.phase in ("forward", "data"):
                kinds[key] = "activation"
                log((_KIND, key, "activation"))
                if step == last_traced:
                    owner = meta.module or ""
                    out.module_activations[owner] = (
                        out.module_activations.get(owner, 0) + sizes[key]
                    )


# ---- the report --------------------------------------------------------------------------------


def _report(
    spec: str,
    batch_size: int,
    profile: GpuProfile,
    total: int,
    config: AllocatorConfig,
    config_text: str | None,
    trace: Trace,
    result: Replay,
    needs: dict[str, int] | None = None,
    reserved_limit: int | None = None,
) -> Report:
    peak_reserved = max(result.peak_reserved, result.after_build_reserved)
    context = context_bytes(profile, trace)
    # device used is a point (reserved + context) and an upper bound above it: the lazily
    # loaded kernels' pages and, where cuDNN's engine choice moves reserved memory, a share
    # of it (not when the step ran out: its figures are where it stopped, ``needs`` has both)
    allowance = [] if result.oom else device_used_allowance(profile, trace, peak_reserved)
    report = Report(
        kind="estimated",
        vramscope_version=__version__,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        workload={
            "spec": spec,
            "batch_size": batch_size,
            "precision": trace.precision,
            "accumulate": trace.accumulate,
            "allocator_config": config_text,
            "steps": result.simulated_steps,
            "training": trace.training,
            "parameters": trace.parameters,
        },
        device={
            "type": "cuda",
            "name": profile.display_name,
            "profile": profile.name,
            "total_bytes": total,
            "capability": f"{profile.capability[0]}.{profile.capability[1]}",
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "emulated": True,
            "calibrated": profile.calibrated,
        },
        host={"estimated_on": platform.node() or "?", "machine": platform.machine()},
    )
    report.peak = Peak(
        allocated_bytes=result.peak_allocated,
        reserved_bytes=peak_reserved,
        device_used_bytes=peak_reserved + context,
        step=result.peak_step,
        phase=result.peak_phase,
    )
    report.unavailable["peak.host_rss_bytes"] = "an estimate does not run the workload"
    report.startup = Startup(
        context_and_libraries_bytes=context,
        after_build_allocated_bytes=result.after_build_allocated,
        after_build_reserved_bytes=result.after_build_reserved,
    )
    report.steps = _steps(result)
    report.phases = phases_of(report.steps)
    cats = _categories(result)
    report.categories_at_peak = cats
    report.categories_note = (
        "estimated: every allocation of the trace is labelled -- parameters, buffers, "
        "gradients and optimizer state from the objects; activations are what forward made "
        "and backward still needed; temporaries the rest; other the cuBLAS workspaces and "
        f"what build() left on the device. The peak is in the {result.peak_phase} phase of "
        f"step {result.peak_step}"
    )
    report.modules = _modules(trace, result)
    fragmentation = min(result.peak_fragmentation, max(0, peak_reserved - result.peak_allocated))
    rounding = max(0, result.peak_allocated - result.peak_requested)
    rec = Reconciliation(
        moment="peak",
        tensors=cats,
        requested_bytes=result.peak_requested,
        allocated_bytes=result.peak_allocated,
        slack=AllocatorSlack(
            cached_free_bytes=max(0, peak_reserved - result.peak_allocated - fragmentation),
            fragmentation_bytes=fragmentation,
            rounding_bytes=rounding,
        ),
        reserved_bytes=peak_reserved,
        context_and_libraries_bytes=context,
        device_used_bytes=peak_reserved + context,
        other_processes_bytes=0,
        total_bytes=total,
        free_bytes=total - peak_reserved - context,
        note=(
            "estimated: reserved from the caching-allocator simulation (its fragmentation "
            "where allocated peaks), context and libraries from the GPU profile"
            + ("" if profile.calibrated else " (uncalibrated)")
            + (
                "; the upper bound of device used adds "
                + ", ".join(f"{format_bytes(n)} for {label}" for label, n in allowance)
                if allowance
                else ""
            )
        ),
    )
    report.reconciliation = [rec]
    used = peak_reserved + context
    upper = used + sum(n for _, n in allowance)
    fits = not result.oom and used <= total
    headroom = total - used
    report.extra["verdict"] = {
        "fits": fits,
        # the point fits; does the upper bound (cuDNN's engine choice, lazily loaded kernels)?
        "fits_upper": fits and upper <= total,
        "device_used_upper_bytes": None if result.oom else upper,
        "headroom_bytes": headroom,
        "headroom_pct": round(100.0 * headroom / total, 2),
        "total_bytes": total,
        "gpu": profile.name,
        "gpu_name": profile.display_name,
        "device_used_bytes": used,
        "reserved_bytes": peak_reserved,
        "reserved_limit_bytes": reserved_limit,
        "oom_at": (
            {
                "step": result.oom_where[0],
                "phase": result.oom_where[1],
                "request_bytes": result.oom_request,
                "reserved_bytes": result.oom_reserved,
            }
            if result.oom and result.oom_where
            else None
        ),
        # when it does not fit: the peaks of the same steps on a GPU large enough
        "needs": needs,
    }
    report.extra["estimate"] = {
        "gpu": profile.name,
        "calibrated": profile.calibrated,
        "profile_note": profile.note,
        "traced_steps": result.traced_steps,
        "simulated_steps": result.simulated_steps,
        "reserved_stable": result.stable,
        "trace_seconds": round(trace.seconds, 3),
        "build_seconds": trace.build_seconds,
        "step_seconds": trace.step_seconds,
        "events": len(trace.events),
        "sdpa_kernels": trace.sdpa,
        "workspaces_bytes": trace.workspaces,
        "libraries": sorted(trace.libraries),
        "device_used_allowance": {label: n for label, n in allowance},
        "device_used_upper_bytes": None if result.oom else upper,
        "data_dependent": trace.data_dependent,
        "notes": trace.notes,
        "torch_version": torch.__version__,
    }
    report.extra["allocator"] = {
        "config": str(config) or None,
        "num_alloc_retries": result.num_alloc_retries,
        # kernels that ran out of memory for a workspace and ran a variant with less
        "smaller_workspaces": result.fallbacks,
        "segments": result.num_segments,
        "simulated": True,
    }
    add_findings(report)
    _estimate_findings(report, profile, trace, result)
    return report


def _steps(result: Replay) -> list[StepStats]:
    steps: list[StepStats] = []
    for index in sorted(result.steps):
        runs = result.steps[index]
        merged: dict[str, PhaseStats] = {}
        for run in runs:
            stats = merged.get(run.name)
            if stats is None:
                stats = merged[run.name] = PhaseStats(
                    name=run.name,
                    peak_allocated_bytes=run.peak_allocated,
                    peak_reserved_bytes=run.peak_reserved,
                    start_allocated_bytes=run.start_allocated,
                    end_allocated_bytes=run.end_allocated,
                    count=0,
                    step=index,
                )
            stats.count += 1
            stats.peak_allocated_bytes = max(stats.peak_allocated_bytes or 0, run.peak_allocated)
            stats.peak_reserved_bytes = max(stats.peak_reserved_bytes or 0, run.peak_reserved)
            stats.end_allocated_bytes = run.end_allocated
        phases = sorted(
            (p for p in merged.values() if p.name in PHASE_ORDER),
            key=lambda p: PHASE_ORDER.index(p.name),
        )
        start, end = result.step_bounds.get(index, (None, None))
        backwards = next((p.count for p in phases if p.name == "backward"), 0)
        forwards = next((p.count for p in phases if p.name == "forward"), 0)
        steps.append(
            StepStats(
                index=index,
                mode="train" if backwards else "eval",
                micro_batches=backwards or forwards,
                peak_allocated_bytes=max((p.peak_allocated_bytes or 0 for p in phases), default=0),
                peak_reserved_bytes=max((p.peak_reserved_bytes or 0 for p in phases), default=0),
                start_allocated_bytes=start,
                end_allocated_bytes=end,
                phases=phases,
            )
        )
    return steps


def _categories(result: Replay) -> Categories:
    sums: dict[str, int] = defaultdict(int)
    for key, size in result.peak_live.items():
        kind = result.activations.get(key, "temporary")
        sums[_KIND_TO_CATEGORY.get(kind, "temporaries")] += -(-size // 512) * 512
    counted = sum(sums.values())
    # blocks the allocator did not split keep their remainder: allocated, in no tensor
    sums["other"] += max(0, result.peak_allocated - counted)
    return Categories(
        parameters=sums["parameters"],
        buffers=sums["buffers"],
        gradients=sums["gradients"],
        optimizer_state=sums["optimizer_state"],
        activations=sums["activations"],
        temporaries=sums["temporaries"],
        other=sums["other"],
    )


def _modules(trace: Trace, result: Replay, depth: int = 2, limit: int = 40) -> list[dict[str, Any]]:
    """The module tree to ``depth`` (each module with its descendants): what it holds at the
    peak (the same blocks as the categories, so the tree adds up to them) and the
    activations it saves for backward; pre-order, the largest sibling first."""
    rows = {r["name"]: r for r in trace.modules}
    keys = ("parameters_bytes", "buffers_bytes", "gradients_bytes", "optimizer_state_bytes")
    totals: dict[str, dict[str, int]] = {
        name: dict.fromkeys((*keys, "activations_bytes"), 0) for name in rows
    }

    def chain(name: str) -> list[str]:
        parts = name.split(".") if name else []
        return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]

    for key, size in result.peak_live.items():
        column = _KIND_TO_COLUMN.get(result.activations.get(key, ""))
        meta = trace.blocks.get(result.origins.get(key, key))
        if column is None or meta is None:
            continue
        for anc in chain(meta.owner if meta.owner in rows else ""):
            if anc in totals:
                totals[anc][column] += -(-size // 512) * 512
    for name, size in result.module_activations.items():
        for anc in chain(name if name in rows else ""):
            if anc in totals:
                totals[anc]["activations_bytes"] += size
    peak = result.peak_allocated or 1
    children: dict[str, list[str]] = defaultdict(list)
    for name in rows:
        if name:
            children[name.rsplit(".", 1)[0] if "." in name else ""].append(name)
    table: list[dict[str, Any]] = []

    def visit(name: str) -> None:
        if len(table) >= limit or name not in rows:
            return
        acc = totals[name]
        total = sum(acc.values())
        table.append(
            {
                "name": name,
                "class": rows[name]["class"],
                "depth": rows[name]["depth"],
                **acc,
                "total_bytes": total,
                "share_of_peak": round(total / peak, 4),
            }
        )
        if rows[name]["depth"] >= depth:
            return
        for child in sorted(children.get(name, ()), key=lambda c: -sum(totals[c].values())):
            if sum(totals[child].values()):
                visit(child)

    visit("")
    return table


def _estimate_findings(report: Report, profile: GpuProfile, trace: Trace, result: Replay) -> None:
    verdict = report.extra["verdict"]
    report.findings.insert(
        0,
        Finding("verdict", "info" if verdict["fits"] else "error", verdict_sentence(verdict)),
    )
    allowance = report.extra["estimate"].get("device_used_allowance") or {}
    if verdict["fits"] and not verdict.get("fits_upper", True):
        report.findings.append(
            Finding(
                "upper_bound",
                "warning",
                f"the estimate fits, but its upper bound of device used does not: "
                f"{format_bytes(verdict['device_used_upper_bytes'])} of "
                f"{format_bytes(verdict['total_bytes'])}, with "
                + ", ".join(f"{format_bytes(n)} for {label}" for label, n in allowance.items())
                + " (measured over a zoo of models on an H200: within these in 95 % of them); "
                "a smaller batch leaves that room",
                {"device_used_upper_bytes": verdict["device_used_upper_bytes"], **allowance},
            )
        )
    if not profile.calibrated:
        report.findings.append(
            Finding(
                "uncalibrated",
                "info",
                f"the {profile.name} profile is uncalibrated: what it adds to device used for "
                f"the CUDA context and libraries, {_context_words(profile, trace)}, is a guess",
            )
        )
    for item in trace.data_dependent[:5]:
        report.findings.append(
            Finding(
                "data_dependent",
                "info",
                f"data-dependent op, traced with a plausible value: {item}",
            )
        )
    for note in trace.notes[:5]:
        report.findings.append(Finding("estimate_note", "info", note))
