"""A Report in a few lines for notebooks and the REPL: an escaped HTML table, or plain text."""

from __future__ import annotations

import html

from vramscope.report.model import CATEGORY_NAMES, Report
from vramscope.units import format_bytes

MAX_FINDINGS = 5


def title(report: Report) -> str:
    w, d = report.workload, report.device
    spec = w.get("spec") or w.get("script") or w.get("name") or "tracked code"
    device = str(d.get("name") or d.get("type") or "?")
    if d.get("total_bytes"):
        device += f" ({format_bytes(d['total_bytes'])})"
    return f"vramscope · {report.kind} · {spec} · {device}"


def rows(report: Report) -> list[tuple[str, str]]:
    """(label, value) pairs: the peak, what it is made of, steps and epochs, how it ended."""
    p = report.peak
    where = f" at step {p.step}, {p.phase}" if p.step is not None and p.phase else ""
    found: list[tuple[str, str]] = []
    if p.allocated_bytes is not None:
        found.append(("peak allocated", format_bytes(p.allocated_bytes) + where))
        found.append(("peak reserved", format_bytes(p.reserved_bytes)))
    if p.device_used_bytes is not None:
        found.append(("device used (nvidia-smi)", format_bytes(p.device_used_bytes)))
    if p.host_rss_bytes is not None:
        found.append(("host RSS (process tree)", format_bytes(p.host_rss_bytes)))
    cats = report.categories_at_peak
    total = cats.total()
    parts = []
    for name in CATEGORY_NAMES:
        value = getattr(cats, name)
        if value:
            share = 100 * value / total if total else None
            share = "" if share is None else f" ({share:.0f}%)" if share >= 1 else " (<1%)"
            parts.append(f"{name.replace('_', ' ')} {format_bytes(value)}{share}")
    if parts:
        found.append(("at the peak", ", ".join(parts)))
    if report.steps:
        train = sum(s.mode == "train" for s in report.steps)
        steps = f"{len(report.steps)} ({train} train, {len(report.steps) - train} eval)"
        if len(report.epochs) > 1:
            steps += f" in {len(report.epochs)} epochs"
        found.append(("steps", steps))
    if report.exit.status != "ok":
        found.append(("run ended", f"{report.exit.status}: {report.exit.error or ''}".rstrip()))
    return found


def notes(report: Report) -> list[tuple[str, str]]:
    """(severity, message): the findings first, then why CUDA figures are missing."""
    found = [(f.severity, f.message) for f in report.findings[:MAX_FINDINGS]]
    if len(report.findings) > MAX_FINDINGS:
        found.append(("info", f"{len(report.findings) - MAX_FINDINGS} more findings in the report"))
    why = report.unavailable.get("peak.allocated_bytes")
    if why:
        found.append(("info", f"CUDA figures n/a: {why}"))
    return found


_COLORS = {"error": "#b91c1c", "warning": "#a16207", "info": "#374151"}


def to_html(report: Report) -> str:
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


def to_text(report: Report) -> str:
    lines = [title(report)]
    width = max((len(label) for label, _ in rows(report)), default=0)
    lines += [f"  {label.ljust(width)}  {value}" for label, value in rows(report)]
    lines += [f"  • {message}" for _, message in notes(report)]
    return "\n".join(lines)
