"""What a tracking Session keeps per step and phase: records, the bounded step history, and
a record's row in the report (no torch: a run's journal is read back with the same code)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from vramscope.report.aggregate import merge_phase, phase_key
from vramscope.report.model import PhaseStats, StepStats
from vramscope.tracking.sampler import max_known


@dataclass(slots=True)
class StepRecord:
    """A step being recorded (mutable); becomes a report StepStats when finished.

    A record can stand for several consecutive steps of a long run (``count``), merged by
    :class:`StepHistory` to keep the history bounded.
    """

    index: int
    epoch: int
    start_s: float
    start_allocated: int | None
    end_s: float | None = None
    end_allocated: int | None = None
    forwards: int = 0
    backwards: int = 0
    saw_optimizer: bool = False
    grad_forward: bool = False
    grads_live_at_start: bool | None = None
    forward_modules: set[int] = field(default_factory=set)
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    count: int = 1
    last_index: int | None = None
    # False: the step read nothing at its phase boundaries (phase_reads.py); the read that
    # closed it gave the highest point of it and the unread steps before it as a whole
    reads: bool = True
    unread_peak_allocated: int | None = None
    unread_peak_reserved: int | None = None
    # an unread step's phases: name -> [occurrences, seconds] (no PhaseStats per step)
    phase_times: dict[str, list[float]] = field(default_factory=dict)


def _fold_phases(into: dict[str, PhaseStats], phases: dict[str, PhaseStats]) -> None:
    for name, p in phases.items():
        m = into.get(name)
        if m is None:
            m = into[name] = PhaseStats(name=name, count=0, step=p.step)
        merge_phase(m, p, p.step)


def _merge_records(a: StepRecord, b: StepRecord) -> StepRecord:
    """One record for two neighbouring ones: highest peaks, summed counts and times."""
    merged = StepRecord(
        index=a.index,
        epoch=a.epoch,
        start_s=a.start_s,
        start_allocated=a.start_allocated,
        grads_live_at_start=a.grads_live_at_start,
        count=0,
    )
    _absorb(merged, a)
    _absorb(merged, b)
    return merged


def add_phase_times(
    phases: dict[str, PhaseStats], times: dict[str, list[float]], step: int
) -> None:
    """Count an unread step's phase occurrences and times into ``phases``."""
    for name, (count, seconds) in times.items():
        stats = phases.get(name)
        if stats is None:
            stats = phases[name] = PhaseStats(name=name, count=0, step=step)
        stats.count += int(count)
        stats.duration_s += seconds


def _absorb(into: StepRecord, record: StepRecord) -> None:
    """Fold ``record`` (the next step) into ``into`` in place: peaks kept, counts summed."""
    _fold_phases(into.phases, record.phases)
    if record.phase_times:
        add_phase_times(into.phases, record.phase_times, record.index)
    into.end_s = record.end_s
    into.end_allocated = record.end_allocated
    into.forwards += record.forwards
    into.backwards += record.backwards
    into.saw_optimizer = into.saw_optimizer or record.saw_optimizer
    into.grad_forward = into.grad_forward or record.grad_forward
    into.count += record.count
    into.last_index = record.last_index if record.last_index is not None else record.index
    into.reads = into.reads and record.reads
    into.unread_peak_allocated = max_known(into.unread_peak_allocated, record.unread_peak_allocated)
    into.unread_peak_reserved = max_known(into.unread_peak_reserved, record.unread_peak_reserved)


class StepHistory:
    """The finished steps of a run, in bounded memory whatever the run's length.

    The first ``head`` steps are kept as they are (warm-up is where memory changes most).
    Later ones are kept one entry per ``stride`` steps of the same epoch, folded together
    with each phase's highest peak, so no peak is lost; when ``capacity`` entries are
    reached, later neighbours are merged pairwise and the stride doubles. A step costs one
    in-place fold; the pairwise merges happen a logarithmic number of times.
    """

    def __init__(self, capacity: int = 2048, head: int = 128) -> None:
        self.capacity = max(capacity, head + 16)
        self.head = head
        self.records: list[StepRecord] = []
        self.total = 0  # steps, merged ones counted one by one
        self.stride = 1
        self._pending: StepRecord | None = None
        # called after each step is stored or folded (the run's journal writes it then)
        self.observer: Callable[[], None] | None = None

    def append(self, record: StepRecord) -> None:
        self._append(record)
        if self.observer is not None:
            self.observer()

    def _append(self, record: StepRecord) -> None:
        self.total += record.count
        if self.stride == 1 or len(self.records) < self.head:
            self._store(record)
            return
        pending = self._pending
        if pending is not None and pending.epoch != record.epoch:
            self._store(pending)
            pending = self._pending = None
        if pending is None:
            self._pending = record
        else:
            _absorb(pending, record)
        if self._pending is not None and self._pending.count >= self.stride:
            self._store(self._pending)
            self._pending = None

    def fold_into_last(self, record: StepRecord, keep: StepRecord | None = None) -> None:
        """Fold ``record`` (a step that read nothing) into the last record kept; a record
        that is ``keep`` (the session holds it for the peak) is replaced by a folded copy."""
        self.total += record.count
        if self._pending is not None:
            if self._pending is keep:
                self._pending = _merge_records(self._pending, record)
            else:
                _absorb(self._pending, record)
        else:
            last = self.records[-1]
            if last is keep:
                self.records[-1] = _merge_records(last, record)
            else:
                _absorb(last, record)
        if self.observer is not None:
            self.observer()

    def _store(self, record: StepRecord) -> None:
        self.records.append(record)
        if len(self.records) >= self.capacity:
            self._merge()

    def _merge(self) -> None:
        kept = self.records[: self.head]
        rest = self.records[self.head :]
        i = 0
        while i < len(rest):
            a = rest[i]
            if i + 1 < len(rest) and rest[i + 1].epoch == a.epoch:
                kept.append(_merge_records(a, rest[i + 1]))
                i += 2
            else:
                kept.append(a)
                i += 1
        self.records = kept
        self.stride *= 2

    def _all(self) -> list[StepRecord]:
        return self.records if self._pending is None else [*self.records, self._pending]

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self.records) + (self._pending is not None)

    def __bool__(self) -> bool:
        return bool(self.records) or self._pending is not None

    @property
    def last(self) -> StepRecord | None:
        if self._pending is not None:
            return self._pending
        return self.records[-1] if self.records else None

    def since(self, index: int) -> list[StepRecord]:
        """The entries that hold step ``index`` or a later one, and the pending one, oldest
        first: what a journal that last wrote when ``index`` was the newest step has not
        seen as it is now (steps folded into the entry that held it, entries stored since,
        and those a merge made of them)."""
        out: list[StepRecord] = []
        for record in reversed(self.records):
            out.append(record)
            if record.index <= index:
                break
        out.reverse()
        if self._pending is not None:
            out.append(self._pending)
        return out


@dataclass(slots=True)
class PhaseRecord:
    name: str
    start_s: float
    start_allocated: int | None
    # the time after an optimizer step ended, read there (see Session.on_optimizer_end): the
    # next step's first phase when a step begins next, else more of the phase ``name``
    tail: bool = False


def window_max(samples: list[Any], index: int, t0: float, t1: float) -> int | None:
    """The highest value of series ``index`` of the samples between ``t0`` and ``t1`` (the
    last one before, when none falls inside)."""
    values = [s[index] for s in samples if t0 <= s[0] <= t1 and s[index] is not None]
    if values:
        return max(values)
    before = [s for s in samples if s[0] <= t1 and s[index] is not None]
    return before[-1][index] if before else None


def step_stats(record: StepRecord, t0: float, samples: list[Any]) -> StepStats:
    """A record's row in the report: times from ``t0`` (the run's start), its phases in
    the order a step runs them, its peaks, and the host RSS sampled while it ran."""
    start = record.start_s - t0
    end = (record.end_s or record.start_s) - t0
    phases = sorted(record.phases.values(), key=lambda p: phase_key(p.name))
    peaks = [p.peak_allocated_bytes for p in phases if p.peak_allocated_bytes is not None]
    reserved = [p.peak_reserved_bytes for p in phases if p.peak_reserved_bytes is not None]
    if record.unread_peak_allocated is not None:  # steps folded in that read nothing
        peaks.append(record.unread_peak_allocated)
    if record.unread_peak_reserved is not None:
        reserved.append(record.unread_peak_reserved)
    return StepStats(
        index=record.index,
        epoch=record.epoch,
        mode="train" if record.backwards else "eval",
        # per step: a record can stand for several steps
        micro_batches=round((record.backwards or record.forwards) / max(1, record.count)),
        peak_allocated_bytes=max(peaks) if peaks else None,
        peak_reserved_bytes=max(reserved) if reserved else None,
        start_allocated_bytes=record.start_allocated,
        end_allocated_bytes=record.end_allocated,
        host_rss_bytes=window_max(samples, 4, start, end),
        duration_s=end - start,
        start_s=start,
        phases=phases,
        count=record.count,
        last_index=record.last_index,
    )
