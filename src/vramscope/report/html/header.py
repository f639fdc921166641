"""The page's head: what ran where, the four peak numbers, and the peak in plain words."""

from __future__ import annotations

import shlex
from typing import Any

from vramscope.report.html.charts import SERIES_COLORS, pct
from vramscope.report.model import CATEGORY_NAMES, Report
from vramscope.report.words import field_label
from vramscope.units import format_bytes as b


def workload_title(report: Report) -> str:
    w = report.workload
    return str(w.get("spec") or w.get("script") or w.get("name") or "tracked code")


def context(report: Report) -> dict[str, Any]:
    """Title, arguments, device line, chips and the peak cards of ``templates/header.html``."""
    w, d = report.workload, report.device
    chips = [report.kind]
    if w.get("batch_size") is not None:
        chips.append(f"batch size {w['batch_size']}")
    if w.get("precision"):
        chips.append(str(w["precision"]))
    if w.get("accumulate") not in (None, 1):
        chips.append(f"accumulate {w['accumulate']}")
    if w.get("steps") is not None:
        chips.append(
            f"{w['steps']:,} steps" if isinstance(w["steps"], int) else f"{w['steps']} steps"
        )
    elif report.steps:
        chips.append(f"{len(report.steps):,} steps")
    if w.get("training") is False:
        chips.append("inference")
    job = report.extra.get("distributed")
    if report.ranks and isinstance(job, dict):
        chips.append(f"{len(report.ranks)} ranks")
        if job.get("rank") is not None:
            chips.append(
                f"peaks of rank {job['rank']}"
                + (" (heaviest)" if job.get("heaviest_rank") == job["rank"] else "")
            )
    elif isinstance(job, dict) and job.get("estimated") and job.get("world_size"):
        chips.append(f"per rank of {job.get('summary') or job['world_size']}")
        chips.append(
            f"rank {job.get('rank')}"
            + (" (heaviest)" if job.get("heaviest_rank") == job.get("rank") else "")
        )
    device = str(d.get("name") or d.get("type") or "unknown device")
    if d.get("total_bytes"):
        device += f" · {b(d['total_bytes'])}"
    bits = [device]
    for key, label in (
        ("torch_version", "torch"),
        ("cuda_version", "CUDA"),
        ("driver_version", "driver"),
    ):
        if d.get(key):
            bits.append(f"{label} {d[key]}")
    if report.created_at:
        bits.append(f"recorded {report.created_at.replace('T', ' ')}")
    argv = ""
    if w.get("argv"):
        try:
            argv = shlex.join(str(a) for a in w["argv"])
        except TypeError:
            argv = " ".join(str(a) for a in w["argv"])
    return {
        "kind": report.kind,
        "title": workload_title(report),
        "argv": argv,
        "meta": " · ".join(bits),
        "chips": chips,
        "ended": report.exit.status if report.exit.status != "ok" else "",
        "error": report.exit.error or "",
        "kpis": kpis(report),
    }


def _kpi(label: str, value: int | None, sub: str, share: float | None, color: str) -> dict:
    bar = ""
    if share is not None:
        bar = f"{max(0.0, min(100.0, 100 * share)):.1f}"
    return {"label": label, "value": b(value), "sub": sub, "bar": bar, "color": color}


def kpis(report: Report) -> list[dict[str, Any]]:
    """The peak allocated, reserved, device-used and host RSS cards, with a bar of the whole."""
    p, total = report.peak, report.device.get("total_bytes")
    host_total = report.host.get("total_bytes")

    def share(v: int | None, whole: int | None) -> float | None:
        return v / whole if v is not None and whole else None

    def why(field: str) -> str:
        return report.unavailable.get(f"peak.{field}", "not measured")

    cards = []
    for field, label, color in (
        ("allocated_bytes", "Peak allocated", SERIES_COLORS["allocated"]),
        ("reserved_bytes", "Peak reserved", SERIES_COLORS["reserved"]),
        ("device_used_bytes", "Device used (nvidia-smi)", SERIES_COLORS["device_used"]),
    ):
        value = getattr(p, field)
        if value is None:
            sub = why(field)
        elif total:
            sub = f"{pct(value, total)} of {b(total)}"
        else:
            sub = "tensors held by PyTorch" if field == "allocated_bytes" else ""
        cards.append(_kpi(label, value, sub, share(value, total), color))
    host_sub = f"{pct(p.host_rss_bytes, host_total)} of {b(host_total)} RAM" if host_total else ""
    cards.append(
        _kpi(
            "Peak host RSS",
            p.host_rss_bytes,
            host_sub or "the process and its workers",
            share(p.host_rss_bytes, host_total),
            SERIES_COLORS["host_rss"],
        )
    )
    return cards


def explain_peak(report: Report) -> str:
    """The peak in one or two plain sentences (plain text; escape it to show it)."""
    p = report.peak
    if p.allocated_bytes is None:
        why = report.unavailable.get("peak.allocated_bytes")
        text = "GPU memory was not measured" + (f" ({why})" if why else "") + "."
        if p.host_rss_bytes is not None:
            text += f" Host memory (RSS) peaked at {b(p.host_rss_bytes)}."
        return text
    where = ""
    if p.phase and p.step is not None:
        where = f" in the {p.phase} phase of step {p.step}"
    elif p.step is not None:
        where = f" in step {p.step}"
    text = f"The run peaked at {b(p.allocated_bytes)} allocated{where}"
    if p.reserved_bytes:
        text += f"; the caching allocator held {b(p.reserved_bytes)}"
    if p.device_used_bytes:
        text += f" and nvidia-smi showed {b(p.device_used_bytes)} for the process"
    text += "."
    cats = [(n, getattr(report.categories_at_peak, n)) for n in CATEGORY_NAMES]
    cats = [(n, v) for n, v in cats if v]
    cats.sort(key=lambda kv: kv[1], reverse=True)
    if cats:
        parts = [f"{n.replace('_', ' ')} {b(v)} ({pct(v, p.allocated_bytes)})" for n, v in cats[:3]]
        text += " At that moment: " + ", ".join(parts) + "."
    if p.step == 0 and len(report.steps) > 1:
        text += " The first step is the highest: later steps need less."
    return text


def unavailable(report: Report) -> list[tuple[str, str, str]]:
    """What this run could not measure, in words, its field in the JSON, and why; sorted by
    field."""
    return sorted((field_label(str(k)), str(k), str(v)) for k, v in report.unavailable.items())
