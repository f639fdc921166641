"""Per-epoch and per-phase summaries of a run's steps: pure functions over report data."""

from __future__ import annotations

from vramscope.report.model import EpochStats, PhaseStats, StepStats

PHASE_ORDER = ("data", "zero_grad", "forward", "backward", "optimizer", "other")


def phase_key(name: str) -> tuple[int, str]:
    """Sort key: phases in the order a training step runs them, unknown names last."""
    return (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER), name)


def step_label(step: StepStats) -> str:
    """``12``, or ``12-15`` for an entry that stands for several steps."""
    last = step.last_index
    return f"{step.index}-{last}" if last is not None and last != step.index else str(step.index)


def holds_step(step: StepStats, index: int | None) -> bool:
    """Whether step ``index`` is one of the steps this entry stands for."""
    last = step.last_index if step.last_index is not None else step.index
    return index is not None and step.index <= index <= last


def steps_title(steps: list[StepStats]) -> str:
    """``Steps (8)``, or ``Steps (130, in 45 entries)`` when entries stand for several."""
    total = sum(s.count for s in steps)
    return (
        f"Steps ({total})"
        if total == len(steps)
        else f"Steps ({total:,}, in {len(steps):,} entries)"
    )


def epochs_of(steps: list[StepStats]) -> list[EpochStats]:
    """One row per epoch: its steps, highest peaks, allocated at its end, host RSS, time."""
    epochs: dict[int, EpochStats] = {}
    for step in steps:
        e = epochs.get(step.epoch)
        if e is None:
            e = epochs[step.epoch] = EpochStats(index=step.epoch, first_step=step.index)
        e.steps += step.count
        e.duration_s += step.duration_s
        if step.peak_allocated_bytes is not None:
            e.peak_allocated_bytes = max(e.peak_allocated_bytes or 0, step.peak_allocated_bytes)
        if step.peak_reserved_bytes is not None:
            e.peak_reserved_bytes = max(e.peak_reserved_bytes or 0, step.peak_reserved_bytes)
        if step.host_rss_bytes is not None:
            e.host_rss_bytes = max(e.host_rss_bytes or 0, step.host_rss_bytes)
        e.end_allocated_bytes = step.end_allocated_bytes
    return [epochs[k] for k in sorted(epochs)]


def merge_phase(into: PhaseStats, p: PhaseStats, step: int | None) -> None:
    """Fold occurrence ``p`` of a phase into ``into``: counts and times summed, the highest
    peak kept with where it was (``step``) and the allocated memory around it."""
    into.count += p.count
    into.duration_s += p.duration_s
    if p.peak_allocated_bytes is not None and (
        into.peak_allocated_bytes is None or p.peak_allocated_bytes > into.peak_allocated_bytes
    ):
        into.peak_allocated_bytes = p.peak_allocated_bytes
        into.start_allocated_bytes = p.start_allocated_bytes
        into.end_allocated_bytes = p.end_allocated_bytes
        into.step = step
    if p.peak_reserved_bytes is not None:
        into.peak_reserved_bytes = max(into.peak_reserved_bytes or 0, p.peak_reserved_bytes)


def phases_of(steps: list[StepStats]) -> list[PhaseStats]:
    """Per phase over the run: the highest peak (and its step), total time, occurrences."""
    merged: dict[str, PhaseStats] = {}
    for step in steps:
        for p in step.phases:
            m = merged.get(p.name)
            if m is None:
                m = merged[p.name] = PhaseStats(name=p.name, count=0, step=step.index)
            merge_phase(m, p, step.index)
    return sorted(merged.values(), key=lambda p: phase_key(p.name))
