"""Write a memory snapshot that PyTorch's memory viewer (pytorch.org/memory_viz) opens,
with vramscope's module, phase and category on every allocation.

On CUDA this is the allocator's own snapshot (``torch.cuda.memory._snapshot()``, taken when
tracking stopped): each allocation and free gets a first stack frame
``vramscope: MODULE · PHASE · CATEGORY`` and a ``category`` (the viewer colours by it). On the
CPU the snapshot is built from the recorded storages (the "Active Memory Timeline" view).
Pickled with protocol 4, which the viewer's own unpickler reads.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from vramscope.tracking.events import ALLOC, FREE, EventLog

LABEL_FILE = "vramscope"


def _frame(label: tuple[str, str, str]) -> dict[str, Any]:
    module, phase, category = label
    return {
        "filename": LABEL_FILE,
        "line": 0,
        "name": f"{module or '(model)'} · {phase} · {category}",
    }


def _labelled(entry: dict[str, Any], label: tuple[str, str, str] | None) -> None:
    if label is None:
        entry["category"] = "unknown"
        return
    entry["frames"] = [_frame(label), *(entry.get("frames") or [])]  # frames lists are shared
    entry["category"] = label[2]


def annotate_cuda_snapshot(
    snapshot: dict[str, Any], device_index: int, labels: dict[int, tuple[str, str, str]]
) -> dict[str, Any]:
    """Label the trace entries and live blocks of the allocator's snapshot (in place)."""
    traces = snapshot.get("device_traces") or []
    live: dict[int, tuple[str, str, str] | None] = {}
    if device_index < len(traces):
        k = 0
        for entry in traces[device_index]:
            action = entry.get("action")
            addr = entry.get("addr")
            if action == "alloc":
                label = labels.get(k)
                k += 1
                live[addr] = label
                _labelled(entry, label)
            elif action in ("free_requested", "free_completed"):
                _labelled(entry, live.get(addr))
    for segment in snapshot.get("segments", []):
        if segment.get("device", device_index) != device_index:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated":
                label = live.get(block.get("address"))
                if label is not None:
                    block["frames"] = [_frame(label), *(block.get("frames") or [])]
    _ensure_unknown(snapshot)
    return snapshot


def cpu_snapshot(log: EventLog, labels: dict[int, tuple[str, str, str]]) -> dict[str, Any]:
    """A snapshot of the CPU run's storages, for the viewer's Active Memory Timeline."""
    trace: list[dict[str, Any]] = []
    addr_of: dict[int, tuple[int, int]] = {}
    frames = log.frames
    for block, addr, size in log.baseline:
        addr_of[block] = (addr, size)
        entry = {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": []}
        _labelled(entry, labels.get(block))
        trace.append(entry)
    for record in log.records:
        if record[0] == ALLOC:
            _, block, addr, size, frame = record[:5]
            addr_of[block] = (addr, size)
            stack = []
            if 0 <= frame < len(frames):
                f = frames[frame]
                stack = [{"filename": f[0], "line": f[1], "name": f[2]}]
            entry = {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": stack}
            _labelled(entry, labels.get(block))
            trace.append(entry)
        elif record[0] == FREE and record[1] in addr_of:
            addr, size = addr_of.pop(record[1])
            entry = {"action": "free_completed", "addr": addr, "size": size, "stream": 0}
            _labelled(entry, labels.get(record[1]))
            trace.append(entry)
    snapshot = {"segments": [], "device_traces": [trace]}
    _ensure_unknown(snapshot)
    return snapshot


def _ensure_unknown(snapshot: dict[str, Any]) -> None:
    """The viewer expects the category "unknown" whenever categories are used."""
    for trace in snapshot.get("device_traces") or []:
        if any(e.get("category") == "unknown" for e in trace):
            return
    traces = snapshot.setdefault("device_traces", [[]])
    target = next((t for t in traces if t), traces[0] if traces else None)
    if target is None:
        traces.append(target := [])
    target.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "category": "unknown"})


def write_snapshot(path: str | Path, snapshot: dict[str, Any]) -> Path:
    target = Path(path)
    with target.open("wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return target
