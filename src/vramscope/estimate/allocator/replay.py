"""Replaying a sequence of allocation events through the simulator, and turning a real
allocator trace (``torch.cuda.memory._snapshot()``) into such events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramscope.errors import VramscopeError
from vramscope.estimate.allocator.config import LARGE_BUFFER, SMALL_BUFFER, AllocatorConfig
from vramscope.estimate.allocator.simulator import (
    _DEFAULT_DEVICE_TOTAL,
    CachingAllocatorSim,
    SegmentInfo,
    SimulatedOOM,
)

# --------------------------------------------------------------------------------------------
# Replaying a sequence of events


@dataclass
class ReplayResult:
    """What :func:`replay` ends with.  Byte counts are those at the end; peaks over the run."""

    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    requested_bytes: int
    inactive_split_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_alloc_retries: int
    num_ooms: int
    num_segments: int
    num_events: int
    oom_event_index: int | None = None  # index of the first event that ran out of memory
    stats: dict[str, int] = field(default_factory=dict)
    checkpoints: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    segment_log: list[tuple[str, int, int, int]] = field(default_factory=list)
    alloc_addresses: list[int | None] | None = None  # per alloc event; None where it ran out
    segments: list[SegmentInfo] = field(default_factory=list)

    @property
    def oom(self) -> bool:
        return self.num_ooms > 0


def replay(
    events: Iterable[Sequence[Any]],
    config: AllocatorConfig | str | None = None,
    total_bytes: int | None = None,
    *,
    allowed_bytes: int | None = None,
    device_total_bytes: int | None = None,
    segment_addresses: Iterable[int] | None = None,
    on_oom: str = "raise",
    record_addresses: bool = False,
) -> ReplayResult:
    """Replay events through a fresh :class:`CachingAllocatorSim`.

    Events are tuples: ``("alloc", id, size[, stream])``, ``("free", id)``, ``("empty_cache",)``,
    and also ``("checkpoint", name)`` (records ``memory_stats()``), ``("reset_peak",)`` and
    ``("set_allowed", bytes_or_None)``.  ``id`` is any hashable the caller chooses.

    ``on_oom``: ``"raise"`` lets :class:`SimulatedOOM` out; ``"stop"`` ends the replay at the
    first out-of-memory and returns; ``"continue"`` counts it and goes on (the block is never
    allocated; its free, if any, is skipped).
    """
    if on_oom not in ("raise", "stop", "continue"):
        raise VramscopeError(f"on_oom is raise, stop or continue, got {on_oom!r}")
    sim = CachingAllocatorSim(
        config,
        total_bytes,
        allowed_bytes=allowed_bytes,
        device_total_bytes=device_total_bytes,
        segment_addresses=segment_addresses,
    )
    live: dict[Any, int] = {}
    failed: set[Any] = set()
    checkpoints: list[tuple[str, dict[str, int]]] = []
    addresses: list[int | None] | None = [] if record_addresses else None
    oom_at: int | None = None
    malloc = sim.malloc
    free = sim.free
    index = -1
    for index, event in enumerate(events):
        kind = event[0]
        if kind == "alloc":
            stream = event[3] if len(event) > 3 else 0
            try:
                bid = malloc(event[2], stream)
            except SimulatedOOM:
                if oom_at is None:
                    oom_at = index
                if addresses is not None:
                    addresses.append(None)
                if on_oom == "raise":
                    raise
                if on_oom == "stop":
                    break
                failed.add(event[1])
                continue
            live[event[1]] = bid
            if addresses is not None:
                addresses.append(sim._active[bid].addr if bid in sim._active else None)
        elif kind == "free":
            bid = live.pop(event[1], None)
            if bid is None:
                if event[1] in failed:
                    failed.discard(event[1])
                    continue
                raise VramscopeError(f"event {index}: free of id {event[1]!r}, which is not live")
            free(bid)
        elif kind == "empty_cache":
            sim.empty_cache()
        elif kind == "checkpoint":
            checkpoints.append((str(event[1]), sim.memory_stats()))
        elif kind == "reset_peak":
            sim.reset_peak_stats()
        elif kind == "set_allowed":
            sim.set_allowed_bytes(event[1])
        else:
            raise VramscopeError(f"event {index}: unknown event kind {kind!r}")
    return ReplayResult(
        allocated_bytes=sim.allocated_bytes,
        reserved_bytes=sim.reserved_bytes,
        active_bytes=sim.active_bytes,
        requested_bytes=sim.requested_bytes,
        inactive_split_bytes=sim.inactive_split_bytes,
        peak_allocated_bytes=sim.peak_allocated_bytes,
        peak_reserved_bytes=sim.peak_reserved_bytes,
        num_alloc_retries=sim.num_alloc_retries,
        num_ooms=sim.num_ooms,
        num_segments=sim.num_segments,
        num_events=index + 1,
        oom_event_index=oom_at,
        stats=sim.memory_stats(),
        checkpoints=checkpoints,
        segment_log=list(sim.segment_log or ()),
        alloc_addresses=addresses,
        segments=sim.segments,
    )


# --------------------------------------------------------------------------------------------
# Events from a real allocator trace


@dataclass
class DeviceTraceEvents:
    """A recorded allocator trace turned into :func:`replay` events, and what to check."""

    events: list[tuple[Any, ...]]
    alloc_addresses: list[int | None]  # recorded address per alloc event (None: it ran out)
    segment_log: list[tuple[str, int, int, int]]  # (action, addr, size, stream) as recorded
    segment_addresses: list[int]  # what cudaMalloc / address reservations returned, in order
    streams: dict[int, int]  # recorded stream handle -> stream number used in events
    num_ooms: int = 0


_SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


def events_from_device_trace(
    entries: Iterable[Mapping[str, Any] | Sequence[Any]],
    *,
    markers: Mapping[int, Sequence[tuple[Any, ...]]] | None = None,
    device_total_bytes: int | None = None,
    large_segment_size: int = LARGE_BUFFER,
) -> DeviceTraceEvents:
    """Turn ``torch.cuda.memory._snapshot()["device_traces"][device]`` into replay events.

    ``entries`` are the trace's dicts (``action``, ``addr``, ``size``, ``stream``) or tuples in
    that order.  An ``alloc`` becomes an alloc event with the requested size, a
    ``free_completed`` (the moment the block is back in its pool) a free event, an ``oom`` an
    alloc event expected to fail; frees of blocks allocated before the trace began are
    dropped.  ``markers`` maps a trace position to events inserted before that entry (a position
    equal to the trace's length appends).  Streams are renumbered 0, 1, ... in the order of
    their handles, as the allocator orders them (the default stream, handle 0, stays 0).
    ``device_total_bytes`` (the GPU's memory) and ``large_segment_size`` tell
    expandable-segment reservations apart, to collect their base addresses.
    """
    markers = markers or {}
    total = device_total_bytes or _DEFAULT_DEVICE_TOTAL
    rows: list[tuple[str, int, int, int]] = []
    for entry in entries:
        if isinstance(entry, Mapping):
            rows.append(
                (
                    entry["action"],
                    int(entry.get("addr", 0) or 0),
                    int(entry.get("size", 0) or 0),
                    int(entry.get("stream", 0) or 0),
                )
            )
        else:
            rows.append((entry[0], int(entry[1]), int(entry[2]), int(entry[3])))
    # the allocator orders free blocks by stream handle: keep that order in the numbering
    streams = {raw: i for i, raw in enumerate(sorted({0} | {r[3] for r in rows}))}
    events: list[tuple[Any, ...]] = []
    alloc_addresses: list[int | None] = []
    segment_log: list[tuple[str, int, int, int]] = []
    segment_addresses: list[int] = []
    live: dict[int, int] = {}
    reservations: list[list[int]] = []  # [base, end, mapped bytes]
    next_id = 0
    ooms = 0
    position = -1
    for position, (action, addr, size, raw_stream) in enumerate(rows):
        if position in markers:
            events.extend(markers[position])
        stream = streams[raw_stream]
        if action == "alloc":
            next_id += 1
            live[addr] = next_id
            events.append(("alloc", next_id, size, stream))
            alloc_addresses.append(addr)
        elif action == "free_completed":
            bid = live.pop(addr, None)
            if bid is not None:
                events.append(("free", bid))
        elif action == "oom":
            next_id += 1
            ooms += 1
            events.append(("alloc", next_id, size, stream))
            alloc_addresses.append(None)
        elif action in _SEGMENT_ACTIONS:
            segment_log.append((action, addr, size, stream))
            if action == "segment_alloc":
                segment_addresses.append(addr)
            elif action == "segment_map":
                inside = next((r for r in reservations if r[0] <= addr < r[1]), None)
                if inside is None:
                    # small-pool maps are one 2 MiB page; large-pool maps whole large pages
                    page = SMALL_BUFFER if size == SMALL_BUFFER else large_segment_size
                    va_size = -(-(total + total // 8) // page) * page
                    inside = [addr, addr + va_size, 0]
                    reservations.append(inside)
                    segment_addresses.append(addr)
                inside[2] += size
            elif action == "segment_unmap":
                for r in reservations:
                    if r[0] <= addr < r[1]:
                        r[2] -= size
                        if r[2] == 0:  # fully unmapped: the allocator drops the reservation
                            reservations.remove(r)
                        break
    if position + 1 in markers:
        events.extend(markers[position + 1])
    return DeviceTraceEvents(
        events=events,
        alloc_addresses=alloc_addresses,
        segment_log=segment_log,
        segment_addresses=segment_addresses,
        streams=streams,
        num_ooms=ooms,
    )
