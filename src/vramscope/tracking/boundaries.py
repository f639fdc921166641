"""Where phases and steps begin and end: what happens at each boundary. The allocator read
there (or, on a step that reads nothing, one log entry), the phase's exact peaks, the step
table (unread steps folded into the entry before them, a long run's entries merged), the
timeline's bands and markers, and the run's peak as the reads find it.

This is the per-step path: every line here runs inside the user's steps, so it touches as few
objects as it can (see docs/tracking.md, measured overhead). :class:`StepBoundaries` is the
Session's base: the Session's hooks decide *where* a boundary is (``_transition``,
``_update_ended``, ``step()``), this class records *what* is there. From the Session it reads
``_running``, ``_t0``, ``_device_index``, ``_attribution`` (the recorder, or None), ``_hooks``,
``_interval_auto``, and calls ``_read_light`` and ``_pace_sampler``.
"""

from __future__ import annotations

import time
from typing import Any

from vramscope.report.model import PhaseStats
from vramscope.sources import allocator
from vramscope.sources.allocator import AllocatorReading
from vramscope.tracking.phase_reads import ReadSchedule
from vramscope.tracking.records import PhaseRecord, StepHistory, StepRecord, add_phase_times
from vramscope.tracking.sampler import max_known

MAX_PHASE_BANDS = 10_000  # timeline bands and markers kept (the first ones)
# unread steps' log entries counted into the records at the latest (a long spacing given
# as --phase-steps N would otherwise keep every entry of N steps)
UNREAD_LOG_LIMIT = 4096
# a rise of the run's peak, over the highest a traced step saw, from which the next step is
# traced again: the larger of these bytes and this share of it. A step that only rounds the
# peak up by a few blocks (the allocator's placement differs from step to step) does not pay
# a trace window, whose snapshot costs about half a millisecond; a leak still gets traced
# once what it added passes the threshold.
PEAK_RISE_TRACED_BYTES = 1 << 20
PEAK_RISE_TRACED_SHARE = 0.005

# at a phase boundary: (allocated now, peak allocated and peak reserved since the last
# boundary, the allocator's nested stats for a full reading when this is a new peak)
_Light = tuple[int, int, int, dict[str, Any]]


class StepBoundaries:
    """The step table and the run's peak, kept at phase and step boundaries."""

    # what the Session provides (see the module's docstring)
    _running: bool
    _t0: float
    _device_index: int | None
    _attribution: Any
    _hooks: Any
    _interval_auto: bool

    def _read_light(self, reset: bool) -> _Light | None:
        raise NotImplementedError

    def _pace_sampler(self) -> None:
        raise NotImplementedError

    def __init__(self) -> None:
        # on CUDA, which steps read the allocator at each phase boundary (phase_reads.py);
        # None: every step (the CPU, or a detail whose markers need every phase)
        self._phase_reads: ReadSchedule | None = None
        self._step_reads = True  # whether the open step reads at its boundaries
        self._boundary_cost = 0.0  # vramscope's time at the open step's boundaries
        self._span_start: int | None = None  # first step of the unread steps now running
        self._span_peak: tuple[int, int] | None = None  # unread steps that held the run's peak
        # the unread steps' phases and step ends, as they happen: (phase, start, end, step)
        # and, where a step ended, its (forwards, backwards, grad_forward) after them;
        # counted into the records by _count_unread when the unread steps end
        self._unread_log: list[tuple[Any, ...]] = []
        # while unread steps fold into the record before them: that record's kind, (no
        # backward, optimizer step), which the next unread step must have to fold too
        self._fold_kind: tuple[bool, bool] | None = None
        # where the open step's last optimizer step ended (time, the read there): what follows
        # is the next step's if one begins before another phase (a zero_grad, a forward, a
        # fetch), else this step's; and an unread step's answer there to whether the next
        # step reads (its read, if it reads, is taken there)
        self._tail: tuple[float, _Light | None] | None = None
        self._ended_by = 0  # id() of the optimizer whose step ended there
        self._next_reads: bool | None = None
        self._steps = StepHistory()
        self._step: StepRecord | None = None
        self._phase: PhaseRecord | None = None
        self._phase_bands: list[tuple[str, int, float, float]] = []
        self._dropped_bands = 0
        self._markers: list[dict[str, Any]] = []
        self._dropped_markers = 0
        self._epoch = 0
        self._force_new_step = False
        # the run's peak, as the reads find it
        self._peak_allocated = -1
        self._peak_reserved = 0
        self._traced_peak = 0  # the run's peak when a trace last saw it (or was asked to)
        self._peak_where: tuple[int | None, str | None] = (None, None)
        self._peak_record: StepRecord | None = None  # the step of the peak, never merged
        self._peak_close: AllocatorReading | None = None  # reading that closed the peak phase
        # peaks of the phase that is open, from before a window() reset its counters
        self._carry_allocated = 0
        self._carry_reserved = 0
        self._window_allocated = -1  # peaks since the last window()
        self._window_reserved = -1

    def _transition(self, name: str, new_step: bool = False) -> None:
        if not self._running:
            return
        now = time.perf_counter()
        step = self._step
        tail, self._tail = self._tail, None
        if tail is not None and step is not None and (new_step or self._force_new_step):
            self._begin_after_update(name, tail)
            return
        decided = None
        if step is not None and not self._step_reads and not self._force_new_step:
            # a step that reads nothing: the few lines a launch-bound step can afford. What
            # it did goes to a log, counted into the records when the unread steps end
            # (_count_unread): each object touched here costs a launch-bound step time
            phase = self._phase
            if not new_step:  # the phase record goes on, renamed
                if phase is None:
                    self._phase = PhaseRecord(name, now, None)
                else:
                    log = self._unread_log
                    log.append((phase.name, phase.start_s, now, step.index))
                    phase.name, phase.start_s, phase.start_allocated = name, now, None
                    if len(log) >= UNREAD_LOG_LIMIT:
                        self._count_unread()
                return
            # it ends; when the next one reads nothing either, it goes on in the same
            # record, folded into the record before it (the schedule is told later)
            folds, decided = self._unread_step_ends(now, step)
            if folds:
                self._fold_unread(step, name, now)
                return
        starting = self._step is None or new_step or self._force_new_step
        light = self._boundary(now, starting, decided)
        self._phase = PhaseRecord(name, now, light[0] if light is not None else None)
        if self._attribution is not None:  # attribution: a phase marker
            self._attribution.on_phase(name)
        if starting and not self._step_reads and light is not None:
            # an unread step begins with the read that closes the read step before it
            self._phase_reads.closing_cost(time.perf_counter() - now)  # type: ignore[union-attr]
        else:
            self._boundary_cost += time.perf_counter() - now

    def _unread_step_ends(self, now: float, step: StepRecord) -> tuple[bool, bool]:
        """An unread step ends (or its last optimizer step did): whether it folds into the
        record before it, and whether the next step reads (asked once: where its optimizer
        step ended, when it had one, see _update_ended)."""
        folds = self._phase is not None and bool(
            (
                self._fold_kind == (not step.backwards, step.saw_optimizer)
                and (step.forwards or step.backwards or step.saw_optimizer)
            )
            or self._can_fold(step)
        )
        schedule = self._phase_reads
        if self._next_reads is not None:
            decided, self._next_reads = self._next_reads, None
        elif folds and schedule.ahead > 0:  # type: ignore[union-attr]
            schedule.ahead -= 1  # type: ignore[union-attr]
            schedule.skipped += 1  # type: ignore[union-attr]
            decided = False
        else:
            decided = schedule.begin(now, 0.0)  # type: ignore[union-attr]
        return folds and not decided, decided

    def _fold_unread(self, step: StepRecord, name: str, now: float) -> None:
        """The unread step ends at ``now``; the next one, unread too, goes on in its record
        (folded into the record before it when the log is counted), from phase ``name``."""
        phase = self._phase
        assert phase is not None
        index = step.index
        log = self._unread_log
        log.append(
            (phase.name, phase.start_s, now, index, step.forwards, step.backwards,
             step.grad_forward)
        )  # fmt: skip
        phase.name, phase.start_s, phase.start_allocated = name, now, None
        if len(log) >= UNREAD_LOG_LIMIT:
            self._count_unread()
        step.index, step.start_s, step.forwards, step.backwards = index + 1, now, 0, 0
        step.saw_optimizer = step.grad_forward = False
        if step.forward_modules:
            step.forward_modules.clear()
        hooks = self._hooks
        if hooks is not None and hooks.discovering:
            hooks.on_step_boundary()

    def _update_ended(self) -> None:
        """An optimizer step ended: read here where the step reads its phases (its last phase
        closes with its exact peak), or where the next step reads, which ends the unread
        steps here. What follows is the next step's if one begins before another phase does
        (_begin_after_update), else more of this one."""
        now = time.perf_counter()
        step, phase = self._step, self._phase
        if step is None or phase is None:
            return
        light = None
        if step.reads:
            light = self._read_light(reset=True)
            self._close_phase(now, light)
            self._phase = PhaseRecord(phase.name, now, light[0] if light else None, tail=True)
            self._boundary_cost += time.perf_counter() - now
        elif self._phase_reads is not None and self._device_index is not None:
            self._next_reads = self._unread_step_ends(now, step)[1]
            if self._next_reads and (light := self._read_light(reset=True)) is not None:
                self._peak_without_phase(light, step)
        self._tail = (now, light)
        if self._attribution is not None:  # attribution: a step may begin here
            self._attribution.on_update_end()

    def _begin_after_update(self, name: str, tail: tuple[float, _Light | None]) -> None:
        """A step begins (its first phase ``name``) after the open step's last optimizer
        step: it began where that ended, and what came since (zeroing the gradients, the
        next batch) is its own. The read taken there closed the open step."""
        t, light = tail
        step, phase = self._step, self._phase
        assert step is not None and phase is not None
        if step.reads:
            next_reads = True
            schedule = self._phase_reads
            if schedule is not None and self._device_index is not None:
                next_reads = schedule.begin(t, self._boundary_cost, self._force_new_step)
                self._boundary_cost = 0.0
        else:
            folds, next_reads = self._unread_step_ends(t, step)
            if folds:
                self._fold_unread(step, name, t)
                return
            self._count_unread()
            self._time_unread(step, phase.name, phase.start_s, t, step.index)
        self._phase = None
        self._finish_step(t, light)
        self._begin_step(t, light, next_reads)
        self._phase = PhaseRecord(name, t, light[0] if light is not None else None)
        if self._attribution is not None:
            self._attribution.on_phase(name)

    def _can_fold(self, step: StepRecord) -> bool:
        """Whether the open step, which read nothing, can be folded into the record before
        it (``_same_kind`` written out); if so, later unread steps of its kind fold without
        asking until the log is counted."""
        last, peak = self._steps.last, self._peak_record
        if (
            last is None
            or last is peak
            or step is peak
            or not (step.forwards or step.backwards or step.saw_optimizer)
            or last.epoch != step.epoch
            or (not last.backwards) != (not step.backwards)
            or last.saw_optimizer != step.saw_optimizer
        ):
            return False
        self._fold_kind = (not step.backwards, step.saw_optimizer)
        return True

    def _count_unread(self) -> None:
        """Count the log of the unread steps into the records: each phase's occurrence and
        time into the open record, its band into the timeline, and each step that ended into
        the record before the open one, with its step marker."""
        self._fold_kind = None
        log = self._unread_log
        if not log:
            return
        step, last = self._step, self._steps.last
        t0, markers = self._t0, self._markers
        for entry in log:
            end, index = entry[2], entry[3]
            if step is not None:
                self._time_unread(step, entry[0], entry[1], end, index)
            if len(entry) == 4 or last is None:
                continue
            last.count += 1
            last.forwards += entry[4]
            last.backwards += entry[5]
            if entry[6]:
                last.grad_forward = True
            last.last_index = index
            last.end_s = end
            last.reads = False
            self._steps.total += 1
            if len(markers) < MAX_PHASE_BANDS:
                markers.append({"kind": "step", "index": index + 1, "t": end - t0})
            else:
                self._dropped_markers += 1
        log.clear()

    def _boundary(self, now: float, starting: bool, decided: bool | None = None) -> _Light | None:
        """Close the open phase (and, ``starting``, the step); the allocator is read where
        the open step reads, or the next one will (its first boundary closes what came
        before it). ``decided``: whether the next step reads, when already asked."""
        self._count_unread()
        reads = self._step_reads
        next_reads = True
        schedule = self._phase_reads
        if starting and schedule is not None and self._device_index is not None:
            force = self._force_new_step or self._step is None
            if decided is None and self._next_reads is not None:  # asked where the update ended
                decided, self._next_reads = self._next_reads or force, None
            if decided is None:
                decided = schedule.begin(now, self._boundary_cost, force)
            next_reads = decided
            self._boundary_cost = 0.0
            reads = reads or next_reads
        light = self._read_light(reset=True) if reads or self._step is None else None
        self._close_phase(now, light)
        if starting:
            self._finish_step(now, light)
            self._begin_step(now, light, next_reads)
        return light

    def _close_phase(self, now: float, light: _Light | None) -> None:
        phase, step = self._phase, self._step
        self._phase = None
        if phase is None or step is None:
            if light is not None:  # before the first phase: still part of the run's peak
                self._peak_without_phase(light, None)
            return
        name = phase.name
        if step.reads:
            self._close_read_phase(step, phase, now, light)
        else:
            if light is not None:  # the read that ends the unread steps
                self._peak_without_phase(light, step)
            self._time_unread(step, name, phase.start_s, now, step.index)
            return
        self._band(name, step.index, phase.start_s, now)

    def _time_unread(
        self, step: StepRecord, name: str, start: float, end: float, index: int
    ) -> None:
        """A phase of an unread step (``index``) ended: its occurrence and time into the
        open record ``step``, no PhaseStats, and its band."""
        times = step.phase_times.get(name)
        if times is None:
            step.phase_times[name] = [1, end - start]
        else:
            times[0] += 1
            times[1] += end - start
        self._band(name, index, start, end)

    def _band(self, name: str, step: int, start: float, end: float) -> None:
        if len(self._phase_bands) < MAX_PHASE_BANDS:
            self._phase_bands.append((name, step, start - self._t0, end - self._t0))
        else:
            self._dropped_bands += 1

    def _close_read_phase(
        self, step: StepRecord, phase: PhaseRecord, now: float, light: _Light | None
    ) -> None:
        """A phase of a step that reads: its occurrence, time and exact peaks."""
        name = phase.name
        stats = step.phases.get(name)
        if stats is None:
            stats = step.phases[name] = PhaseStats(
                name=name,
                start_allocated_bytes=phase.start_allocated,
                count=0,
                step=step.index,
            )
        if not phase.tail:  # the time after an update: more of the phase before it
            stats.count += 1
        stats.duration_s += now - phase.start_s
        if light is not None:
            peak_allocated, peak_reserved = self._peaks(light)
            if stats.peak_allocated_bytes is None or peak_allocated > stats.peak_allocated_bytes:
                stats.peak_allocated_bytes = peak_allocated
            if stats.peak_reserved_bytes is None or peak_reserved > stats.peak_reserved_bytes:
                stats.peak_reserved_bytes = peak_reserved
            stats.end_allocated_bytes = light[0]
            if peak_allocated > self._peak_allocated or (
                # the same peak again in the same phase of a later step: the steady state's
                # (the first step has no optimizer state yet), so categories describe it
                peak_allocated == self._peak_allocated
                and step is not self._peak_record
                and name == self._peak_where[1]
            ):
                self._set_peak(peak_allocated, light[3], step, name)

    def _peaks(self, light: _Light) -> tuple[int, int]:
        """A read's peaks allocated and reserved, with the open phase's from before a
        ``window()`` reset the counters; counted into ``window()`` and the run's reserved."""
        peak_allocated, peak_reserved = light[1], light[2]
        if self._carry_allocated or self._carry_reserved:
            peak_allocated = max(peak_allocated, self._carry_allocated)
            peak_reserved = max(peak_reserved, self._carry_reserved)
            self._carry_allocated = self._carry_reserved = 0
        if peak_allocated > self._window_allocated:
            self._window_allocated = peak_allocated
        if peak_reserved > self._window_reserved:
            self._window_reserved = peak_reserved
        if peak_reserved > self._peak_reserved:
            self._peak_reserved = peak_reserved
        return peak_allocated, peak_reserved

    def _set_peak(
        self, peak: int, raw: dict[str, Any], step: StepRecord | None, name: str | None
    ) -> None:
        """The run's peak is ``peak``, in phase ``name`` of ``step`` (None: not read)."""
        if peak > self._peak_allocated:
            self._trace_next_step(peak)
        self._peak_allocated = peak
        self._peak_close = allocator.reading_from_stats(raw)
        self._peak_where = (step.index if step is not None else None, name)
        self._peak_record = step

    def _peak_without_phase(self, light: _Light, step: StepRecord | None) -> None:
        """A read whose peak no phase owns: before the first phase (``step`` None), or the
        whole of the unread steps that end with ``step`` (see phase_reads.py)."""
        peak_allocated, peak_reserved = self._peaks(light)
        if step is not None:
            step.unread_peak_allocated = max(step.unread_peak_allocated or 0, peak_allocated)
            step.unread_peak_reserved = max(step.unread_peak_reserved or 0, peak_reserved)
        if peak_allocated > self._peak_allocated:
            self._set_peak(peak_allocated, light[3], step, None)
            if step is not None:
                first = self._span_start if self._span_start is not None else step.index
                self._span_peak = (first, step.index)
                if self._phase_reads is not None:  # read it phase by phase if it comes again
                    self._phase_reads.again()

    def _trace_next_step(self, peak: int) -> None:
        """The run's peak rose to ``peak``: where the allocator's trace did not record it,
        and by more than a few blocks over what a trace saw (``PEAK_RISE_TRACED_*``), trace
        the next step, which reads its phases (steps repeat: its peak is where the trace
        sees it)."""
        attribution = self._attribution
        if attribution is None:
            return
        if attribution.recording:
            self._traced_peak = max(self._traced_peak, peak)
            return
        rise = max(PEAK_RISE_TRACED_BYTES, PEAK_RISE_TRACED_SHARE * self._traced_peak)
        if peak - self._traced_peak <= rise:
            return
        self._traced_peak = peak
        attribution.schedule.mark_next()
        if self._phase_reads is not None:
            self._phase_reads.again(1)

    def _finish_step(self, now: float, light: _Light | None) -> None:
        step = self._step
        if step is None:
            return
        step.end_s = now
        step.end_allocated = light[0] if light is not None else None
        self._step = None
        step.forward_modules.clear()  # needed only while the step is open
        last = self._steps.last
        # one read gives the highest point of all the unread steps since the read before:
        # they all stand in one entry (the one the first of them went into), whatever their
        # kind, so that every entry's peak is exact for every step it stands for
        in_span = (
            not step.reads
            and last is not None
            and self._span_start is not None
            and step.index > self._span_start
            and (last.last_index if last.last_index is not None else last.index) >= self._span_start
        )
        if (
            step.forwards == 0
            and step.backwards == 0
            and not step.saw_optimizer
            and step is not self._peak_record
        ):
            if in_span and step.unread_peak_allocated is not None:  # its read is the span's
                last.unread_peak_allocated = max_known(  # type: ignore[union-attr]
                    last.unread_peak_allocated,  # type: ignore[union-attr]
                    step.unread_peak_allocated,
                )
                last.unread_peak_reserved = max_known(  # type: ignore[union-attr]
                    last.unread_peak_reserved,  # type: ignore[union-attr]
                    step.unread_peak_reserved,
                )
            if self._attribution is not None:
                self._attribution.schedule.forget(step.index)
            if self._phase_reads is not None and self._device_index is not None:
                self._phase_reads.forget(step.reads)
            return  # only data loading (the loader's last, empty fetch) or nothing
        if not step.reads and last is not None and (in_span or _same_kind(last, step)):
            if not _same_kind(last, step) and self._phase_reads is not None:
                self._phase_reads.again(1)  # another kind: the next entry starts at a read
            self._steps.fold_into_last(step, keep=self._peak_record)
        else:
            if not step.reads:  # of another kind than the entry before: an entry of its own
                if self._phase_reads is not None:  # and a read soon (the next step's was
                    self._phase_reads.again(1)  # decided before this one closed)
                add_phase_times(step.phases, step.phase_times, step.index)
                step.phase_times = {}
            self._steps.append(step)
        if step.forwards and self._hooks is not None:
            self._hooks.on_step_boundary()

    def _begin_step(self, now: float, light: _Light | None, reads: bool = True) -> None:
        self._force_new_step = False
        index = 0
        last = self._steps.last
        if last is not None:
            index = (last.last_index if last.last_index is not None else last.index) + 1
        if not reads and self._step_reads:
            self._span_start = index
            if self._phase_reads is not None and self._phase_reads.first_unread is None:
                self._phase_reads.first_unread = index
        self._step_reads = reads
        if self._interval_auto:
            self._pace_sampler()
        self._step = StepRecord(
            index=index,
            epoch=self._epoch,
            start_s=now,
            start_allocated=light[0] if light is not None and reads else None,
            reads=reads,
        )
        self._marker({"kind": "step", "index": index, "t": now - self._t0})
        if self._attribution is not None:  # attribution: a step marker
            self._attribution.on_step(index, reads)

    def _marker(self, marker: dict[str, Any]) -> None:
        if self._unread_log:  # in the order of their times
            self._count_unread()
        if len(self._markers) < MAX_PHASE_BANDS:
            self._markers.append(marker)
        else:
            self._dropped_markers += 1

    def _new_epoch(self) -> None:
        self._epoch += 1
        self._force_new_step = True
        self._marker({"kind": "epoch", "index": self._epoch, "t": time.perf_counter() - self._t0})


def _same_kind(record: StepRecord, step: StepRecord) -> bool:
    """Whether an unread step can be folded into the record before it: same epoch, and a
    training step with a training step (an evaluation with an evaluation)."""
    return (
        record.epoch == step.epoch
        and bool(record.backwards) == bool(step.backwards)
        and record.saw_optimizer == step.saw_optimizer
    )
