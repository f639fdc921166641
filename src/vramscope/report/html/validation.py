"""An estimate checked against a real run: estimated and measured peaks side by side."""

from __future__ import annotations

from typing import Any

from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import figure_dict, unit_for
from vramscope.report.model import Report
from vramscope.units import format_bytes as b

TITLE = "Estimated against measured"


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """Bars and a table of every peak both sides have, else the validation's plain values."""
    validation = report.extra.get("validation")
    if not isinstance(validation, dict):
        return None
    est, meas = validation.get("estimated"), validation.get("measured")
    if isinstance(est, dict) and isinstance(meas, dict):
        if isinstance(est.get("peak"), dict) and isinstance(meas.get("peak"), dict):
            est, meas = est["peak"], meas["peak"]
        keys = [
            k
            for k in est
            if isinstance(est.get(k), (int, float)) and isinstance(meas.get(k), (int, float))
        ]
        if keys:
            go = charts.go()
            rows = []
            for k in keys:
                e, m = est[k], meas[k]
                err = f"{100 * (e - m) / m:+.1f}%" if m else ""
                rows.append(
                    [
                        k.replace("_bytes", "").replace("_", " "),
                        b(e),
                        b(m),
                        b(e - m, signed=True),
                        err,
                    ]
                )
            top = max(max(est[k], meas[k]) for k in keys)
            unit, scale = unit_for(top)
            labels = [k.replace("_bytes", "").replace("_", " ") for k in keys]
            fig = go.Figure(
                [
                    go.Bar(
                        x=labels,
                        y=[round(est[k] / scale, 4) for k in keys],
                        name="estimated",
                        marker={"color": "#94a3b8"},
                    ),
                    go.Bar(
                        x=labels,
                        y=[round(meas[k] / scale, 4) for k in keys],
                        name="measured",
                        marker={"color": "#2563eb"},
                    ),
                ]
            )
            fig.update_layout(
                height=300,
                barmode="group",
                yaxis={"title": {"text": unit}},
                legend={"orientation": "h", "y": 1.12},
            )
            figures["chart-validation"] = figure_dict(fig)
            return Section(
                "validation.html",
                "validation",
                "Validation",
                TITLE,
                "The estimate checked against a real run.",
                {
                    "chart": Chart("chart-validation", 300),
                    "table": table(["", "estimated", "measured", "difference", "error"], rows),
                    "entries": [],
                },
            )
    items = [
        (str(k), str(v)) for k, v in validation.items() if isinstance(v, (str, int, float, bool))
    ]
    if not items:
        return None
    return Section(
        "validation.html",
        "validation",
        "Validation",
        TITLE,
        "",
        {"chart": None, "table": None, "entries": items},
    )
