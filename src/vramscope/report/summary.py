"""A Report in a few lines for notebooks and the REPL: an escaped HTML table, or plain text.

It reads the report's JSON form (``Report.to_dict()`` or a loaded file), so the model can
offer it without the two modules importing each other.
"""

from __future__ import annotations

import html
from typing import Any

from vramscope.units import format_bytes

MAX_FINDINGS = 5


def title(report: dict[str, Any]) -> str:
    w, d = report.get("workload") or {}, report.get("device") or {}
    spec = w.get("spec") or w.get("script") or w.get("name") or "tracked code"
    device = str(d.get("name") or d.get("type") or "?")
    if d.get("total_bytes"):
        device += f" ({format_bytes(d['total_bytes'])})"
    return f"vramscope · {report.get('kind', 'measured')} · {spec} · {device}"


def _categories(categories: dict[str, Any]) -> str:
    values = {name: value for name, value in categories.items() if value}
    total = sum(values.values())
    parts = []
    for name, value in values.items():
        share = 100 * value / total
        shown = f"{share:.0f}%" if share >= 1 else "<1%"
        parts.append(f"{name.replace('_', ' ')} {format_bytes(value)} ({shown})")
    return ", ".join(parts)


def rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs: the peak, what it is made of, steps and epochs, how it ended."""
    p = report.get("peak") or {}
    where = f" at step {p['step']}, {p['phase']}" if p.get("phase") else ""
    found: list[tuple[str, str]] = []
    if p.get("allocated_bytes") is not None:
        found.append(("peak allocated", format_bytes(p["allocated_bytes"]) + where))
        found.append(("peak reserved", format_bytes(p.get("reserved_bytes"))))
    if p.get("device_used_bytes") is not None:
        found.append(("device used (nvidia-smi)", format_bytes(p["device_used_bytes"])))
    if p.get("host_rss_bytes") is not None:
        found.append(("host RSS (process tree)", format_bytes(p["host_rss_bytes"])))
    made_of = _categories(report.get("categories_at_peak") or {})
    if made_of:
        found.append(("at the peak", made_of))
    steps = report.get("steps") or []
    if steps:
        train = sum(s.get("mode") == "train" for s in steps)
        text = f"{len(steps)} ({train} train, {len(steps) - train} eval)"
        if len(report.get("epochs") or []) > 1:
            text += f" in {len(report['epochs'])} epochs"
        found.append(("steps", text))
    end = report.get("exit") or {}
    if end.get("status", "ok") != "ok":
        found.append(("run ended", f"{end['status']}: {end.get('error') or ''}".rstrip()))
    return found


def notes(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(severity, message): the findings first, then why CUDA figures are missing."""
    findings = report.get("findings") or []
    found = [(f.get("severity", "info"), f.get("message", "")) for f in findings[:MAX_FINDINGS]]
    if len(findings) > MAX_FINDINGS:
        found.append(("info", f"{len(findings) - MAX_FINDINGS} more findings in the report"))
    why = (report.get("unavailable") or {}).get("peak.allocated_bytes")
    if why:
        found.append(("info", f"CUDA figures n/a: {why}"))
    return found


_COLORS = {"error": "#b91c1c", "warning": "#a16207", "info": "#374151"}


def to_html(report: dict[str, Any]) -> str:
    """A small table (no scripts, no plotly); every text from the run is escaped."""
    e = html.escape
    cells = "".join(
        f'<tr><th style="text-align:left;padding:2px 12px 2px 0;font-weight:600">{e(label)}</th>'
        f'<td style="text-align:left;padding:2px 0">{e(value)}</td></tr>'
        for label, value in rows(report)
    )
    items = "".join(
        f'<li style="color:{_COLORS.get(severity, "#374151")}">{e(message)}</li>'
        for severity, message in notes(report)
    )
    listing = f'<ul style="margin:4px 0 0 0;padding-left:18px">{items}</ul>' if items else ""
    return (
        '<div class="vramscope-summary" style="font-family:system-ui,sans-serif;font-size:13px">'
        f'<div style="font-weight:700;margin-bottom:4px">{e(title(report))}</div>'
        f'<table style="border-collapse:collapse;font-size:13px">{cells}</table>{listing}</div>'
    )


def to_text(report: dict[str, Any]) -> str:
    found = rows(report)
    width = max((len(label) for label, _ in found), default=0)
    lines = [title(report)]
    lines += [f"  {label.ljust(width)}  {value}" for label, value in found]
    lines += [f"  • {message}" for _, message in notes(report)]
    return "\n".join(lines)
