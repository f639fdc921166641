"""The allocator's trace on CUDA, in windows: one per run of recorded steps, each taken with
the blocks allocated at its end, and joined with the recorder's markers after the run.

The trace (``torch.cuda.memory._record_memory_history``) costs about half a microsecond per
allocation and free, so with markers on a schedule it runs only in the steps that carry them
(see :mod:`vramscope.tracking.marking`); the windows are joined by
:func:`vramscope.tracking.events.merge_trace_windows`. The recorder
(:mod:`vramscope.tracking.attribution`) decides when a window opens and closes.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch

from vramscope.tracking.events import EventLog, merge_trace_windows

MAX_TRACE_ENTRIES = int(os.environ.get("VRAMSCOPE_TRACE_ENTRIES", "300000"))


class AllocatorTrace:
    """The windows of one device's allocator trace, bounded to ``MAX_TRACE_ENTRIES``."""

    def __init__(self, device_index: int, stacks: bool) -> None:
        self.device_index = device_index
        self.stacks = stacks  # a Python stack per allocation (``--detail lines``, snapshots)
        self.windows: list[dict[str, Any]] = []
        self.dropped_windows = 0
        self.raw_snapshot: dict[str, Any] | None = None  # taken when the trace stopped
        self._entries = 0
        self._first = 0  # global marker count when the open window began
        self._probes: list[tuple[int, float]] = []

    def start(self, first: int) -> None:
        """Start the trace (a new window of it); ``first``: the marker count now."""
        kwargs: dict[str, Any] = {
            "enabled": "all",
            "context": "alloc" if self.stacks else None,
            "stacks": "python",
            "max_entries": MAX_TRACE_ENTRIES,
        }
        try:
            torch.cuda.memory._record_memory_history(**kwargs, clear_history=True)
        except TypeError:  # older torch: no clear_history
            torch.cuda.memory._record_memory_history(**kwargs)
        self._first = first

    def take(self, last: int | None) -> dict[str, Any]:
        """Take the open window's trace and the blocks allocated now (one snapshot); returns
        the snapshot. The trace keeps running: the caller stops it or not."""
        snapshot = torch.cuda.memory._snapshot()
        index = self.device_index or 0
        traces = snapshot.get("device_traces") or []
        trace = traces[index] if index < len(traces) else []
        active, segments = _allocated_and_segments(snapshot, index)
        window = {
            "first": self._first,
            "last": last,
            "trace": trace,
            "active": active,
            "segments": segments,
        }
        self.windows.append(window)
        self._entries += len(trace)
        while self._entries > MAX_TRACE_ENTRIES and len(self.windows) > 1:
            dropped = self.windows.pop(0)  # the oldest go: the newest steps are kept
            self._entries -= len(dropped["trace"])
            self.dropped_windows += 1
        return snapshot

    def off(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)

    def finish(self) -> None:
        """The last window, in one piece with the trace when it never paused; its snapshot is
        the run's (the memory_viz snapshot, private pools)."""
        self.raw_snapshot = self.take(None)

    def probe(self) -> None:
        """A 512-byte allocation whose trace time ties the trace's clock to ours."""
        with contextlib.suppress(Exception):
            t0 = time.time_ns()
            x = torch.empty(512, dtype=torch.uint8, device=f"cuda:{self.device_index}")
            t1 = time.time_ns()
            self._probes.append((x.data_ptr(), (t0 + t1) / 2000))
            del x

    def join(
        self,
        log: EventLog,
        markers: list[list[Any]],
        marker_base: int,
        marker_times: list[float] | None,
        metadata_prefix: str,
        library_dirs: tuple[str, ...],
    ) -> None:
        """The windows (one, when the trace ran in every step) joined with the markers into
        ``log``: its records, baseline, frames, and what the trace left out."""
        windows = self.windows
        records, baseline, frames, info = merge_trace_windows(
            windows,
            markers,
            marker_base=marker_base,
            marker_times_us=self._times_on_trace(marker_times, windows[-1]["trace"]),
            library_dirs=library_dirs,
            metadata_prefix=metadata_prefix,
        )
        log.records, log.baseline, log.frames = records, baseline, frames
        log.meta["block_sizes"] = "allocator"
        log.meta["segments"] = windows[-1]["segments"]
        log.meta["stacks"] = self.stacks
        info["max_entries"] = MAX_TRACE_ENTRIES
        info["dropped_windows"] = self.dropped_windows
        info["overflowed"] = any(len(w["trace"]) >= MAX_TRACE_ENTRIES for w in windows)
        log.meta["trace"] = info
        bound = f"the allocator trace is bounded to {MAX_TRACE_ENTRIES} events"
        if self.dropped_windows:
            log.notes.append(
                f"{bound}: the {self.dropped_windows} oldest windows of marked steps were "
                "dropped; raise VRAMSCOPE_TRACE_ENTRIES to keep more"
            )
        elif info["overflowed"]:
            log.notes.append(
                f"{bound} and filled up: allocations before its window count as live before "
                "it; raise VRAMSCOPE_TRACE_ENTRIES to see more"
            )
        if info["join"] not in ("metadata", "end"):
            log.notes.append(
                "this torch has no allocator user metadata: markers were placed on the trace "
                "by time, which can misplace allocations made within a microsecond of a marker"
            )

    def _times_on_trace(
        self, marker_times: list[float] | None, trace: list[dict[str, Any]]
    ) -> list[float] | None:
        """Our marker times mapped onto the trace's clock by the two probe allocations."""
        if marker_times is None:
            return None
        points = []
        for addr, ours in self._probes:
            entry = next(
                (
                    e
                    for e in trace
                    if e.get("action") == "alloc" and e.get("addr") == addr and "time_us" in e
                ),
                None,
            )
            if entry is not None:
                points.append((ours, float(entry["time_us"])))
        if not points:
            return list(marker_times)
        if len(points) == 1 or points[-1][0] == points[0][0]:
            offset = points[0][1] - points[0][0]
            return [t + offset for t in marker_times]
        (a0, b0), (a1, b1) = points[0], points[-1]
        scale = (b1 - b0) / (a1 - a0)
        return [b0 + (t - a0) * scale for t in marker_times]


def _allocated_and_segments(
    snapshot: dict[str, Any], index: int
) -> tuple[list[dict[str, int]], list[list[int]]]:
    """One device's allocated blocks (``{"address", "size"}``) and segments (``[addr, size]``)
    in an allocator snapshot."""
    own = [seg for seg in snapshot.get("segments", []) if seg.get("device", index) == index]
    active = [
        {"address": b.get("address", 0), "size": b.get("size", 0)}
        for seg in own
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
    ]
    segments = [[int(seg.get("address", 0)), int(seg.get("total_size", 0))] for seg in own]
    return active, segments
