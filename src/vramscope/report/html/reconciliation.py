"""Why nvidia-smi shows more than max_memory_allocated: tensors to device used, as a waterfall."""

from __future__ import annotations

from typing import Any

from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import figure_dict, pct, unit_for
from vramscope.report.model import Reconciliation, Report
from vramscope.units import format_bytes as b

TITLE = "Why nvidia-smi shows more than max_memory_allocated"
TICK_LABELS = {
    "cached free": "cached<br>free",
    "fragmentation": "fragmen-<br>tation",
    "other slack": "other<br>slack",
    "context and libraries": "context and<br>libraries",
    "device used": "device<br>used",
}


def reconciliation_steps(rec: Reconciliation) -> list[tuple[str, str, int, str]]:
    """(label, measure, bytes, what it is) from tensors to device used, for a waterfall."""
    steps: list[tuple[str, str, int, str]] = []
    tensors = rec.tensors.total()
    steps.append(("tensors", "absolute", tensors, "live tensors, by category"))
    if rec.allocated_bytes is not None:
        if rec.allocated_bytes - tensors:
            steps.append(
                (
                    "untracked",
                    "relative",
                    rec.allocated_bytes - tensors,
                    "allocated but in no category",
                )
            )
        steps.append(("allocated", "total", rec.allocated_bytes, "torch.cuda.memory_allocated()"))
    if rec.reserved_bytes is not None:
        base = rec.allocated_bytes if rec.allocated_bytes is not None else tensors
        cached = rec.slack.cached_free_bytes or 0
        frag = rec.slack.fragmentation_bytes or 0
        if cached:
            steps.append(("cached free", "relative", cached, "empty_cache() would release it"))
        if frag:
            steps.append(("fragmentation", "relative", frag, "free pieces of partly used segments"))
        rest = rec.reserved_bytes - base - cached - frag
        if rest:
            steps.append(
                ("other slack", "relative", rest, "reserved, neither cached nor fragmented")
            )
        steps.append(("reserved", "total", rec.reserved_bytes, "torch.cuda.memory_reserved()"))
    if rec.device_used_bytes is not None:
        below = rec.reserved_bytes if rec.reserved_bytes is not None else None
        if below is not None and rec.device_used_bytes - below:
            steps.append(
                (
                    "context and libraries",
                    "relative",
                    rec.device_used_bytes - below,
                    "CUDA context, kernels, cuBLAS/cuDNN: outside the allocator",
                )
            )
        steps.append(("device used", "total", rec.device_used_bytes, "what nvidia-smi shows"))
    return steps


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """A waterfall and a table per moment (the peak, the end of the run)."""
    go = charts.go()
    recs = [r for r in report.reconciliation if r.allocated_bytes is not None or r.reserved_bytes]
    if not recs:
        why = report.unavailable.get("reconciliation")
        if not why:
            return None
        return Section(
            "reconciliation.html",
            "reconciliation",
            "nvidia-smi",
            TITLE,
            "",
            {"moments": [], "unavailable": why},
        )
    moments = []
    for rec in sorted(recs, key=lambda r: 0 if r.moment == "peak" else 1):
        steps = reconciliation_steps(rec)
        top = max(
            [s[2] for s in steps if s[1] != "relative"] + [rec.device_used_bytes or 0], default=0
        )
        unit, scale = unit_for(top)
        chart_id = f"chart-waterfall-{rec.moment}"
        fig = go.Figure(
            go.Waterfall(
                x=[TICK_LABELS.get(s[0], s[0]) for s in steps],
                measure=[s[1] for s in steps],
                y=[round(s[2] / scale, 4) for s in steps],
                text=[b(s[2], signed=s[1] == "relative") for s in steps],
                textposition="outside",
                customdata=[s[3] for s in steps],
                hovertemplate="%{x}: %{text}<br>%{customdata}<extra></extra>",
                connector={"line": {"color": "#cbd5e1"}},
                increasing={"marker": {"color": "#f59e0b"}},
                decreasing={"marker": {"color": "#16a34a"}},
                totals={"marker": {"color": "#2563eb"}},
            )
        )
        fig.update_layout(
            height=360,
            showlegend=False,
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            xaxis={"tickangle": 0},
            margin={"l": 60, "r": 20, "t": 30, "b": 50},
        )
        figures[chart_id] = figure_dict(fig)
        title = "at the peak" if rec.moment == "peak" else "at the end of the run"
        device_bar = _device_bar(rec, figures, f"chart-device-{rec.moment}")
        rows = [[s[0], b(s[2], signed=s[1] == "relative"), s[3]] for s in steps]
        extra_rows = [
            ("other processes", rec.other_processes_bytes, ""),
            (
                "driver reserved",
                rec.driver_reserved_bytes,
                "kept by the driver; nvidia-smi counts it as used",
            ),
            ("unattributed", rec.unaccounted_bytes, "used on the device, listed for no process"),
            ("free", rec.free_bytes, ""),
            ("device total", rec.total_bytes, ""),
        ]
        rows += [[n, b(v), w] for n, v, w in extra_rows if v]
        moments.append(
            {
                "title": title.capitalize(),
                "chart": Chart(chart_id, 360),
                "table": table(["layer", "bytes", "what it is"], rows, text_columns=[-1]),
                "device_bar": device_bar,
                "note": rec.note or "",
            }
        )
    return Section(
        "reconciliation.html",
        "reconciliation",
        "nvidia-smi",
        TITLE,
        "From the tensors to what nvidia-smi shows: the caching allocator keeps freed memory "
        "(reserved ≥ allocated), and the CUDA context and libraries live outside it.",
        {"moments": moments, "unavailable": ""},
    )


def _device_bar(rec: Reconciliation, figures: dict[str, Any], chart_id: str) -> Chart | None:
    """The whole device at that moment, as one stacked bar, when its total is known."""
    if not rec.total_bytes:
        return None
    go = charts.go()
    pieces = [
        ("this process", rec.device_used_bytes, "#2563eb"),
        ("other processes", rec.other_processes_bytes, "#f97316"),
        ("driver reserved", rec.driver_reserved_bytes, "#64748b"),
        ("unattributed", rec.unaccounted_bytes, "#a8a29e"),
        ("free", rec.free_bytes, "#e2e8f0"),
    ]
    pieces = [p for p in pieces if p[1]]
    if not pieces:
        return None
    unit, scale = unit_for(rec.total_bytes)
    fig = go.Figure()
    for name, value, color in pieces:
        fig.add_trace(
            go.Bar(
                y=["device"],
                x=[round(value / scale, 4)],
                name=f"{name} {b(value)}",
                orientation="h",
                marker={"color": color},
                hovertemplate=f"{name}: {b(value)} ({pct(value, rec.total_bytes)})<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=130,
        # the margins plotly would grow to hold the legend and the axis: set, they save it a
        # second layout pass
        margin={"l": 60, "r": 20, "t": 28, "b": 38},
        xaxis={
            "range": [0, rec.total_bytes / scale],
            "title": {"text": f"{unit} of {b(rec.total_bytes)}"},
            "automargin": False,
        },
        yaxis={"visible": False},
        legend={"orientation": "h", "y": 1.35, "x": 0, "traceorder": "normal"},
    )
    figures[chart_id] = figure_dict(fig)
    return Chart(chart_id, 130)
