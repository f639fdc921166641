"""The steps of a Report as CSV: one row per step entry, per-phase peaks as columns."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from vramscope.report.model import PHASE_NAMES, Report

STEP_COLUMNS = (
    "index",
    "epoch",
    "mode",
    "micro_batches",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "start_allocated_bytes",
    "end_allocated_bytes",
    "host_rss_bytes",
    "duration_s",
    "start_s",
    "count",  # steps the row stands for (a long run's later steps, unread short steps)
    "last_index",
)


def phase_names(report: Report) -> list[str]:
    """Phases that occur in any step: the known ones in step order, then any others."""
    seen = {p.name for s in report.steps for p in s.phases}
    known = [name for name in PHASE_NAMES if name in seen]
    return known + sorted(seen - set(known))


def columns(report: Report) -> list[str]:
    return list(STEP_COLUMNS) + [f"{name}_peak_allocated_bytes" for name in phase_names(report)]


def rows(report: Report) -> list[list[object]]:
    """One row per step; empty cells for values that were not measured."""
    names = phase_names(report)
    # an estimate has no clock: its steps' times were not measured (empty, not 0.0)
    unmeasured = {"duration_s", "start_s"} if report.kind == "estimated" else set()
    out: list[list[object]] = []
    for step in report.steps:
        row: list[object] = [None if c in unmeasured else getattr(step, c) for c in STEP_COLUMNS]
        for name in names:
            peaks = [
                p.peak_allocated_bytes
                for p in step.phases
                if p.name == name and p.peak_allocated_bytes is not None
            ]
            row.append(max(peaks) if peaks else None)
        out.append(["" if v is None else v for v in row])
    return out


def render(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns(report))
    writer.writerows(rows(report))
    return buffer.getvalue()


def write(report: Report, path: str | Path) -> Path:
    """Write the steps as CSV to ``path``."""
    target = Path(path)
    target.write_text(render(report), encoding="utf-8", newline="")
    return target
