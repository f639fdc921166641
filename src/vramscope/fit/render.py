"""Terminal tables for the ``fit`` section of a report (fit and compare); no torch here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vramscope.report.model import Finding
from vramscope.units import format_bytes as b


def _peak_cells(peak: dict[str, Any]) -> list[str]:
    return [
        b(peak.get("allocated_bytes")),
        b(peak.get("reserved_bytes")),
        b(peak.get("device_used_bytes")),
    ]


def render_fit(section: dict[str, Any], findings: Sequence[Finding] = ()) -> Group:
    """The fit section as tables; ``findings``: the report's, of which the fit warnings and
    errors (what a budget would need, the closest strategy, the edge of memory) are shown."""
    parts: list[Any] = []
    for f in findings:
        if f.kind == "fit" and f.severity in ("warning", "error"):
            style = "red" if f.severity == "error" else "yellow"
            parts.append(Text(f"{f.severity}: {f.message}", style=style))
    target = section.get("target", {})
    if "max_batch_size" in section:
        text = Text()
        text.append(f"Largest batch size: {section['max_batch_size']}", style="bold green")
        text.append(
            f"  (without the {target.get('margin', 0):.0%} margin: "
            f"{section.get('max_batch_size_without_margin')}; {section.get('method')}, "
            f"{section.get('estimates', 0)} estimates)"
        )
        verify = section.get("verify")
        if verify:
            if verify.get("max_batch_size") is not None:
                text.append(
                    f"\nVerified with {verify.get('real_trials')} real trials: {verify['max_batch_size']}",
                    style="bold",
                )
            else:
                text.append(f"\nVerify: {verify.get('error')}", style="red")
        parts.append(text)
        curve = section.get("curve") or []
        if curve:
            t = Table(box=box.SIMPLE_HEAD, title="Estimated memory by batch size")
            for col in ("batch", "allocated", "reserved", "device used", "fits"):
                t.add_column(col, justify="right")
            for point in curve:
                fits = point.get("fits")
                t.add_row(
                    str(point["batch_size"]),
                    *_peak_cells(point["peak"]),
                    "" if fits is None else "yes" if fits else "no",
                )
            parts.append(t)
    plans = section.get("plans")
    if plans:
        t = Table(box=box.SIMPLE_HEAD, title="micro-batch × accumulation plans")
        for col in ("micro-batch", "accumulate", "allocated", "reserved", "device used", "fits"):
            t.add_column(col, justify="right")
        for p in plans:
            t.add_row(
                str(p["micro_batch"]),
                str(p["accumulate"]),
                *_peak_cells(p["peak"]),
                "yes" if p["fits"] else "no",
            )
        parts.append(t)
        rec = section.get("recommended_plan")
        if rec:
            parts.append(
                Text(
                    f"Recommended: micro-batch {rec['micro_batch']} × {rec['accumulate']} accumulation steps",
                    style="bold",
                )
            )
    rows = section.get("strategies")
    if rows:
        method = section.get("method", "estimated")
        timed = any(r.get("step_time_s") for r in rows)
        noted = any(r.get("error") or r.get("skipped") for r in rows)
        columns = ["strategy", "allocated", "reserved", "device used", "saving", "fits"]
        columns += ["step time"] if timed else []
        columns += ["note"] if noted else []
        t = Table(
            box=box.SIMPLE_HEAD, title=f"Strategies at batch {section.get('batch_size')} ({method})"
        )
        for col in columns:
            t.add_column(
                col,
                justify="left" if col in ("strategy", "note") else "right",
                no_wrap=col != "note",
            )
        for r in rows:
            if "skipped" in r:
                t.add_row(r["name"], *([""] * (len(columns) - 2)), f"skipped: {r['skipped']}")
                continue
            saving = r.get("saving_pct", {}).get("reserved_bytes")
            cells = [
                r["name"],
                *_peak_cells(r["peak"]),
                f"{saving:+.1f}%" if saving is not None else "",
            ]
            cells.append("yes" if r.get("fits") else "no")
            if timed:
                cells.append(f"{r['step_time_s'] * 1000:.0f} ms" if r.get("step_time_s") else "")
            if noted:
                cells.append(r.get("error") or "")
            t.add_row(*cells)
        parts.append(t)
        rec = section.get("recommendation", {})
        if rec.get("message"):
            parts.append(Text(rec["message"], style="bold"))
    diff = section.get("module_diff")
    if diff:
        labels = [k for k in diff[0] if k not in ("name", "difference_bytes")]
        t = Table(box=box.SIMPLE_HEAD, title="Per-module difference between the variants")
        t.add_column("module")
        for label in labels:
            t.add_column(label, justify="right")
        t.add_column("difference", justify="right")
        for row in diff[:20]:
            t.add_row(
                row["name"] or "(model)",
                *(b(row.get(label)) for label in labels),
                b(row.get("difference_bytes"), signed=True),
            )
        parts.append(t)
    return Group(*parts)
