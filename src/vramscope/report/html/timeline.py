"""The timeline: memory over the whole run, with phases, step and epoch boundaries, the peak."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section
from vramscope.report.html.charts import (
    PHASE_COLORS,
    SERIES_COLORS,
    chart_text,
    downsample_minmax,
    figure_dict,
    largest,
    phase_order,
    rgba,
    scaled,
    unit_for,
)
from vramscope.report.model import Report
from vramscope.units import format_bytes as b

MAX_BANDS = 400  # phase rectangles drawn on the timeline before they are merged (costly)
MAX_STEP_MARKERS = 300  # step boundary lines drawn before they are thinned
MAX_VISIBLE_STEP_MARKERS = 60  # with more, they start hidden: a legend click shows them
MAX_EPOCH_LABELS = 40


def _band_polygons(
    bands: Sequence[tuple[float, float]],
) -> tuple[list[float | None], list[float | None]]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for start, end in bands:
        xs += [
            round(start, 6),
            round(start, 6),
            round(end, 6),
            round(end, 6),
            round(start, 6),
            None,
        ]
        ys += [0, 1, 1, 0, 0, None]
    return xs, ys


def phase_bands(report: Report) -> tuple[dict[str, list[tuple[float, float]]], str]:
    """Rectangles to shade, by legend name, and a note when they were merged."""
    raw = [
        band
        for band in report.timeline.phases
        if isinstance(band.get("start_s"), (int, float))
        and isinstance(band.get("end_s"), (int, float))
    ]
    note = ""
    if report.timeline.dropped_phase_bands:
        note = f"{report.timeline.dropped_phase_bands} later phase bands were not recorded. "
    if len(raw) <= MAX_BANDS:
        out: dict[str, list[tuple[float, float]]] = {}
        for band in raw:
            out.setdefault(str(band.get("name", "other")), []).append(
                (float(band["start_s"]), float(band["end_s"]))
            )
        return out, note
    # too many to draw: one band per step, or per group of steps
    per_step: dict[Any, list[float]] = {}
    for band in raw:
        span = per_step.setdefault(band.get("step"), [band["start_s"], band["end_s"]])
        span[0] = min(span[0], band["start_s"])
        span[1] = max(span[1], band["end_s"])
    spans = sorted((s, e) for s, e in per_step.values())
    group = max(1, math.ceil(len(spans) / MAX_BANDS))
    merged = [
        (spans[i][0], max(e for _, e in spans[i : i + group])) for i in range(0, len(spans), group)
    ]
    unit = "step" if group == 1 else f"{group} steps"
    note += (
        f"{len(raw):,} phase bands are too many to draw: shaded bands alternate per {unit}; "
        "the --trace export keeps every phase."
    )
    return {f"{unit} (even)": merged[0::2], f"{unit} (odd)": merged[1::2]}, note


def _peak_time(report: Report) -> float | None:
    tl, p = report.timeline, report.peak
    if not tl.t:
        return None
    window = None
    for band in tl.phases:
        if band.get("step") == p.step and band.get("name") == p.phase:
            window = (band.get("start_s"), band.get("end_s"))
    best_t, best_v = None, None
    for t, v in zip(tl.t, tl.allocated_bytes, strict=False):
        if v is None:
            continue
        if window and not (window[0] - 0.05 <= t <= window[1] + 0.05):
            continue
        if best_v is None or v > best_v:
            best_t, best_v = t, v
    if best_t is None and window:
        return (window[0] + window[1]) / 2
    return best_t


def _boundary_lines(
    markers: list[dict[str, Any]], name: str, line: dict[str, Any], visible: bool | str = True
) -> Any:
    """Vertical lines across the timeline at each marker's time (one trace, gaps between)."""
    go = charts.go()

    xs: list[float | None] = []
    ys: list[float | None] = []
    for m in markers:
        xs += [round(m["t"], 6), round(m["t"], 6), None]
        ys += [0, 1, None]
    return go.Scatter(
        x=xs,
        y=ys,
        name=name,
        mode="lines",
        line=line,
        hoverinfo="skip",
        yaxis="y3",
        visible=visible,
    )


def timeline_figure(report: Report) -> tuple[dict[str, Any] | None, str]:
    """The timeline as plotly data (``None`` without samples), and a note on what was thinned."""
    go = charts.go()
    tl = report.timeline
    if not tl.t:
        return None, ""
    gpu_keys = [
        ("allocated", tl.allocated_bytes),
        ("reserved", tl.reserved_bytes),
        ("device_used", tl.device_used_bytes),
    ]
    gpu_keys = [(k, v) for k, v in gpu_keys if largest(v) is not None]
    host = tl.host_rss_bytes if largest(tl.host_rss_bytes) is not None else None
    if not gpu_keys and host is None:
        return None, ""
    names = {
        "allocated": "allocated",
        "reserved": "reserved",
        "device_used": "device used (nvidia-smi)",
        "host_rss": "host RSS",
    }
    fig = go.Figure()
    top_axis = "y" if gpu_keys else None
    host_axis = "y2" if gpu_keys else "y"
    gpu_max = max((largest(v) or 0 for _, v in gpu_keys), default=0)
    gpu_max = max(gpu_max, report.peak.allocated_bytes or 0)
    gpu_unit, gpu_scale = unit_for(gpu_max)
    for key, values in gpu_keys:
        xs, ys = downsample_minmax(tl.t, values)
        fig.add_trace(
            go.Scatter(
                x=[round(x, 4) for x in xs],
                y=scaled(ys, gpu_scale),
                name=names[key],
                mode="lines",
                line={"color": SERIES_COLORS[key], "width": 2 if key == "allocated" else 1.6},
                hovertemplate=f"%{{y:.2f}} {gpu_unit}",
                yaxis=top_axis,
            )
        )
    host_unit, host_scale = unit_for(largest(host) if host else 0)
    if host is not None:
        xs, ys = downsample_minmax(tl.t, host)
        fig.add_trace(
            go.Scatter(
                x=[round(x, 4) for x in xs],
                y=scaled(ys, host_scale),
                name=names["host_rss"],
                mode="lines",
                line={"color": SERIES_COLORS["host_rss"], "width": 1.6},
                hovertemplate=f"%{{y:.2f}} {host_unit}",
                yaxis=host_axis,
            )
        )
    # phase bands and boundaries live on a hidden 0..1 axis over the top panel
    bands, note = phase_bands(report)
    merged = any(name not in PHASE_COLORS for name in bands)
    for i, (name, spans) in enumerate(sorted(bands.items(), key=lambda kv: phase_order(kv[0]))):
        xs, ys = _band_polygons(spans)
        color = PHASE_COLORS.get(name) or ("#64748b" if i % 2 else "#94a3b8")
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=chart_text(name.replace("_", " ")),
                mode="lines",
                fill="toself",
                fillcolor=rgba(color, 0.13),
                line={"width": 0},
                hoverinfo="skip",
                yaxis="y3",
                visible="legendonly" if merged else True,  # too dense to read: on request
            )
        )
    steps = [
        m for m in tl.markers if m.get("kind") == "step" and isinstance(m.get("t"), (int, float))
    ]
    if steps:
        every = max(1, math.ceil(len(steps) / MAX_STEP_MARKERS))
        shown = steps[::every]
        if every > 1:
            note += f" Step boundaries: every {every}th of {len(steps):,} is drawn."
        fig.add_trace(
            _boundary_lines(
                shown,
                "step boundary",
                {"color": "#94a3b8", "width": 0.8, "dash": "dot"},
                visible=True if len(steps) <= MAX_VISIBLE_STEP_MARKERS else "legendonly",
            )
        )
    epochs = [
        m for m in tl.markers if m.get("kind") == "epoch" and isinstance(m.get("t"), (int, float))
    ]
    annotations: list[dict[str, Any]] = []
    if epochs:
        fig.add_trace(
            _boundary_lines(
                epochs, "epoch boundary", {"color": "#0f172a", "width": 1.4, "dash": "dash"}
            )
        )
        if len(epochs) <= MAX_EPOCH_LABELS:
            for m in epochs:
                annotations.append(
                    {
                        "x": round(m["t"], 6),
                        "y": 1,
                        "yref": "y3",
                        "text": f"epoch {int(m.get('index', 0))}",
                        "showarrow": False,
                        "textangle": -90,
                        "xanchor": "right",
                        "yanchor": "top",
                        "font": {"size": 11, "color": "#0f172a"},
                    }
                )
    p = report.peak
    t_peak = _peak_time(report)
    if gpu_keys and p.allocated_bytes is not None and t_peak is not None:
        y = round(p.allocated_bytes / gpu_scale, 4)
        where = f"{p.phase}, step {p.step}" if p.phase and p.step is not None else ""
        label = f"peak {b(p.allocated_bytes)}" + (f"<br>{chart_text(where)}" if where else "")
        fig.add_trace(
            go.Scatter(
                x=[round(t_peak, 6)],
                y=[y],
                name="peak allocated",
                mode="markers",
                marker={
                    "symbol": "star",
                    "size": 15,
                    "color": "#dc2626",
                    "line": {"width": 1, "color": "#fff"},
                },
                hovertemplate=chart_text(f"peak allocated {b(p.allocated_bytes)} {where}")
                + "<extra></extra>",
                yaxis="y",
            )
        )
        annotations.append(
            {
                "x": round(t_peak, 6),
                "y": y,
                "xref": "x",
                "yref": "y",
                "text": label,
                "showarrow": True,
                "arrowhead": 2,
                "ax": -40,
                "ay": -36,
                "bgcolor": "rgba(255,255,255,.9)",
                "bordercolor": "#dc2626",
                "font": {"size": 11, "color": "#991b1b"},
            }
        )
    xrange = None
    starts = [m["t"] for m in steps] or [s.start_s for s in report.steps if s.start_s]
    if starts:
        t_first, t_begin, t_end = min(starts), tl.t[0], tl.t[-1]
        if t_first - t_begin > 0.5 * (t_end - t_begin) and t_end > t_first:
            xs, ys = _band_polygons([(t_begin, t_first)])
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name="startup",
                    mode="lines",
                    fill="toself",
                    fillcolor="rgba(148,163,184,0.12)",
                    line={"width": 0},
                    hoverinfo="skip",
                    yaxis="y3",
                )
            )
            span = t_end - t_first
            xrange = [round(t_first - 0.04 * span, 6), round(t_end + 0.01 * span, 6)]
            note += (
                f" Zoomed to the steps: the first {t_first - t_begin:.1f} s are start-up "
                "(imports, building the model, the CUDA context on a GPU); double-click the chart "
                "to see them."
            )
    # numbers on every axis: the margins below hold them, and plotly skips measuring the
    # labels to grow the margins (a second layout pass, ~100 ms of the first screen)
    fixed = {"automargin": False}
    layout: dict[str, Any] = {
        "height": 500 if (gpu_keys and host is not None) else 400,
        "hovermode": "x unified",
        "legend": {"orientation": "h", "y": 1.01, "yanchor": "bottom", "x": 0},
        "xaxis": {
            "title": {"text": "seconds since the run began"},
            "anchor": host_axis,
            **fixed,
            **({"range": xrange} if xrange else {}),
        },
        "yaxis3": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        "annotations": annotations,
        "margin": {"l": 70, "r": 24, "t": 64, "b": 40},
    }
    if gpu_keys:
        layout["yaxis"] = {
            "title": {"text": f"GPU memory ({gpu_unit})"},
            "domain": [0.34, 1] if host is not None else [0, 1],
            "rangemode": "tozero",
            **fixed,
        }
        if host is not None:
            layout["yaxis2"] = {
                "title": {"text": f"host RSS ({host_unit})"},
                "domain": [0, 0.24],
                "rangemode": "tozero",
                **fixed,
            }
    else:
        layout["yaxis"] = {
            "title": {"text": f"host RSS ({host_unit})"},
            "rangemode": "tozero",
            **fixed,
        }
    fig.update_layout(layout)
    return figure_dict(fig), note.strip()


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """The timeline card; its figure goes into ``figures``."""
    figure, note = timeline_figure(report)
    if figure is None:
        return None
    figures["chart-timeline"] = figure
    return Section(
        "timeline.html",
        "timeline",
        "Timeline",
        "Timeline",
        "Memory over the whole run. Shaded bands are phases, dotted lines step boundaries; "
        "drag to zoom, double-click to reset, click a legend entry to hide or show it.",
        {"chart": Chart("chart-timeline", figure["layout"].get("height", 460)), "note": note},
    )
