"""Attribution analysis: an event log in; module tree, categories at the peak, the tensors
that made the peak, and line tables out. Pure functions over plain data: no torch here.

The log is replayed once, in order. Each block remembers where it was allocated: the
phase and step, the modules whose forwards were running (or, in backward, the module the
gradient had reached) and the creating line. The peak is the highest sum of live blocks.
Parameters, buffers, gradients and optimizer state are the blocks whose storages the objects
held at a census (taken when a model is found, at each recorded optimizer step and at the
end), by identity only; the rest by lifetime: allocated in a forward and still alive when
the backward begins = activations; anything else allocated in a step = temporaries (a
cuBLAS workspace made in the first backward and kept is not a gradient); what was there
before, or was made outside the phases (inputs, data) = other. What each module holds at
the peak is its labelled blocks alive there, so the module tree adds up to the categories.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from vramscope.report.model import CATEGORY_NAMES
from vramscope.report.words import plural, ranges
from vramscope.tracking.events import (
    ALLOC,
    BACKWARD,
    CALL,
    CENSUS,
    ENTER,
    EXIT,
    FREE,
    GAP,
    LINE,
    PHASE,
    RETURN,
    STEP,
    UPDATE,
    EventLog,
    allocator_block_sizes,
)
from vramscope.tracking.marking import FIRST_STEPS, PROBE_EVERY, SETTLED, expand

CATEGORIES = CATEGORY_NAMES
SPLIT_BLOCKS = 1 << 50  # numbers of the blocks split at a gap of the trace (_Replay._census)
OUTSIDE = "(outside modules)"
TOP_TENSORS = 20


@dataclass(slots=True)
class Block:
    block: int
    addr: int
    size: int
    alloc: int  # record position; -1 for blocks live before the log
    free: int | None = None
    phase: str = "other"
    step: int | None = None
    stack: tuple[int, ...] = ()  # forward calls open at allocation, outermost first
    owner: int = -1  # innermost module (forward) or the module the gradient reached (backward)
    frame: int = -1
    shape: Any = None
    dtype: str | None = None
    label: tuple[str, int, str] | None = None  # (category, module, name) from a census
    label_shape: Any = None
    label_dtype: str | None = None


@dataclass
class Call:
    module: int
    enter: int
    step: int | None
    recompute: bool
    exit: int | None = None
    peak_allocated: int = 0
    blocks: list[Block] = field(default_factory=list)
    temporaries_peak: int = 0


@dataclass
class Pass:
    """One stretch of a phase: [start, end) in record positions."""

    phase: str
    start: int
    step: int | None
    end: int | None = None


@dataclass
class LineRun:
    code: int
    line: int
    start: int
    start_live: int
    rss: int
    maxrss: int
    peak: int


def _as_log(log: EventLog | dict[str, Any]) -> EventLog:
    return log if isinstance(log, EventLog) else EventLog.from_dict(log)


def analyze(
    log: EventLog | dict[str, Any],
    depth: int = 3,
    top: int = TOP_TENSORS,
    labels: bool = False,
) -> dict[str, Any]:
    """The whole analysis of one event log; see the module docstring for the rules.

    ``labels=True`` adds ``block_labels``: block -> (module, phase, category), for the
    memory_viz snapshot.
    """
    log = _as_log(log)
    if log.source == "cuda-trace" and log.meta.get("block_sizes") != "allocator":
        # recorded before the merge sized blocks as the allocator does: size them now
        log.meta["block_sizes"] = "allocator"
        log.meta.setdefault("trace", {})["changed_sizes"] = allocator_block_sizes(
            log.records, log.baseline, log.meta.get("segments")
        )
    replay = _Replay(log)
    replay.run()
    modules_table = log.modules
    main_root = _main_root(modules_table, replay)
    names = [_display_name(i, modules_table, main_root) for i in range(len(modules_table))]
    peak_blocks = replay.live_at_peak()
    categories = _categories(replay, peak_blocks)  # the run's peak: markers not needed
    peak = {
        "allocated_bytes": replay.peak,
        "record": replay.peak_pos,
        "step": replay.peak_step,
        "phase": replay.peak_phase,
    }
    module_peak = replay.use_marked_peak()  # module tables need a step with markers
    if module_peak is not None:
        peak_blocks = replay.live_at_peak()
    result: dict[str, Any] = {
        "source": log.source,
        "device": log.device,
        "peak": peak,
        "module_peak": module_peak,
        "module_steps": log.meta.get("module_steps"),
        # the trace ran only in the steps with markers (windows joined): its peak is theirs
        "trace_windows": (log.meta.get("trace") or {}).get("windows"),
        "categories": categories,
        "modules": _module_rows(replay, modules_table, names, main_root, depth, peak_blocks),
        "peak_tensors": _peak_tensors(replay, peak_blocks, categories, names, top),
        "lines": _line_tables(replay, log),
        "notes": list(log.notes) + replay.notes + _marking_notes(log, peak, module_peak),
        # tensors the objects held that no recorded operator made (another thread's)
        "census_missed": replay.census_missed,
        "block_labels": _block_labels(replay, names) if labels else None,
        "stats": {
            "records": len(log.records),
            "allocations": replay.allocations,
            "frees": replay.frees,
            "steps": len(replay.step_starts),
            "calls": len(replay.calls),
        },
    }
    return result


class _Replay:
    """One pass over the records; keeps what every table needs."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.blocks: dict[int, Block] = {}
        self.by_addr: dict[int, int] = {}
        self.live_total = 0
        self.peak = 0
        self.peak_pos = -1
        self.peak_step: int | None = None
        self.peak_phase: str | None = None
        self.phase = "other"
        self.step: int | None = None
        self.step_starts: dict[int, int] = {}
        self.stack: list[Call] = []
        self.stack_ids: tuple[int, ...] = ()
        self.calls: list[Call] = []
        self.passes: list[Pass] = []
        self.backward_owner = -1
        self.burst: list[int] = []
        self.allocations = 0
        self.frees = 0
        self.notes: list[str] = []
        self.line_runs: list[list[LineRun]] = []  # per open frame: its current line
        self.line_frames: list[int] = []  # code of each open frame
        self.line_stats: dict[tuple[int, int], dict[str, Any]] = {}
        self.depths = [m.get("depth", 0) for m in log.modules]
        self.census_labels = 0
        self.census_missed = 0
        # the steps that placed module markers (None: all of them)
        self.marked: set[int] | None = None
        schedule = log.meta.get("module_steps") or {}
        if schedule.get("unmarked_steps"):
            self.marked = expand(schedule.get("marked_steps") or [])
        self.step_marked = True
        self.marked_peak = -1
        self.marked_peak_pos = -1
        self.marked_peak_step: int | None = None
        self.marked_peak_phase: str | None = None
        # since an optimizer step ended (an UPDATE marker): (its position, blocks allocated
        # since); a step that begins before the next phase began there, and its first phase
        # with it (``moved``, until that phase's marker)
        self.update: tuple[int, list[Block]] | None = None
        self.moved: tuple[int, list[Block]] | None = None
        # where the allocator's trace resumed after steps it did not record: (position,
        # step, phase); a block split at one (see _census) goes on under a new number
        self.gaps: list[tuple[int, int | None, str]] = []
        self.renamed: dict[int, int] = {}

    # ---- helpers -------------------------------------------------------------------------------
    def _depth(self, module: int) -> int:
        return self.depths[module] if 0 <= module < len(self.depths) else 0

    def _resolve_burst(self) -> None:
        """Several modules reached at one autograd node: the innermost one owns what follows."""
        if self.burst:
            best = self.burst[0]
            for m in self.burst[1:]:
                if self._depth(m) > self._depth(best):
                    best = m
            self.backward_owner = best
            self.burst = []

    def _set_phase(self, name: str, pos: int) -> None:
        if self.passes and self.passes[-1].end is None:
            self.passes[-1].end = pos
        self.passes.append(Pass(name, pos, self.step))
        self.phase = name
        if name != "backward":
            self.backward_owner = -1
            self.burst = []

    # ---- the pass ------------------------------------------------------------------------------
    def run(self) -> None:
        log = self.log
        for block, addr, size in log.baseline:
            b = Block(block, addr, size, -1)
            self.blocks[block] = b
            self.by_addr[addr] = block
            self.live_total += size
        self.peak = self.live_total
        blocks, by_addr = self.blocks, self.by_addr
        pos = -1
        for pos, record in enumerate(log.records):
            kind = record[0]
            if kind == ALLOC:
                self._resolve_burst()
                _, block, addr, size, frame, shape, dtype = record[:7]
                owner = -1
                if self.stack:
                    owner = self.stack[-1].module
                elif self.phase == "backward":
                    owner = self.backward_owner
                b = Block(
                    block,
                    addr,
                    size,
                    pos,
                    phase=self.phase,
                    step=self.step,
                    stack=self.stack_ids,
                    owner=owner,
                    frame=frame,
                    shape=shape,
                    dtype=dtype,
                )
                blocks[block] = b
                by_addr[addr] = block
                self.live_total += size
                self.allocations += 1
                if self.update is not None:
                    self.update[1].append(b)
                for call in self.stack:
                    call.blocks.append(b)
                    if self.live_total > call.peak_allocated:
                        call.peak_allocated = self.live_total
                for runs in self.line_runs:
                    if runs and self.live_total > runs[-1].peak:
                        runs[-1].peak = self.live_total
                if self.live_total > self.peak:
                    self.peak = self.live_total
                    self.peak_pos = pos
                    self.peak_step = self.step
                    self.peak_phase = self.phase
                if self.step_marked and self.live_total > self.marked_peak:
                    self.marked_peak = self.live_total
                    self.marked_peak_pos = pos
                    self.marked_peak_step = self.step
                    self.marked_peak_phase = self.phase
            elif kind == FREE:
                b = blocks.get(
                    self.renamed.get(record[1], record[1]) if self.renamed else record[1]
                )
                if b is None or b.free is not None:
                    continue
                b.free = pos
                self.live_total -= b.size
                self.frees += 1
                if by_addr.get(b.addr) == b.block:
                    del by_addr[b.addr]
            elif kind == ENTER:
                recompute = self.phase == "backward"
                call = Call(record[1], pos, self.step, recompute, peak_allocated=self.live_total)
                self.stack.append(call)
                self.stack_ids = (*self.stack_ids, record[1])
                self.calls.append(call)
            elif kind == EXIT:
                if not self.stack:
                    continue
                # pop to the matching call (an exception may have skipped exits)
                while self.stack:
                    call = self.stack.pop()
                    self.stack_ids = self.stack_ids[:-1]
                    self._close_call(call, pos)
                    if call.module == record[1]:
                        break
            elif kind == BACKWARD:
                self.burst.append(record[1])
            elif kind == PHASE:
                self._phase_marker(record[1], pos)
            elif kind == STEP:
                self.step = record[1]
                self.step_starts[record[1]] = pos
                self.step_marked = self.marked is None or record[1] in self.marked
                if self.update is not None:
                    self._step_began_at_update(record[1])
            elif kind == UPDATE:
                self.update = (pos, [])
            elif kind == CENSUS:
                self._census(record[1])
            elif kind == GAP:
                self.gaps.append((pos, self.step, self.phase))
            elif kind in (CALL, LINE, RETURN):
                self._line_marker(record, pos)
        end = pos + 1
        for call in reversed(self.stack):
            self._close_call(call, end)
        if self.passes and self.passes[-1].end is None:
            self.passes[-1].end = end
        self.end = end
        while self.line_frames:
            self._close_line(end, None, None)
            self.line_frames.pop()
            self.line_runs.pop()
        self.index_passes()
        if self.census_missed:
            self.notes.append(
                f"{self.census_missed} tensors of the model or optimizer were not found among "
                "the recorded blocks (made outside what was recorded)"
            )

    def _phase_marker(self, name: str, pos: int) -> None:
        """A phase begins at ``pos``; the first phase of a step that began where an optimizer
        step ended began there, with what was allocated since."""
        self.update = None
        moved, self.moved = self.moved, None
        if moved is None:
            self._set_phase(name, pos)
            return
        start, moved_blocks = moved
        for b in moved_blocks:
            b.phase = name
        if self.peak_pos >= start:
            self.peak_phase = name
        if self.marked_peak_pos >= start:
            self.marked_peak_phase = name
        self._set_phase(name, start)

    def _step_began_at_update(self, step: int) -> None:
        """Step ``step`` began where the last optimizer step ended: what came since is its."""
        start, moved_blocks = self.update  # type: ignore[misc]
        self.update = None
        for b in moved_blocks:
            b.step = step
        self.step_starts[step] = start
        if self.peak_pos >= start:
            self.peak_step = step
        if self.marked_peak_pos >= start:
            self.marked_peak_step = step
        self.moved = (start, moved_blocks)

    def _close_call(self, call: Call, pos: int) -> None:
        call.exit = pos
        events: list[tuple[int, int]] = []
        for b in call.blocks:
            if b.free is not None and b.free < pos:
                events.append((b.alloc, b.size))
                events.append((b.free, -b.size))
        events.sort()
        cur = peak = 0
        for _, delta in events:
            cur += delta
            peak = max(peak, cur)
        call.temporaries_peak = peak
        call.blocks = []

    def _census(self, index: int) -> None:
        censuses = self.log.censuses
        if not 0 <= index < len(censuses):
            return
        for entry in censuses[index]:
            addr, category, module, name, shape, dtype = entry[:6]
            block = self.by_addr.get(addr)
            if block is None:
                self.census_missed += 1
                continue
            b = self.blocks[block]
            if b.label is None and b.alloc >= 0 and self.gaps and self.gaps[-1][0] > b.alloc:
                # made where the trace recorded, held by no object there, and an object's
                # storage after steps the trace did not record: another allocation at the
                # same address and size (a gradient where an activation was)
                b = self._split_at_gap(b, self.gaps[-1])
            if (
                b.label is None
                or _priority(category) < _priority(b.label[0])
                or (category == b.label[0] and b.label[1] < 0 <= module)  # now with its owner
            ):
                b.label = (category, module, name)
                b.label_shape, b.label_dtype = shape, dtype
                self.census_labels += 1

    def _split_at_gap(self, b: Block, gap: tuple[int, int | None, str]) -> Block:
        """End ``b`` where the trace resumed (``gap``) and go on with a block of its own
        there, made in the steps the trace did not record (no frame)."""
        pos, step, phase = gap
        b.free = pos
        after = Block(SPLIT_BLOCKS + len(self.renamed), b.addr, b.size, pos, phase=phase, step=step)
        self.blocks[after.block] = after
        self.by_addr[b.addr] = after.block
        for old, new in self.renamed.items():  # split before: the first number leads here
            if new == b.block:
                self.renamed[old] = after.block
        self.renamed[b.block] = after.block
        return after

    # ---- lines ----------------------------------------------------------------------------------
    def _line_marker(self, record: list[Any], pos: int) -> None:
        kind = record[0]
        if kind == CALL:
            self.line_frames.append(record[1])
            self.line_runs.append([])
            return
        code = record[1]
        if code not in self.line_frames:
            if kind == RETURN:
                return
            self.line_frames.append(code)  # entered before the tracer started
            self.line_runs.append([])
        while self.line_frames and self.line_frames[-1] != code:  # frames left by exceptions
            self._close_line(pos, None, None)
            self.line_frames.pop()
            self.line_runs.pop()
        if kind == LINE:
            _, _, line, rss, maxrss = record[:5]
            self._close_line(pos, rss, maxrss)
            self.line_runs[-1].append(
                LineRun(code, line, pos, self.live_total, rss, maxrss, self.live_total)
            )
        else:  # RETURN
            _, _, rss, maxrss = record[:4]
            self._close_line(pos, rss, maxrss)
            self.line_frames.pop()
            self.line_runs.pop()

    def _close_line(self, pos: int, rss: int | None, maxrss: int | None) -> None:
        runs = self.line_runs[-1] if self.line_runs else None
        if not runs:
            return
        run = runs.pop()
        stats = self.line_stats.setdefault(
            (run.code, run.line),
            {
                "hits": 0,
                "peak_bytes": 0,
                "end_bytes": 0,
                "increment_bytes": 0,
                "host_rss_bytes": None,
                "host_peak_bytes": None,
                "host_increment_bytes": 0,
            },
        )
        stats["hits"] += 1
        stats["peak_bytes"] = max(stats["peak_bytes"], run.peak, self.live_total)
        stats["end_bytes"] = self.live_total
        stats["increment_bytes"] += self.live_total - run.start_live
        if rss is not None:
            stats["host_rss_bytes"] = rss
            stats["host_increment_bytes"] += rss - run.rss
            peak = max(run.rss, rss)
            if maxrss is not None and maxrss > run.maxrss:
                peak = max(peak, maxrss)
            stats["host_peak_bytes"] = max(stats["host_peak_bytes"] or 0, peak)
        # the enclosing frame's line saw this peak too
        if len(self.line_runs) > 1:
            outer = self.line_runs[-2]
            if outer and run.peak > outer[-1].peak:
                outer[-1].peak = run.peak

    def use_marked_peak(self) -> dict[str, Any] | None:
        """When the run's peak fell in a step without module markers: describe the highest
        point of the marked steps from now on (the module tables and peak tensors); returns
        that point, or None when the peak itself is in a marked step."""
        if self.marked is None or self.peak_step is None or self.peak_step in self.marked:
            return None
        if self.marked_peak_pos < 0:
            return None
        self.peak_pos = self.marked_peak_pos
        self.peak_step = self.marked_peak_step
        self.peak_phase = self.marked_peak_phase
        return {
            "allocated_bytes": self.marked_peak,
            "record": self.marked_peak_pos,
            "step": self.marked_peak_step,
            "phase": self.marked_peak_phase,
        }

    # ---- queries ---------------------------------------------------------------------------------
    def live_at_peak(self) -> list[Block]:
        pos = self.peak_pos
        return [
            b for b in self.blocks.values() if b.alloc <= pos and (b.free is None or b.free > pos)
        ]

    def index_passes(self) -> None:
        """Precompute, per pass, the next backward pass of the same step."""
        self.pass_starts = [p.start for p in self.passes]
        self.next_backward: list[Pass | None] = [None] * len(self.passes)
        following: Pass | None = None
        for i in range(len(self.passes) - 1, -1, -1):
            p = self.passes[i]
            if following is not None and following.step != p.step:
                following = None
            if p.phase == "backward":
                following = p
            self.next_backward[i] = following

    def pass_index(self, pos: int) -> int:
        return bisect.bisect_right(self.pass_starts, pos) - 1

    def pass_at(self, pos: int) -> Pass | None:
        i = self.pass_index(pos)
        return self.passes[i] if i >= 0 else None

    def backward_after(self, pos: int) -> Pass | None:
        """The first backward pass that starts after ``pos``, in the same step."""
        i = self.pass_index(pos)
        if i < 0:
            return None
        found = self.next_backward[i]
        if found is not None and found.start <= pos:  # pos lies inside that backward
            j = i + 1
            found = self.next_backward[j] if j < len(self.passes) else None
            if found is not None and found.step != self.passes[i].step:
                found = None
        return found


def _marking_notes(
    log: EventLog, peak: dict[str, Any], module_peak: dict[str, Any] | None
) -> list[str]:
    """What the report says when some steps placed no module markers."""
    schedule = log.meta.get("module_steps") or {}
    if not schedule.get("unmarked_steps"):
        return []
    marked = schedule.get("marked_steps") or []
    count = sum(b - a + 1 for a, b in marked)
    why = _marking_why(schedule)
    windowed = (log.meta.get("trace") or {}).get("windows") is not None
    covered = (
        "phase peaks cover every step; the allocator's trace (module tables, peak tensors and "
        "the categories' split) runs in the marked steps only"
        if windowed
        else "phase peaks and categories cover every step"
    )
    notes = [
        f"module markers were placed in {count:,} of {plural(schedule.get('steps') or 0, 'step')} "
        f"({ranges(marked)}): {why}; {covered} (--module-steps all marks every step)"
    ]
    if module_peak is not None:
        notes.append(_unmarked_peak_note(peak["step"], peak["allocated_bytes"], module_peak))
    return notes


def _marking_why(schedule: dict[str, Any]) -> str:
    """Why those steps, in the schedule's own terms (:mod:`vramscope.tracking.marking`)."""
    policy, interval = schedule.get("policy"), schedule.get("interval")
    first = f"the first {plural(FIRST_STEPS, 'step')}"
    if policy == "auto":
        timed = f"{first}, then every other step while their cost was timed"
        if (schedule.get("steps") or 0) <= SETTLED:  # the run ended before a spacing was set
            return timed
        timed += ", then "
        if interval == 1:
            return timed + f"every step but one in {PROBE_EVERY} (they add under 2% to a step)"
        return timed + f"one step in every {interval}, which keeps their cost near 2% of a step"
    return f"{first}, then one step in every {policy} (--module-steps {policy})"


def _unmarked_peak_note(step: int | None, run_peak: int, module_peak: dict[str, Any]) -> str:
    gap = run_peak - module_peak["allocated_bytes"]
    return (
        f"the run's peak was in step {step if step is not None else '?'}, which has no module "
        f"markers; the module tables and peak tensors describe the highest point of a marked "
        f"step (step {module_peak['step']}, {module_peak['phase']}), "
        + ("the same bytes" if gap == 0 else f"{gap} bytes below the run's peak")
    )


def _priority(category: str) -> int:
    return CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES)


def category_of(replay: _Replay, b: Block) -> str:
    """The category of one block: by its census label (the objects' storages), or else by
    its lifetime (activations, temporaries, other; never an object category)."""
    if b.label is not None:
        return b.label[0]
    if b.alloc < 0:
        return "other"
    phase = b.phase
    if phase == "forward":
        backward = replay.backward_after(b.alloc)
        if backward is not None and (b.free is None or b.free > backward.start):
            return "activations"
        return "temporaries"
    if phase in ("backward", "optimizer"):
        return "temporaries"
    return "other"


def _categories(replay: _Replay, live: list[Block]) -> dict[str, int]:
    totals = dict.fromkeys(CATEGORIES, 0)
    for b in live:
        totals[category_of(replay, b)] += b.size
    return totals


# ---- modules ---------------------------------------------------------------------------------------


def _main_root(table: list[dict[str, Any]], replay: _Replay) -> int:
    """The model with the most parameter bytes (by the labelled blocks)."""
    roots = [i for i, m in enumerate(table) if m.get("parent", -1) == -1 and not m.get("name")]
    if not roots:
        return -1
    totals = dict.fromkeys(roots, 0)
    for b in replay.blocks.values():
        if b.label is not None and b.label[0] == "parameters" and 0 <= b.label[1] < len(table):
            root = table[b.label[1]].get("root", -1)
            if root in totals:
                totals[root] += b.size
    return max(roots, key=lambda r: (totals[r], -r))


def _display_name(index: int, table: list[dict[str, Any]], main_root: int) -> str:
    m = table[index]
    root = m.get("root", index)
    if root == main_root or root < 0 or root >= len(table):
        return m.get("name", "")
    prefix = table[root].get("label") or f"<{table[root].get('class', '?')}>"
    return f"{prefix}.{m['name']}" if m.get("name") else prefix


def _ancestors(index: int, table: list[dict[str, Any]]) -> list[int]:
    chain = []
    seen = set()
    while 0 <= index < len(table) and index not in seen:
        chain.append(index)
        seen.add(index)
        index = table[index].get("parent", -1)
    return chain


def _module_rows(
    replay: _Replay,
    table: list[dict[str, Any]],
    names: list[str],
    main_root: int,
    depth: int,
    peak_blocks: list[Block],
) -> list[dict[str, Any]]:
    if not table:
        return []
    n = len(table)
    ancestors = [_ancestors(i, table) for i in range(n)]
    children: dict[int, list[int]] = {}
    for i, m in enumerate(table):
        children.setdefault(m.get("parent", -1), []).append(i)

    # what each module's subtree holds at the peak: its labelled blocks alive there (the
    # same blocks the categories count, so the tree adds up to them)
    held = {c: [0] * n for c in ("parameters", "buffers", "gradients", "optimizer_state")}
    outside_held = dict.fromkeys(held, 0)
    for b in peak_blocks:
        if b.label is None or b.label[0] not in held:
            continue
        if 0 <= b.label[1] < n:
            for a in ancestors[b.label[1]]:
                held[b.label[0]][a] += b.size
        else:  # an optimizer's parameter that no model owns
            outside_held[b.label[0]] += b.size
    params, buffers = held["parameters"], held["buffers"]
    grads, opt = held["gradients"], held["optimizer_state"]
    backward = _reference_backward(replay)
    # the step the per-module numbers describe: the peak's, or when the peak fell where no
    # backward follows (before the first, after the last), the last step with a backward
    step = backward.step if backward is not None else replay.peak_step

    # activations: allocated in a forward of that step, alive when its backward begins
    activations = [0] * n
    outside = {"activations_bytes": 0, "temporaries_at_peak_bytes": 0, "share_bytes": 0}
    if backward is not None:
        for b in replay.blocks.values():
            if (
                b.phase == "forward"
                and b.step == step
                and b.alloc < backward.start
                and (b.free is None or b.free > backward.start)
                and b.label is None
            ):
                if not b.stack:
                    outside["activations_bytes"] += b.size
                for m in set(b.stack):
                    if 0 <= m < n:
                        activations[m] += b.size

    # forward: per call, the highest sum of blocks made and freed inside it; calls per step
    fwd_temp = [0] * n
    fwd_peak = [0] * n
    calls = [0] * n
    calls_total = [0] * n
    recomputes = [0] * n
    for call in replay.calls:
        m = call.module
        if not 0 <= m < n:
            continue
        if call.recompute:
            recomputes[m] += 1 if call.step == step else 0
            continue
        calls_total[m] += 1
        if call.step != step:
            continue
        calls[m] += 1
        fwd_temp[m] = max(fwd_temp[m], call.temporaries_peak)
        fwd_peak[m] = max(fwd_peak[m], call.peak_allocated)

    # backward: blocks made while the gradient was in the module's subtree (recomputation
    # included); the highest sum of those freed before the backward ended, over every
    # backward pass (a module's backward temporaries are the same each step; the highest
    # is its peak)
    bwd_temp = [0] * n
    bwd_peak = [0] * n
    per_module_events: dict[int, list[tuple[int, int]]] = {}
    for p in replay.passes:
        if p.phase != "backward":
            continue
        end = p.end if p.end is not None else replay.end
        for b in replay.blocks.values():
            if not p.start <= b.alloc < end or b.owner < 0 or b.owner >= n:
                continue
            transient = b.free is not None and b.free < end
            for a in ancestors[b.owner]:
                events = per_module_events.setdefault(a, [])
                if transient:
                    events.append((b.alloc, b.size))
                    events.append((b.free, -b.size))  # type: ignore[arg-type]
        for m, events in per_module_events.items():
            events.sort()
            cur = peak = 0
            for _, delta in events:
                cur += delta
                peak = max(peak, cur)
            bwd_temp[m] = max(bwd_temp[m], peak)
        per_module_events.clear()
        for call_owner, level in _backward_levels(replay, p, end):
            for a in ancestors[call_owner] if 0 <= call_owner < n else []:
                bwd_peak[a] = max(bwd_peak[a], level)

    # share of the peak: live blocks at the peak owned by the module's subtree
    share_bytes = [0] * n
    peak_total = replay.peak or 0
    for b in peak_blocks:
        owners: list[int] = []
        if b.label is not None:
            owners = ancestors[b.label[1]] if 0 <= b.label[1] < n else []
        elif b.phase == "forward" or (b.phase == "backward" and b.stack):
            owners = sorted(set(b.stack) | {a for m in b.stack[-1:] for a in ancestors[m]})
        elif b.phase == "backward" and 0 <= b.owner < n:
            owners = ancestors[b.owner]
        if not owners and (b.label is not None or b.phase in ("forward", "backward")):
            outside["share_bytes"] += b.size
        for m in owners:
            if 0 <= m < n:
                share_bytes[m] += b.size

    rows: list[dict[str, Any]] = []

    def row(i: int) -> dict[str, Any]:
        m = table[i]
        return {
            "name": names[i],
            "class": m.get("class", "?"),
            # the model's name in the user's code, for the main model (its name is "")
            **({"label": m["label"]} if not names[i] and m.get("label") else {}),
            "depth": m.get("depth", 0),
            "parameters_bytes": params[i],
            "buffers_bytes": buffers[i],
            "gradients_bytes": grads[i],
            "optimizer_state_bytes": opt[i],
            "activations_bytes": activations[i],
            "forward_temporaries_peak_bytes": fwd_temp[i],
            "backward_temporaries_peak_bytes": bwd_temp[i],
            "forward_peak_allocated_bytes": fwd_peak[i] or None,
            "backward_peak_allocated_bytes": bwd_peak[i] or None,
            "share_of_peak": round(share_bytes[i] / peak_total, 4) if peak_total else 0.0,
            "peak_bytes": share_bytes[i],
            "calls": calls[i],
            "calls_total": calls_total[i],
            "recomputed": recomputes[i],
        }

    def weight(i: int) -> tuple[float, int]:
        return (
            share_bytes[i],
            params[i] + grads[i] + opt[i] + activations[i] + max(fwd_temp[i], bwd_temp[i]),
        )

    def walk(i: int) -> None:
        r = row(i)
        if r["depth"] > depth:
            return
        rows.append(r)
        for c in sorted(children.get(i, []), key=weight, reverse=True):
            walk(c)

    roots = [i for i in children.get(-1, []) if not table[i].get("name")]
    roots.sort(key=lambda r: (r != main_root, *(-x for x in weight(r))))
    for r in roots:
        if r != main_root and weight(r) == (0, 0) and not calls_total[r]:
            continue
        walk(r)
    if outside["activations_bytes"] or outside["share_bytes"] or any(outside_held.values()):
        rows.append(
            {
                "name": OUTSIDE,
                "class": "",
                "depth": 0,
                **{f"{c}_bytes": v for c, v in outside_held.items()},
                "activations_bytes": outside["activations_bytes"],
                "forward_temporaries_peak_bytes": 0,
                "backward_temporaries_peak_bytes": 0,
                "forward_peak_allocated_bytes": None,
                "backward_peak_allocated_bytes": None,
                "share_of_peak": round(outside["share_bytes"] / peak_total, 4)
                if peak_total
                else 0.0,
                "peak_bytes": outside["share_bytes"],
                "calls": 0,
                "calls_total": 0,
                "recomputed": 0,
            }
        )
    return rows


def _reference_backward(replay: _Replay) -> Pass | None:
    """The backward whose start defines "saved for backward" for the peak step."""
    step, pos = replay.peak_step, replay.peak_pos
    backwards = [p for p in replay.passes if p.phase == "backward" and p.step == step]
    if not backwards:
        # the peak is in no step with a backward (e.g. at the log's start, where memory freed
        # during the run, such as a previous model collected by gc, was still live): the
        # first backward after it, else the last one before it
        anywhere = [p for p in replay.passes if p.phase == "backward"]
        later = [p for p in anywhere if p.start >= pos]
        if later:
            return later[0]
        return anywhere[-1] if anywhere else None
    for p in backwards:
        end = p.end if p.end is not None else replay.end
        if p.start <= pos < end:
            return p
    after = [p for p in backwards if p.start >= pos]
    if after:
        return after[0]
    return backwards[-1]


def _backward_levels(replay: _Replay, p: Pass, end: int) -> list[tuple[int, int]]:
    """(owner, allocated level) after each backward allocation of one pass."""
    level = 0
    events: list[tuple[int, int, int]] = []  # (pos, delta, owner)
    live_before = 0
    for b in replay.blocks.values():
        if b.alloc < p.start and (b.free is None or b.free >= p.start):
            live_before += b.size
        if p.start <= b.alloc < end:
            events.append((b.alloc, b.size, b.owner))
        if b.free is not None and p.start <= b.free < end and b.alloc < end:
            events.append((b.free, -b.size, -1))
    events.sort()
    level = live_before
    out = []
    for _, delta, owner in events:
        level += delta
        if delta > 0 and owner >= 0:
            out.append((owner, level))
    return out


def _block_labels(replay: _Replay, names: list[str]) -> dict[int, tuple[str, str, str]]:
    out = {}
    for b in replay.blocks.values():
        module = b.label[1] if b.label is not None else b.owner
        name = names[module] if 0 <= module < len(names) else OUTSIDE
        if 0 <= module < len(names) and not name:
            name = replay.log.modules[module].get("class", "model")
        phase = b.phase if b.alloc >= 0 else "before tracking"
        if b.phase == "backward" and b.stack:
            phase = "backward (recomputed forward)"
        out[b.block] = (name, phase, category_of(replay, b))
    return out


# ---- peak tensors -------------------------------------------------------------------------------


def _peak_tensors(
    replay: _Replay,
    live: list[Block],
    categories: dict[str, int],
    names: list[str],
    top: int,
) -> list[dict[str, Any]]:
    frames = replay.log.frames
    biggest = sorted(live, key=lambda b: (-b.size, b.alloc))[:top]
    out = []
    for b in biggest:
        module = b.label[1] if b.label is not None else b.owner
        frame = frames[b.frame] if 0 <= b.frame < len(frames) else None
        line = f"{frame[0]}:{frame[1]} ({frame[2]})" if frame else None
        if line is None:  # no stack recorded: the forward of the module that made it
            maker = b.owner if b.owner >= 0 else (b.stack[-1] if b.stack else -1)
            if 0 <= maker < len(replay.log.modules):
                line = replay.log.modules[maker].get("code")
        out.append(
            {
                "bytes": b.size,
                "category": category_of(replay, b),
                "module": names[module] if 0 <= module < len(names) else None,
                "name": b.label[2] if b.label is not None else None,
                "phase": b.phase if b.alloc >= 0 else "before tracking",
                "step": b.step,
                "shape": b.shape if b.shape is not None else b.label_shape,
                "dtype": b.dtype if b.dtype is not None else b.label_dtype,
                "line": line,
            }
        )
    return out


# ---- lines ----------------------------------------------------------------------------------------


def _line_tables(replay: _Replay, log: EventLog) -> list[dict[str, Any]]:
    tables = []
    for index, code in enumerate(log.codes):
        source: dict[str, str] = code.get("source", {})
        numbers = sorted(
            {int(n) for n in source} | {ln for c, ln in replay.line_stats if c == index}
        )
        if not numbers:
            continue
        rows = []
        for n in numbers:
            stats = replay.line_stats.get((index, n))
            row = {"line": n, "contents": source.get(str(n), "")}
            if stats is not None:
                row.update(stats)
            rows.append(row)
        tables.append(
            {
                "file": code.get("file"),
                "function": code.get("function"),
                "first_line": code.get("first_line"),
                "device": log.device,
                "lines": rows,
            }
        )
    return tables


# ---- into the report ------------------------------------------------------------------------------


def apply_to_report(report: Any, analysis: dict[str, Any], detail: str) -> None:
    """Put an analysis into a Report: the module tree, peak tensors, line tables and what
    they describe. What the peak is made of is settled in one place (tracking/peak.py), from
    the same analysis when it holds the run's peak."""
    notes = list(analysis.get("notes", []))
    report.modules = analysis["modules"]
    report.extra["peak_tensors"] = analysis["peak_tensors"]
    if analysis["lines"]:
        report.extra["lines"] = analysis["lines"]
    peak = analysis["peak"]["allocated_bytes"]
    report.extra["attribution"] = {
        "detail": detail,
        "source": analysis["source"],
        "peak_bytes": peak,
        "peak_step": analysis["peak"]["step"],
        "peak_phase": analysis["peak"]["phase"],
        "categories": analysis["categories"],
        "stats": analysis["stats"],
        "module_steps": analysis.get("module_steps"),
        "module_peak": analysis.get("module_peak"),
    }
    report.extra["attribution_notes"] = notes + report.extra.get("attribution_notes", [])


def unmarked_peak_note(report: Any, analysis: dict[str, Any]) -> str:
    """The trace holds another highest point than the run's peak (its step ran without
    markers): say what the module tables describe, in ``extra.attribution`` and in words."""
    run_peak = report.peak.allocated_bytes
    marked = {k: analysis["peak"][k] for k in ("allocated_bytes", "step", "phase")}
    attribution = report.extra.get("attribution")
    if attribution is not None:
        attribution["module_peak"] = marked
        attribution.update(
            peak_bytes=run_peak, peak_step=report.peak.step, peak_phase=report.peak.phase
        )
    return _unmarked_peak_note(report.peak.step, run_peak, marked)
