"""The attribution event log: allocations, frees and markers of one run, in one order.

Both sources write this one format. On CUDA the allocator's own trace
(``torch.cuda.memory._record_memory_history``) holds the allocations and frees, and the
hooks' markers are merged into it after the run (:func:`merge_allocator_trace`); on the CPU
a dispatch mode appends allocations and frees to the very list the markers go to. The
analysis (:mod:`vramscope.report.modules`) reads only this log, so it is tested on CPU runs
and on traces recorded on a GPU alike. Plain data: no torch here.

A record is a list whose first element says what it is:

=======  ==========================================  =========================================
kind     fields                                       meaning
=======  ==========================================  =========================================
``a``    block, addr, size, frame, shape, dtype       a block is allocated (frame: index into
                                                      ``frames`` or -1; shape/dtype or None)
``f``    block                                        the block is freed
``m``    module                                       a module's forward begins
``x``    module                                       a module's forward ends
``b``    module                                       the gradient reaches a module's output
``p``    phase name                                   the session's phase changes
``s``    step index                                   a new step begins
``u``                                                 an optimizer step ended: a step that
                                                      begins before the next ``p`` began
                                                      here (what came since is its own)
``k``    census                                       objects seen here: ``censuses[census]``
``g``                                                 the allocator's trace resumes after steps
                                                      it did not record (a window, below)
``c``    code                                         a profiled function is entered
``l``    code, line, rss, maxrss                      a profiled line begins (host RSS, peak RSS)
``r``    code, rss, maxrss                            a profiled function returns
=======  ==========================================  =========================================

A census entry is ``[addr, category, module, name, shape, dtype]``: the tensor whose storage
starts at ``addr`` is a parameter, buffer, gradient or optimizer state of ``module``.
"""

from __future__ import annotations

import bisect
import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "vramscope.events/1"

ALLOC, FREE = "a", "f"
ENTER, EXIT, BACKWARD = "m", "x", "b"
PHASE, STEP, CENSUS, UPDATE, GAP = "p", "s", "k", "u", "g"
CALL, LINE, RETURN = "c", "l", "r"
MARKER_KINDS = frozenset(
    {ENTER, EXIT, BACKWARD, PHASE, STEP, CENSUS, UPDATE, GAP, CALL, LINE, RETURN}
)


@dataclass
class EventLog:
    """One run's allocations, frees and markers, ready for the analysis."""

    source: str = "cpu-dispatch"  # "cuda-trace" | "cpu-dispatch"
    device: str = "cpu"
    records: list[list[Any]] = field(default_factory=list)
    baseline: list[list[int]] = field(default_factory=list)  # [block, addr, size] live before
    modules: list[dict[str, Any]] = field(default_factory=list)
    frames: list[list[Any]] = field(default_factory=list)  # [filename, line, function]
    codes: list[dict[str, Any]] = field(default_factory=list)
    censuses: list[list[list[Any]]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = SCHEMA
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EventLog:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a vramscope event log (schema {data.get('schema')!r})")
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self, path: str | Path) -> Path:
        target = Path(path)
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if target.suffix == ".gz":
            target.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
        else:
            target.write_text(text, encoding="utf-8")
        return target

    @classmethod
    def load(cls, path: str | Path) -> EventLog:
        source = Path(path)
        raw = source.read_bytes()
        if source.suffix == ".gz":
            raw = gzip.decompress(raw)
        return cls.from_dict(json.loads(raw.decode("utf-8")))


def trim_records(
    records: list[list[Any]], baseline: list[list[int]], cut: int
) -> tuple[list[list[Any]], list[list[int]]]:
    """Drop ``records[:cut]``; the blocks still live at the cut become the new baseline.

    Used to bound a long run: the log keeps its newest steps, and what was allocated
    before them is still counted (as live before the log begins).
    """
    live: dict[int, list[int]] = {b[0]: b for b in baseline}
    for record in records[:cut]:
        kind = record[0]
        if kind == ALLOC:
            live[record[1]] = [record[1], record[2], record[3]]
        elif kind == FREE:
            live.pop(record[1], None)
    return records[cut:], list(live.values())


# ---- the CUDA allocator's trace, merged with the markers --------------------------------------

TRACE_ALLOC = "alloc"
TRACE_FREES = ("free_requested", "free_completed")
METADATA_KEYS = ("user_metadata", "metadata")
BASELINE_BLOCKS = 1 << 40


def _is_library_file(filename: str, library_dirs: tuple[str, ...]) -> bool:
    return (
        not filename
        or filename.startswith("<")
        or any(filename.startswith(d) for d in library_dirs)
    )


def merge_allocator_trace(
    trace: list[dict[str, Any]],
    active_blocks: list[dict[str, Any]],
    markers: list[list[Any]],
    *,
    marker_base: int = 0,
    marker_times_us: list[float] | None = None,
    library_dirs: tuple[str, ...] = (),
    segment_spans: list[list[int]] | tuple[()] = (),
    metadata_prefix: str = "",
) -> tuple[list[list[Any]], list[list[int]], list[list[Any]], dict[str, Any]]:
    """Merge the allocator's trace entries with the hooks' markers into one record list.

    ``trace``: one device's ``device_traces`` from ``torch.cuda.memory._snapshot()``;
    ``active_blocks``: ``[{"address", "size"}]``, the blocks allocated when it was taken.
    The k-th ``alloc`` entry becomes block k (so a trace entry finds its block again).
    ``markers``: marker records, the first of which is marker number ``marker_base``.

    Where the trace entries carry ``user_metadata`` (vramscope sets it to
    ``metadata_prefix`` + the count of markers so far at every marker), the order is exact.
    Otherwise markers are placed by time: ``marker_times_us`` on the trace's clock
    (``time_us``).

    The allocator keeps that metadata per thread, and a thread keeps it after the session
    that set it: the autograd engine's device thread, whose metadata only the backward
    hooks set, starts a session's first backward with the count a previous session left
    there. An entry whose metadata lacks ``metadata_prefix`` (a token unique to the
    session), or counts more markers than were recorded, says nothing about the markers:
    it stays in trace order, after the markers placed so far. Honouring it would place
    every marker up to that stale count before it, and the whole run after them.

    Returns (records, baseline, frames, info). ``baseline`` holds the blocks live before the
    first entry: those freed without an allocation in the trace and those still allocated
    at the end that the trace never saw allocated. Sizes are the allocator's block sizes
    (:func:`allocator_block_sizes`; ``segment_spans``: [addr, size] of the segments in the
    final snapshot), so sums match ``memory_allocated()``.
    """
    records: list[list[Any]] = []
    frames: list[list[Any]] = []
    frame_cache: dict[int, int] = {}
    frame_index: dict[tuple[Any, ...], int] = {}
    live: dict[int, int] = {}  # addr -> block
    requested: set[int] = set()  # freed (free_requested), awaiting free_completed
    sizes: dict[int, int] = {}
    baseline: list[list[int]] = []
    next_marker = 0  # index into markers
    next_block = 0  # the k-th allocation in the trace is block k
    next_baseline = BASELINE_BLOCKS  # blocks live before the trace: numbered apart
    key = None
    for candidate in METADATA_KEYS:
        if any(candidate in e for e in trace[:64]):
            key = candidate
            break
    join = "metadata" if key else ("time" if marker_times_us is not None else "end")
    stats = {"entries": len(trace), "allocs": 0, "frees": 0, "join": join, "ooms": 0}
    stats["foreign_metadata"] = 0  # entries whose metadata another session (or the user) set
    marker_end = marker_base + len(markers)
    prefix_len = len(metadata_prefix)

    def marker_count(text: str) -> int | None:
        """The marker count in an entry's metadata; None where it is not this session's."""
        if not text:
            return None  # set by no one yet on this thread
        if prefix_len:
            if not text.startswith(metadata_prefix):
                stats["foreign_metadata"] += 1
                return None
            text = text[prefix_len:]
        if not text.isdigit() or int(text) > marker_end:
            stats["foreign_metadata"] += 1
            return None
        return int(text)

    def flush_to(count: int) -> None:
        nonlocal next_marker
        while next_marker < len(markers) and marker_base + next_marker < count:
            records.append(markers[next_marker])
            next_marker += 1

    def frame_of(entry: dict[str, Any]) -> int:
        stack = entry.get("frames")
        if not stack:
            return -1
        cached = frame_cache.get(id(stack))
        if cached is not None:
            return cached
        chosen = next(
            (f for f in stack if not _is_library_file(f.get("filename", ""), library_dirs)),
            stack[0],
        )
        fkey = (chosen.get("filename", "?"), chosen.get("line", 0), chosen.get("name", "?"))
        index = frame_index.get(fkey)
        if index is None:
            index = frame_index[fkey] = len(frames)
            frames.append(list(fkey))
        frame_cache[id(stack)] = index
        return index

    for entry in trace:
        action = entry.get("action")
        if action == "oom":
            stats["ooms"] += 1
        if action != TRACE_ALLOC and action not in TRACE_FREES:
            continue
        if join == "metadata":
            count = marker_count(entry.get(key) or "")
            if count is not None:
                flush_to(count)
        elif join == "time" and marker_times_us is not None:
            t = entry.get("time_us", 0)
            while next_marker < len(markers) and marker_times_us[next_marker] <= t:
                records.append(markers[next_marker])
                next_marker += 1
        addr = int(entry.get("addr", 0))
        size = int(entry.get("size", 0))
        if action == TRACE_ALLOC:
            block = next_block
            next_block += 1
            live[addr] = block
            sizes[block] = size
            records.append([ALLOC, block, addr, size, frame_of(entry), None, None])
            stats["allocs"] += 1
        else:
            if action == "free_completed" and addr in requested:
                requested.discard(addr)  # the second half of a free already counted
                continue
            if action == "free_requested":
                requested.add(addr)
            block = live.pop(addr, None)
            if block is None:
                block = next_baseline  # allocated before the trace begins
                next_baseline += 1
                baseline.append([block, addr, size])
            records.append([FREE, block])
            stats["frees"] += 1
    flush_to(marker_base + len(markers))
    final_sizes: dict[int, int] = {}
    for b in active_blocks:
        addr = int(b["address"])
        if addr in live:
            final_sizes[live[addr]] = int(b["size"])  # the block's true size, from the snapshot
            continue
        final_sizes[next_baseline] = int(b["size"])
        baseline.append([next_baseline, addr, int(b["size"])])
        next_baseline += 1
    segments = [
        [int(e.get("addr", 0)), int(e.get("size", 0))]
        for e in trace
        if e.get("action") in ("segment_alloc", "segment_map")
    ]
    segments += [[int(s[0]), int(s[1])] for s in segment_spans]
    stats["changed_sizes"] = allocator_block_sizes(records, baseline, segments, final_sizes)
    return records, baseline, frames, stats


def merge_trace_windows(
    windows: list[dict[str, Any]],
    markers: list[list[Any]],
    *,
    marker_base: int = 0,
    marker_times_us: list[float] | None = None,
    library_dirs: tuple[str, ...] = (),
    metadata_prefix: str = "",
) -> tuple[list[list[Any]], list[list[int]], list[list[Any]], dict[str, Any]]:
    """:func:`merge_allocator_trace` for a trace recorded in windows (the steps with module
    markers; a trace in one piece is one window), joined into one record list.
    ``marker_times_us``: the markers' times on the trace's clock, where the trace carries
    no metadata (one window).

    ``windows``: in order, each ``{"first", "last", "trace", "active", "segments"}``: the
    global marker counts when its recording began and ended (``last`` None: at the end), one
    device's trace entries, the blocks allocated when it ended (``[{"address", "size"}]``)
    and the segments then (``[addr, size]``). Between windows nothing was recorded: only
    the markers of those steps are kept, and at each window's start (a ``g`` record) the
    blocks live then (its trace read backwards from its end) replace those live at the
    previous window's end: a block at the same address and size is taken as the same block
    (the analysis splits it at the gap when an object holds it after the gap and none did
    before: another allocation there); the others are freed or allocated there, with no
    frame (made in steps nobody recorded). Inside each window the records are exact.
    """
    records: list[list[Any]] = []
    frames: list[list[Any]] = []
    baseline: list[list[int]] = []
    live: dict[int, tuple[int, int]] = {}  # addr -> (block, size), as the records stand
    addr_of: dict[int, int] = {}  # live block -> addr
    next_block = 0
    emitted = marker_base  # global count of the markers emitted so far
    marker_end = marker_base + len(markers)
    stats: dict[str, Any] = {"windows": 0, "entries": 0, "allocs": 0, "frees": 0, "ooms": 0}
    stats.update({"foreign_metadata": 0, "changed_sizes": 0, "join": "end", "bridged": 0})

    def emit_markers(upto: int) -> None:
        nonlocal emitted
        upto = min(max(upto, emitted), marker_end)
        records.extend(markers[emitted - marker_base : upto - marker_base])
        emitted = upto

    for window in windows:
        first = max(int(window["first"]), marker_base)
        last = marker_end if window.get("last") is None else min(int(window["last"]), marker_end)
        if last < first:
            continue
        emit_markers(first)
        first = emitted
        part, start, part_frames, info = merge_allocator_trace(
            window["trace"],
            window["active"],
            markers[first - marker_base : max(first, last) - marker_base],
            marker_base=first,
            marker_times_us=(
                marker_times_us[first - marker_base : max(first, last) - marker_base]
                if marker_times_us is not None
                else None
            ),
            library_dirs=library_dirs,
            segment_spans=window.get("segments") or (),
            metadata_prefix=metadata_prefix,
        )
        emitted = max(first, last)
        ids: dict[int, int] = {}  # this window's block numbers -> the joined ones
        if stats["windows"] == 0:
            for block, addr, size in start:
                ids[block] = next_block
                baseline.append([next_block, addr, size])
                live[addr] = (next_block, size)
                addr_of[next_block] = addr
                next_block += 1
        else:
            records.append([GAP])
            wanted = {addr: (block, size) for block, addr, size in start}
            for addr, (block, size) in list(live.items()):
                if wanted.get(addr, (None, None))[1] != size:
                    records.append([FREE, block])
                    del live[addr], addr_of[block]
                    stats["bridged"] += 1
            for addr, (block, size) in wanted.items():
                if addr in live:
                    ids[block] = live[addr][0]
                    continue
                ids[block] = next_block
                records.append([ALLOC, next_block, addr, size, -1, None, None])
                live[addr] = (next_block, size)
                addr_of[next_block] = addr
                next_block += 1
                stats["bridged"] += 1
        frame_offset = len(frames)
        frames.extend(part_frames)
        for record in part:
            kind = record[0]
            if kind == ALLOC:
                joined = ids[record[1]] = next_block
                next_block += 1
                frame = record[4] + frame_offset if record[4] >= 0 else -1
                records.append([ALLOC, joined, record[2], record[3], frame, *record[5:7]])
                live[record[2]] = (joined, record[3])
                addr_of[joined] = record[2]
            elif kind == FREE:
                joined = ids.get(record[1])
                if joined is None:
                    continue
                records.append([FREE, joined])
                addr = addr_of.pop(joined, None)
                if addr is not None and live.get(addr, (None,))[0] == joined:
                    del live[addr]
            else:
                records.append(record)
        stats["windows"] += 1
        for key in ("entries", "allocs", "frees", "ooms", "foreign_metadata", "changed_sizes"):
            stats[key] += info.get(key, 0)
        if stats["windows"] == 1 or info.get("join") != "end":
            stats["join"] = info.get("join", stats["join"])
    emit_markers(marker_end)
    return records, baseline, frames, stats


SMALL_SIZE = 1 << 20  # the caching allocator's kSmallSize: larger requests use the large pool


def allocator_block_sizes(
    records: list[list[Any]],
    baseline: list[list[int]],
    segments: list[list[int]] | None = None,
    known: dict[int, int] | None = None,
) -> int:
    """Turn the trace's requested sizes into the caching allocator's block sizes, in place.

    The trace's ``alloc`` entry carries the size that was asked for, but the allocator's
    ``allocated_bytes`` (and ``max_memory_allocated``) count whole blocks: the request
    rounded up to 512 bytes, and, in the large pool (requests over 1 MiB), the whole free
    block when splitting it would leave 1 MiB or less (a 3 MiB request served from a freed
    4 MiB block takes 4 MiB). An allocation always takes the start of a free block, and
    free neighbours coalesce, so the free block reaches to the next live block or the end
    of its segment; ``segments`` ([addr, size], from the trace's segment entries and the
    final snapshot) give those ends when known (without them, a block at the tail of a
    segment keeps its rounded size). ``known``: block -> size for blocks whose true size
    the final snapshot states. Returns how many allocations changed size beyond rounding.
    """
    known = known or {}
    spans = sorted((a, a + n) for a, n in segments or [])
    seg_starts = [a for a, _ in spans]
    seg_ends = [e for _, e in spans]
    live_addr: dict[int, int] = {b[0]: b[1] for b in baseline}
    addrs = sorted(live_addr.values())
    changed = 0

    def block_size(block: int, addr: int, size: int) -> int:
        nonlocal changed
        true = known.get(block)
        if true is not None:
            return true
        true = _round(size)
        if true > SMALL_SIZE:
            i = bisect.bisect_right(addrs, addr)
            end = addrs[i] if i < len(addrs) else None
            j = bisect.bisect_right(seg_starts, addr) - 1
            if j >= 0 and addr < seg_ends[j]:
                end = seg_ends[j] if end is None else min(end, seg_ends[j])
            if end is not None and true < end - addr <= true + SMALL_SIZE:
                true = end - addr
                changed += 1
        return true

    # blocks live before the trace: a freed one's size is what was asked for (the trace's
    # entry), its block reaches as far as a new one would with the same neighbours (those
    # live before the trace are the only ones then)
    for b in baseline:
        b[2] = block_size(b[0], b[1], b[2])
    for record in records:
        kind = record[0]
        if kind == ALLOC:
            block, addr = record[1], record[2]
            true = block_size(block, addr, record[3])
            record[3] = true
            if block not in live_addr:
                live_addr[block] = addr
                bisect.insort(addrs, addr)
        elif kind == FREE:
            addr = live_addr.pop(record[1], None)
            if addr is not None:
                i = bisect.bisect_left(addrs, addr)
                if i < len(addrs) and addrs[i] == addr:
                    del addrs[i]
    return changed


def _round(size: int) -> int:
    return -(-max(int(size), 1) // 512) * 512
