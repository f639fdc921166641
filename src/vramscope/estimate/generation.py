"""``model.generate()`` in an estimate: run to its full length, its KV cache labelled, and its
decoding steps traced until they repeat.

**Full length.** Under fake tensors the generated tokens have no values: whether one is the
end-of-sequence token (transformers' ``EosTokenCriteria``), completes a stop string or meets a
user's own criterion cannot be known, and a time limit (``MaxTimeCriteria``) would measure the
trace, not the GPU. The memory a call can take is that of its longest run, so only the length
criterion (``MaxLengthCriteria``: ``max_new_tokens``/``max_length``) is kept; its answer
compares lengths, which the trace knows, and the decoding loop runs every step. generate()'s
own ``torch.compile`` of the decoding step (with a static cache) is not traced: the step runs
eagerly.

**The KV cache.** After every forward, the tensors of the cache generate() carries
(``DynamicCache``, ``StaticCache``, an encoder-decoder's two caches) are labelled
:data:`KV_CACHE`.

**Decoding steps until they repeat.** Each decoding step runs the whole model for one token,
so tracing 512 of them through a 22-layer model takes minutes. But the steps repeat: every
step makes the same allocations in the same order as the step ``p`` before it, each a fixed
number of bytes larger (the dynamic cache's ``torch.cat`` adds a token a layer; a static cache
adds nothing), and frees the blocks of the same steps back. ``p`` is 1 unless a kernel pads a
length (memory-efficient attention pads a mask to a multiple of 16 elements: then ``p`` is
16). After each step the trace looks for the smallest such ``p`` over at least
:data:`MIN_WINDOW` steps and three repetitions; once found, it runs until the last traced
step falls on the same place in the pattern as the last real one, stops the loop there, and
writes the events of the steps it skipped: each allocation at its size in that step, each free
of the block the same steps back. The last traced step then stands for the last real one (its
sizes grown to that step), and what follows the loop frees the blocks it would have freed.
Steps that never repeat are traced to the end.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vramscope.estimate.recorder import BlockMeta, Recorder, Trace
from vramscope.estimate.transformers_eager import eager_transformers

NOTE = (
    "generate(): stopping on the end-of-sequence token, stop strings or time is off in an "
    "estimate (the tokens have no values); every sequence runs to max_new_tokens, the most "
    "memory the call can take"
)
COMPILE_NOTE = (
    "generate(): its torch.compile of the decoding step (static cache) is not traced; the "
    "step is estimated as it runs eagerly"
)
KV_CACHE = "kv_cache"
PERIODS = (1, 2, 4, 8, 16)  # repeats looked for, in steps
REPEATS = 3  # a pattern of p steps must be seen this many times running
# steps compared at least: kernels pad lengths to multiples of up to 16 elements, so a
# pattern seen over fewer steps could break at the next multiple
MIN_WINDOW = 17

_ALLOC, _FREE = "alloc", "free"


@dataclass
class _Step:
    """One traced decoding step (from one criteria call to the next): its allocations and
    its events, each named by position: ("a", k) its k-th allocation, ("f", back, k) the free
    of the k-th allocation of the step ``back`` steps before, ("x",) anything else (a block
    from before the decoding steps, an in-place sum, an emptied cache)."""

    start: int
    end: int
    allocs: list[int]
    shape: tuple[tuple[Any, ...], ...]
    sizes: list[int]  # of each allocation
    plain: bool  # no ("x",) event
    streams: list[int] = field(default_factory=list)  # the CUDA stream of each allocation


@dataclass
class GenerateCall:
    """One generate() call of the trace: its decoding steps and, once they repeat, how."""

    calls: list[int] = field(default_factory=list)  # event index at each criteria call
    total_calls: int = 0  # the calls (new tokens) the real loop makes
    steps: list[_Step] = field(default_factory=list)
    where: dict[int, tuple[int, int]] = field(default_factory=dict)  # block -> (step, k)
    period: int | None = None
    cut_short: bool = False


class GenerationTracer:
    """While tracing: generate() to its full length, the KV cache labelled, the loop cut
    short once its steps repeat; afterwards, :meth:`expanded` writes the steps it skipped."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.generate_calls: list[GenerateCall] = []

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """transformers as on the GPU (:mod:`~vramscope.estimate.transformers_eager`), and
        generate()'s stopping criteria, auto-compilation and kwargs update patched. Nothing
        happens to generate() when the build did not import it."""
        utils = sys.modules.get("transformers.generation.utils")
        mixin = getattr(utils, "GenerationMixin", None)
        names = ("_get_stopping_criteria", "_update_model_kwargs_for_generation")
        originals = {n: mixin.__dict__.get(n) for n in names} if mixin is not None else {}
        if mixin is None or any(v is None for v in originals.values()):
            with eager_transformers():
                yield
            return
        compile_check = mixin.__dict__.get("_valid_auto_compile_criteria")
        mixin._get_stopping_criteria = self._criteria(originals["_get_stopping_criteria"])
        mixin._update_model_kwargs_for_generation = self._label_cache(
            originals["_update_model_kwargs_for_generation"]
        )
        if compile_check is not None:
            mixin._valid_auto_compile_criteria = self._no_compile(compile_check)
        try:
            with eager_transformers():
                yield
        finally:
            for name, original in originals.items():
                setattr(mixin, name, original)
            if compile_check is not None:
                mixin._valid_auto_compile_criteria = compile_check

    # ---- the patches ------------------------------------------------------------------------
    def _criteria(self, original: Any) -> Any:
        from transformers.generation.stopping_criteria import MaxLengthCriteria

        tracer = self

        def length_only(model: Any, *args: Any, **kwargs: Any) -> Any:
            criteria = original(model, *args, **kwargs)
            kept = [c for c in criteria if isinstance(c, MaxLengthCriteria)]
            if len(kept) != len(criteria):
                tracer.recorder.notes.append(NOTE)
            call = GenerateCall()
            tracer.generate_calls.append(call)
            # the tracer on the class, so that a deep copy of the list leaves it alone
            counted = type(
                "CountedCriteria",
                (type(criteria),),
                {"__call__": _counted_call, "vramscope": (tracer, call)},
            )
            return counted(kept)

        return length_only

    def _label_cache(self, original: Any) -> Any:
        recorder = self.recorder

        def update(model: Any, outputs: Any, model_kwargs: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(model, outputs, model_kwargs, *args, **kwargs)
            found = result if isinstance(result, dict) else model_kwargs
            for key in ("cache", "past_key_values"):
                cache = found.get(key) if isinstance(found, dict) else None
                if cache is not None:
                    for tensor in _cache_tensors(cache):
                        recorder.retag(tensor.untyped_storage(), KV_CACHE)
            return result

        return update

    def _no_compile(self, original: Any) -> Any:
        recorder = self.recorder

        def valid(model: Any, *args: Any, **kwargs: Any) -> bool:
            if original(model, *args, **kwargs):
                recorder.notes.append(COMPILE_NOTE)
            return False

        return valid

    # ---- writing the skipped steps -----------------------------------------------------------
    def expanded(self, trace: Trace) -> Trace:
        """``trace`` with the decoding steps each cut-short generate() skipped written in."""
        cut = [c for c in self.generate_calls if c.cut_short]
        for call in sorted(cut, key=lambda c: c.calls[0], reverse=True):
            # the latest first: the event indices of earlier calls stay where they are
            _expand(trace, call)
        for call in cut:
            note = (
                f"generate(): {len(call.steps)} of {call.total_calls - 1} decoding steps "
                f"traced, the others written from them (they repeat every {call.period} "
                f"step{'s' if call.period != 1 else ''})"
            )
            if note not in trace.notes:
                trace.notes.append(note)
        return trace


def _counted_call(self: Any, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> Any:
    """A stopping-criteria call: the decoding step since the last call is recorded, and
    once the steps repeat and the last traced step lines up with the last real one, the
    length criterion is told that the current length is the longest: generate() stops."""
    from transformers.generation.stopping_criteria import MaxLengthCriteria

    tracer, call = self.vramscope
    events = tracer.recorder.events
    limits = [c for c in self if isinstance(c, MaxLengthCriteria)]
    length = int(input_ids.shape[-1])
    if call.calls:
        _record_step(call, tracer.recorder, call.calls[-1], len(events))
    elif limits:
        call.total_calls = max(1, min(c.max_length for c in limits) - length + 1)
    call.calls.append(len(events))
    if not _time_to_cut(call):
        return super(type(self), self).__call__(input_ids, scores, **kwargs)
    call.cut_short = True
    saved = [c.max_length for c in limits]
    try:
        for c in limits:
            c.max_length = length
        return super(type(self), self).__call__(input_ids, scores, **kwargs)
    finally:
        for c, value in zip(limits, saved, strict=True):
            c.max_length = value


def _record_step(call: GenerateCall, recorder: Recorder, start: int, end: int) -> None:
    events = recorder.events
    number = len(call.steps)
    allocs: list[int] = []
    streams: list[int] = []
    shape: list[tuple[Any, ...]] = []
    plain = True
    for event in events[start:end]:
        if event[0] == _ALLOC:
            call.where[event[1]] = (number, len(allocs))
            shape.append(("a", len(allocs)))
            allocs.append(event[1])
            streams.append(event[3] if len(event) > 3 else 0)
        elif event[0] == _FREE and event[1] in call.where:
            step, k = call.where[event[1]]
            shape.append(("f", number - step, k))
        else:
            shape.append(("x",))
            plain = False
    sizes = [recorder.blocks[b].size for b in allocs]
    call.steps.append(_Step(start, end, allocs, tuple(shape), sizes, plain, streams))


def _time_to_cut(call: GenerateCall) -> bool:
    """Whether the loop can stop here: its steps repeat (:func:`_period`), and as many real
    steps are left to write as make whole repetitions (the last traced step and the last real
    one then fall on the same place in the pattern)."""
    if call.cut_short or call.total_calls <= len(call.calls) + 1:
        return False
    if call.period is None:
        call.period = _period(call)
        if call.period is None:
            return False
    real_steps = call.total_calls - 1
    return (real_steps - len(call.steps)) % call.period == 0


def _period(call: GenerateCall) -> int | None:
    """The smallest p of :data:`PERIODS` such that, over the last max(``REPEATS`` × p,
    :data:`MIN_WINDOW`) steps (the first step, which frees the prompt's blocks, never among
    them), every step has the shape of the step p before it, its sizes grow by the same bytes
    as that step's did, and every block is freed by a later step or is among the last
    blocks still in use."""
    steps = call.steps
    for p in PERIODS:
        window = max(REPEATS * p, MIN_WINDOW)
        if len(steps) - 1 < window:
            return None  # longer periods need longer windows still
        recent = steps[-window:]
        if not all(s.plain for s in recent):
            continue
        if any(recent[i].shape != recent[i - p].shape for i in range(p, window)):
            continue
        sizes = [s.sizes for s in recent]
        if any(
            [b - a for a, b in zip(sizes[i - p], sizes[i], strict=True)]
            != [b - a for a, b in zip(sizes[i - 2 * p], sizes[i - p], strict=True)]
            for i in range(2 * p, window)
        ):
            continue
        if _outlives_steps(recent, p):
            continue
        return p
    return None


def _outlives_steps(recent: list[_Step], p: int) -> bool:
    """Whether some block of the older steps of the window is never freed by a later step
    (it would pile up, one a step: not a pattern the written steps can keep)."""
    freed: set[tuple[int, int]] = set()
    for i, step in enumerate(recent):
        for entry in step.shape:
            if entry[0] == "f":
                freed.add((i - entry[1], entry[2]))
    longest = max((e[1] for s in recent for e in s.shape if e[0] == "f"), default=0)
    for i, step in enumerate(recent[: len(recent) - max(longest, p)]):
        for k in range(len(step.allocs)):
            if (i, k) not in freed:
                return True
    return False


def _cache_tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors a transformers cache object holds (its layers' keys and values)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _cache_tensors(v, depth)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _cache_tensors(v, depth)
    elif depth < 3 and type(value).__module__.startswith("transformers"):
        for v in vars(value).values():
            yield from _cache_tensors(v, depth + 1)


# ---- the expansion ------------------------------------------------------------------------------


def _resized(model: BlockMeta, size: int) -> BlockMeta:
    """``model``'s metadata for a block of ``size`` bytes (``dataclasses.replace`` without its
    checks: it runs once per written allocation)."""
    block = object.__new__(type(model))
    block.__dict__.update(model.__dict__)
    block.size = size
    return block


def _expand(trace: Trace, call: GenerateCall) -> None:
    """Write the real steps the cut-short call skipped into ``trace``.

    The traced steps are 0..n-1, the real ones 0..m-1; traced steps 0..n-2 are real steps
    0..n-2, steps n-1..m-2 are written, each from the traced step of the last repetition at
    the same place in the pattern, and the last traced step becomes real step m-1 (m - n is
    a multiple of the period, so it is at the same place)."""
    p = call.period or 1
    steps = call.steps
    blocks = trace.blocks
    n = len(steps)
    m = call.total_calls - 1
    shift = m - n
    if shift <= 0:
        return
    sizes = [s.sizes for s in steps]
    # the growth of each allocation over one repetition, by place in the pattern
    growth = {
        t: [b - a for a, b in zip(sizes[t - p], sizes[t], strict=True)] for t in range(n - p, n)
    }

    def template(r: int) -> int:
        return (n - p) + (r - (n - p)) % p

    # the block ids of each real step's allocations, in order (the written steps' are new);
    # hundreds of thousands of events for a long generation: kept to plain lists and tuples
    ids: dict[int, list[int]] = {r: steps[r].allocs for r in range(n - 1)}
    last = steps[-1]
    ids[m - 1] = last.allocs
    next_id = max(blocks) + 1
    fallbacks = trace.fallbacks
    written: list[tuple[Any, ...]] = []
    write = written.append
    for r in range(n - 1, m - 1):
        t = template(r)
        times = (r - t) // p
        source = steps[t]
        source_allocs, streams, grows = source.allocs, source.streams, growth[t]
        mine: list[int] = []
        ids[r] = mine
        for entry in source.shape:
            if entry[0] == "a":
                k = entry[1]
                model = blocks[source_allocs[k]]
                grown = model.size + times * grows[k]
                blocks[next_id] = _resized(model, grown)
                if source_allocs[k] in fallbacks:
                    fallbacks[next_id] = fallbacks[source_allocs[k]]
                mine.append(next_id)
                write((_ALLOC, next_id, grown, streams[k]))
                next_id += 1
            else:
                write((_FREE, ids[r - entry[1]][entry[2]]))
    # the last traced step is real step m-1: its sizes grown, and what it and everything
    # after it frees of the steps before it, the real steps' blocks
    rename: dict[int, int] = {}
    longest = max((e[1] for s in steps for e in s.shape if e[0] == "f"), default=0)
    for r in range(max(0, n - 1 - max(longest, p)), n - 1):
        real = ids.get(r + shift)
        if real is not None:
            for k, bid in enumerate(steps[r].allocs):
                if k < len(real):
                    rename[bid] = real[k]
    times = shift // p
    for k, bid in enumerate(last.allocs):
        blocks[bid].size += times * growth[n - 1][k]
    events = trace.events
    for i in range(last.start, len(events)):
        event = events[i]
        if event[0] == _ALLOC and i < last.end:
            events[i] = (_ALLOC, event[1], blocks[event[1]].size, *event[3:])
        elif event[0] == _FREE and event[1] in rename:
            events[i] = (_FREE, rename[event[1]])
    insert_at = last.start
    events[insert_at:insert_at] = written
    count = len(written)
    trace.marks[:] = [(i + count if i >= insert_at else i, s, ph) for i, s, ph in trace.marks]
    trace.step_starts[:] = [i + count if i >= insert_at else i for i in trace.step_starts]
    if trace.setup_end >= insert_at:
        trace.setup_end += count
    if trace.build_end >= insert_at:
        trace.build_end += count
