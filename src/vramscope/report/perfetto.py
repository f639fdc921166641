"""A Report as a Chrome/Perfetto trace (Trace Event Format): memory counters, phases, steps.

Open the file in https://ui.perfetto.dev or chrome://tracing. Timestamps are microseconds
since the run began. Counters ("ph": "C") carry one series each; phases are complete
slices ("ph": "X"); step and epoch boundaries are instant events ("ph": "i"); metadata
("ph": "M") names the process and its tracks. Knows nothing of torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vramscope.report.html import categories_over_time, workload_title
from vramscope.report.model import CATEGORY_NAMES, Report

PID = 1
TID_PHASES = 1
TID_STEPS = 2
TID_MARKERS = 3

COUNTERS = (
    ("allocated_bytes", "allocated"),
    ("reserved_bytes", "reserved"),
    ("device_used_bytes", "device used"),
    ("host_rss_bytes", "host RSS"),
)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _slice(
    name: str, cat: str, tid: int, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    """A complete slice ("ph": "X") on one of the run's tracks."""
    return {"ph": "X", "name": name, "cat": cat, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def _counter(name: str, ts: float, value: float) -> dict[str, Any]:
    """One point of a counter track ("ph": "C"), in bytes."""
    return {"ph": "C", "name": name, "pid": PID, "tid": 0, "ts": ts, "args": {"bytes": int(value)}}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# an estimate has no clock: its steps' phases are laid out in order, each this long
ESTIMATE_PHASE_US = 1000.0


def _estimate_events(report: Report) -> list[dict[str, Any]]:
    """An estimate's steps and phases in their order, ``ESTIMATE_PHASE_US`` each (it has no
    time axis), with its allocated and reserved memory at each phase's start and peak."""
    events: list[dict[str, Any]] = []
    at = 0.0
    for step in report.steps:
        start = at
        for phase in step.phases:
            points = (
                (at, "allocated", phase.start_allocated_bytes),
                (at + ESTIMATE_PHASE_US / 2, "allocated", phase.peak_allocated_bytes),
                (at + ESTIMATE_PHASE_US / 2, "reserved", phase.peak_reserved_bytes),
            )
            events += [_counter(name, ts, v) for ts, name, v in points if _finite(v)]
            args = {
                "step": step.index,
                "peak_allocated_bytes": phase.peak_allocated_bytes,
                "peak_reserved_bytes": phase.peak_reserved_bytes,
            }
            events.append(_slice(phase.name, "phase", TID_PHASES, at, ESTIMATE_PHASE_US, args))
            at += ESTIMATE_PHASE_US
        args = {
            "peak_allocated_bytes": step.peak_allocated_bytes,
            "peak_reserved_bytes": step.peak_reserved_bytes,
        }
        events.append(_slice(f"step {step.index}", "step", TID_STEPS, start, at - start, args))
    return events


def trace_events(report: Report) -> list[dict[str, Any]]:
    """Every event of the trace, metadata first. An estimate's (no clock): its steps'
    phases in order, a millisecond each, and memory at each phase's start and peak."""
    device = report.device.get("name") or report.device.get("type") or "device"
    if report.kind == "estimated" and not report.timeline.t:
        device += " (an estimate: its phases in order, 1 ms each, not their durations)"
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": PID,
            "tid": 0,
            "args": {"name": f"vramscope: {workload_title(report)} on {device}"},
        },
        {
            "ph": "M",
            "name": "thread_name",
            "pid": PID,
            "tid": TID_PHASES,
            "args": {"name": "phases"},
        },
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID_STEPS, "args": {"name": "steps"}},
        {
            "ph": "M",
            "name": "thread_name",
            "pid": PID,
            "tid": TID_MARKERS,
            "args": {"name": "step and epoch boundaries"},
        },
    ]
    for tid, order in ((TID_PHASES, 1), (TID_STEPS, 2), (TID_MARKERS, 3)):
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": PID,
                "tid": tid,
                "args": {"sort_index": order},
            }
        )
    tl = report.timeline
    if report.kind == "estimated" and not tl.t:
        return events + _estimate_events(report)
    for field, name in COUNTERS:
        values = getattr(tl, field)
        for t, v in zip(tl.t, values, strict=False):
            if _finite(t) and _finite(v):
                events.append(_counter(name, _us(t), v))
    cats = categories_over_time(report)
    if cats is not None:
        for category in CATEGORY_NAMES:
            if category not in cats:
                continue
            for t, v in zip(cats["t"], cats[category], strict=False):
                if _finite(t) and _finite(v):
                    events.append(_counter(category.replace("_", " "), _us(t), v))
    for band in tl.phases:
        start, end = band.get("start_s"), band.get("end_s")
        if not (_finite(start) and _finite(end)):
            continue
        name, dur = str(band.get("name", "other")), max(0.0, _us(end) - _us(start))
        events.append(
            _slice(name, "phase", TID_PHASES, _us(start), dur, {"step": band.get("step")})
        )
    for step in report.steps:
        if not _finite(step.start_s) or not step.duration_s:
            continue
        args = {
            key: value
            for key, value in (
                ("epoch", step.epoch),
                ("mode", step.mode),
                ("peak_allocated_bytes", step.peak_allocated_bytes),
                ("peak_reserved_bytes", step.peak_reserved_bytes),
                ("start_allocated_bytes", step.start_allocated_bytes),
                ("end_allocated_bytes", step.end_allocated_bytes),
                ("host_rss_bytes", step.host_rss_bytes),
            )
            if value is not None
        }
        events.append(
            _slice(f"step {step.index}", "step", TID_STEPS, _us(step.start_s),
                   _us(step.duration_s), args)
        )  # fmt: skip
    for marker in tl.markers:
        if not _finite(marker.get("t")):
            continue
        kind = str(marker.get("kind", "marker"))
        events.append(
            {
                "ph": "i",
                "s": "p" if kind == "epoch" else "t",
                "name": f"{kind} {marker.get('index', '')}".strip(),
                "cat": kind,
                "pid": PID,
                "tid": TID_MARKERS,
                "ts": _us(marker["t"]),
            }
        )
    return events


def to_trace(report: Report) -> dict[str, Any]:
    """The trace as a JSON-ready dict (the object form of the Trace Event Format)."""
    p = report.peak
    metadata = {
        "vramscope_version": report.vramscope_version,
        "report_schema": report.schema,
        "workload": workload_title(report),
        "device": report.device.get("name"),
        "peak_allocated_bytes": p.allocated_bytes,
        "peak_reserved_bytes": p.reserved_bytes,
        "peak_device_used_bytes": p.device_used_bytes,
        "peak_host_rss_bytes": p.host_rss_bytes,
        "dropped_phase_bands": report.timeline.dropped_phase_bands,
    }
    return {"traceEvents": trace_events(report), "displayTimeUnit": "ms", "metadata": metadata}


def write(report: Report, path: str | Path) -> Path:
    """Write the trace as JSON to ``path``."""
    target = Path(path)
    target.write_text(json.dumps(to_trace(report), separators=(",", ":")) + "\n", encoding="utf-8")
    return target
