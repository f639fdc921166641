"""What the peak is made of: live tensors by category, as a donut, a table and over time."""

from __future__ import annotations

import math
from typing import Any

from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import (
    CATEGORY_COLORS,
    MAX_POINTS,
    figure_dict,
    pct,
    scaled,
    unit_for,
)
from vramscope.report.model import CATEGORY_NAMES, Report
from vramscope.units import format_bytes as b

CATEGORY_MEANING = {
    "parameters": "the model's weights",
    "buffers": "non-trainable state such as BatchNorm running statistics",
    "gradients": "the .grad of each trainable parameter",
    "optimizer_state": "what the optimizer keeps per parameter (AdamW: two moments)",
    "activations": "outputs the forward pass saves for the backward pass",
    "temporaries": "short-lived buffers inside operations at the peak (outputs, workspaces)",
    "other": "live tensors no other category explains",
}


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """The donut and table of categories at the peak, and their series when recorded."""
    go = charts.go()
    cats = report.categories_at_peak
    values = [(n, getattr(cats, n)) for n in CATEGORY_NAMES]
    known = [(n, v) for n, v in values if v]
    if not known:
        return None
    total = report.peak.allocated_bytes or cats.total() or None
    fig = go.Figure(
        go.Pie(
            labels=[n.replace("_", " ") for n, _ in known],
            values=[v for _, v in known],
            hole=0.58,
            sort=False,
            direction="clockwise",
            marker={"colors": [CATEGORY_COLORS[n] for n, _ in known]},
            customdata=[b(v) for _, v in known],
            text=[
                f"{100 * v / (cats.total() or 1):.0f}%" if v >= 0.04 * (cats.total() or 1) else ""
                for _, v in known
            ],
            textinfo="text",
            hovertemplate="%{label}: %{customdata} (%{percent})<extra></extra>",
        )
    )
    centre = b(cats.total())
    fig.update_layout(
        height=340,
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        annotations=[
            {
                "text": f"<b>{centre}</b><br>at the peak",
                "showarrow": False,
                "font": {"size": 15},
                "x": 0.5,
                "y": 0.5,
                "xref": "paper",
                "yref": "paper",
            }
        ],
    )
    figures["chart-categories"] = figure_dict(fig)
    rows = [
        [name.replace("_", " "), b(value), pct(value, total), CATEGORY_MEANING[name]]
        for name, value in values
    ]
    tbl = table(["category", "bytes", "share", "what it is"], rows, text_columns=[-1])
    for name, row in zip(CATEGORY_NAMES, tbl.rows, strict=True):
        assert row is not None
        row.cells[0].swatch = CATEGORY_COLORS[name]
    return Section(
        "categories.html",
        "categories",
        "Peak breakdown",
        "What the peak is made of",
        "Live tensors at the moment of the peak, by kind, sized as the allocator rounds them.",
        {
            "chart": Chart("chart-categories", 340),
            "table": tbl,
            "note": report.categories_note or "",
            "over_time": _over_time_chart(report, figures),
        },
    )


def categories_over_time(report: Report) -> dict[str, list[Any]] | None:
    """Per-category series, when a tracker recorded them in ``extra['categories_over_time']``.

    The expected shape is ``{"t": [seconds...], "<category>": [bytes...], ...}``;
    nothing is derived or invented when it is absent.
    """
    data = report.extra.get("categories_over_time")
    if not isinstance(data, dict) or not isinstance(data.get("t"), list) or not data["t"]:
        return None
    series = {
        n: data[n]
        for n in CATEGORY_NAMES
        if isinstance(data.get(n), list) and len(data[n]) == len(data["t"])
    }
    if not series:
        return None
    return {"t": data["t"], **series}


def _over_time_chart(report: Report, figures: dict[str, Any]) -> Chart | None:
    data = categories_over_time(report)
    if data is None:
        return None
    go = charts.go()
    names = [n for n in data if n != "t"]
    top = max((sum(data[n][i] or 0 for n in names) for i in range(len(data["t"]))), default=0)
    unit, scale = unit_for(top)
    fig = go.Figure()
    for name in CATEGORY_NAMES:
        if name not in data:
            continue
        xs, ys = data["t"], data[name]
        if len(xs) > MAX_POINTS:  # keep stacking aligned: the same stride for every series
            stride = math.ceil(len(xs) / MAX_POINTS)
            xs, ys = xs[::stride], ys[::stride]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=scaled(ys, scale),
                name=name.replace("_", " "),
                stackgroup="categories",
                mode="lines",
                line={"width": 0.5, "color": CATEGORY_COLORS[name]},
                hovertemplate=f"%{{y:.2f}} {unit}",
            )
        )
    fig.update_layout(
        height=320,
        hovermode="x unified",
        xaxis={"title": {"text": "seconds since the run began"}},
        yaxis={"title": {"text": unit}},
        legend={"orientation": "h", "y": -0.25},
    )
    figures["chart-categories-time"] = figure_dict(fig)
    return Chart("chart-categories-time", 320)
