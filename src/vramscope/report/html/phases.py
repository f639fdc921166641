"""Phases: the highest peak each phase (forward, backward, optimizer…) reached, and where."""

from __future__ import annotations

from typing import Any

from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import (
    SERIES_COLORS,
    chart_text,
    duration,
    figure_dict,
    largest,
    phase_order,
    scaled,
    unit_for,
)
from vramscope.report.model import Report
from vramscope.units import format_bytes as b


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """Peak allocated and reserved per phase, as bars and a table (the peak's row marked)."""
    if not report.phases:
        return None
    go = charts.go()
    phases = sorted(report.phases, key=lambda p: phase_order(p.name))
    with_peaks = [p for p in phases if p.peak_allocated_bytes is not None]
    chart = None
    if with_peaks:
        top = max((p.peak_reserved_bytes or p.peak_allocated_bytes or 0) for p in with_peaks)
        unit, scale = unit_for(top)
        fig = go.Figure()
        for field, name, color in (
            ("peak_allocated_bytes", "peak allocated", SERIES_COLORS["allocated"]),
            ("peak_reserved_bytes", "peak reserved", SERIES_COLORS["reserved"]),
        ):
            vals = [getattr(p, field) for p in with_peaks]
            if largest(vals) is None:
                continue
            fig.add_trace(
                go.Bar(
                    x=[chart_text(p.name.replace("_", " ")) for p in with_peaks],
                    y=scaled(vals, scale),
                    name=name,
                    marker={"color": color},
                    text=[b(v) for v in vals],
                    textposition="none",
                    hovertemplate="%{x}: %{text}<extra>" + name + "</extra>",
                )
            )
        fig.update_layout(
            height=300,
            barmode="group",
            yaxis={"title": {"text": unit}},
            legend={"orientation": "h", "y": 1.12},
            margin={"l": 60, "r": 20, "t": 40, "b": 40},  # t: what the legend pushes it to
        )
        figures["chart-phases"] = figure_dict(fig)
        chart = Chart("chart-phases", 300)
    rows = [
        [
            p.name.replace("_", " "),
            b(p.peak_allocated_bytes),
            b(p.peak_reserved_bytes),
            b(p.start_allocated_bytes),
            b(p.end_allocated_bytes),
            str(p.step) if p.step is not None else "",
            f"{p.count:,}",
            duration(p.duration_s),
        ]
        for p in phases
    ]
    peak_rows = [
        "hl" if report.peak.phase == p.name and p.step == report.peak.step else "" for p in phases
    ]
    tbl = table(
        [
            "phase",
            "peak allocated",
            "peak reserved",
            "allocated at start",
            "allocated at end",
            "at step",
            "count",
            "time",
        ],
        rows,
        row_classes=peak_rows,
    )
    return Section(
        "phases.html",
        "phases",
        "Phases",
        "Phases",
        "The highest peak each phase reached over the run, and the step where it happened.",
        {"chart": chart, "table": tbl},
    )
