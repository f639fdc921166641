"""What fits: the largest batch, memory-saving strategies side by side, memory by batch size."""

from __future__ import annotations

from typing import Any

from vramscope.fit import wording
from vramscope.fit.answer import final_answer
from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import (
    SERIES_COLORS,
    chart_text,
    figure_dict,
    largest,
    scaled,
    unit_for,
)
from vramscope.report.model import Report
from vramscope.units import format_bytes as b


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """The largest batch, strategies as bars and a table, memory against batch size."""
    fit = report.extra.get("fit")
    if not isinstance(fit, dict):
        return None
    go = charts.go()
    verdict = strategies_chart = strategies_table = curve_chart = None
    target = fit.get("target") if isinstance(fit.get("target"), dict) else {}
    budget = (
        fit.get("budget_bytes") or target.get("limit_bytes") or report.device.get("total_bytes")
    )
    answer = fit.get("answer") if isinstance(fit.get("answer"), dict) else final_answer(fit)
    notes: list[str] = []
    style = "fits"
    if answer.get("max_batch_size") is not None or "max_seq_len" in fit:
        # the terminal's headline, word for word: the answer, its target, how it was found
        verdict, *notes = wording.headline_lines(fit)
        style = "nofit" if verdict.startswith("Does not fit") else "fits"
    strategies = [s for s in fit.get("strategies") or [] if isinstance(s, dict)]
    if strategies:
        fields = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
        per_strategy_batch = any(s.get("max_batch_size") is not None for s in strategies)
        rows = []
        for s in strategies:
            peak = s.get("peak") or {}
            vs = wording.reserved_change(s, strategies[0]) if s is not strategies[0] else ""
            row = [str(s.get("name", "?"))]
            row += [b(peak.get(f)) if isinstance(peak.get(f), (int, float)) else "" for f in fields]
            row.append(vs)
            if per_strategy_batch:
                batch = s.get("max_batch_size")
                row.append("" if batch is None else str(batch))
            rows.append(row)
        top = max([(s.get("peak") or {}).get(f) or 0 for s in strategies for f in fields] + [0])
        unit, scale = unit_for(top)
        fig = go.Figure()
        for f, name in zip(fields, ("allocated", "reserved", "device used"), strict=True):
            vals = [(s.get("peak") or {}).get(f) for s in strategies]
            if largest(vals) is None:
                continue
            fig.add_trace(
                go.Bar(
                    y=[chart_text(s.get("name", "?")) for s in strategies],
                    x=scaled(vals, scale),
                    name=name,
                    orientation="h",
                    marker={"color": SERIES_COLORS[f.replace("_bytes", "")]},
                )
            )
        fig.update_layout(
            height=120 + 50 * len(strategies),
            barmode="group",
            xaxis={"title": {"text": unit}},
            yaxis={"autorange": "reversed"},
            legend={"orientation": "h", "y": 1.0, "yanchor": "bottom"},
            margin={"l": 64, "r": 24, "t": 48, "b": 48},
        )
        if budget:
            fig.add_vline(x=budget / scale, line={"color": "#dc2626", "dash": "dash"})
        figures["chart-strategies"] = figure_dict(fig)
        strategies_chart = Chart("chart-strategies", 120 + 50 * len(strategies))
        strategies_table = table(
            ["strategy", "peak allocated", "peak reserved", "device used"]
            + [f"reserved {wording.change_header(strategies)}"]
            + (["largest batch"] if per_strategy_batch else []),
            rows,
        )
    curve = [
        c for c in fit.get("curve") or [] if isinstance(c, dict) and c.get("batch_size") is not None
    ]
    if curve:
        curve.sort(key=lambda c: c["batch_size"])
        fields = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
        top = max(
            [(c.get("peak") or {}).get(f) or 0 for c in curve for f in fields] + [budget or 0]
        )
        unit, scale = unit_for(top)
        fig = go.Figure()
        for f, name in zip(fields, ("allocated", "reserved", "device used"), strict=True):
            vals = [(c.get("peak") or {}).get(f) for c in curve]
            if largest(vals) is None:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[c["batch_size"] for c in curve],
                    y=scaled(vals, scale),
                    name=name,
                    mode="lines+markers",
                    line={"color": SERIES_COLORS[f.replace("_bytes", "")]},
                )
            )
        if budget:
            fig.add_hline(
                y=budget / scale,
                line={"color": "#dc2626", "dash": "dash"},
                annotation_text=f"budget {b(budget)}",
            )
        fig.update_layout(
            height=340,
            hovermode="x unified",
            xaxis={"title": {"text": "batch size"}},
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": 1.12},
        )
        figures["chart-fit-curve"] = figure_dict(fig)
        curve_chart = Chart("chart-fit-curve", 340)
    if verdict is None and strategies_chart is None and curve_chart is None:
        return None
    return Section(
        "fit.html",
        "fit",
        "What fits",
        "What fits",
        "Batch sizes and memory-saving strategies side by side.",
        {
            "verdict": verdict,
            "verdict_style": style,
            "notes": notes,
            "strategies_chart": strategies_chart,
            "strategies_table": strategies_table,
            "curve_chart": curve_chart,
        },
    )
