"""Ranks: a distributed job's ranks side by side (memory, how each ended, the heaviest
marked), what each rank's peak is made of, the imbalance and the distributed memory."""

from __future__ import annotations

from typing import Any

from vramscope.report import jobtext
from vramscope.report.freeform import mapping, number
from vramscope.report.freeform import text as _s
from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import SERIES_COLORS, chart_text, figure_dict, scaled, unit_for
from vramscope.report.model import CATEGORY_NAMES, RankEntry, Report
from vramscope.units import format_bytes as b

MEASURES_CUDA = (
    ("peak allocated", "allocated_bytes"),
    ("peak reserved", "reserved_bytes"),
    ("device used", "device_used_bytes"),
    ("host RSS", "host_rss_bytes"),
)
MEASURES_CPU = (("peak host RSS", "host_rss_bytes"),)


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """The ranks table, a bar per rank, the categories per rank and the job in words."""
    rows = report.ranks
    if not rows:
        return None
    job = mapping(report.extra.get("distributed"))
    heaviest = number(job.get("heaviest_rank"))
    cuda = any(r.peak.allocated_bytes is not None for r in rows)
    measures = MEASURES_CUDA if cuda else MEASURES_CPU
    headers = ["rank", "host", "local rank", *(name for name, _ in measures)]
    headers += ["steps", "exit", "error", ""]
    body, classes = [], []
    for row in rows:
        cells = [b(getattr(row.peak, key)) if row.reported else "—" for _, key in measures]
        body.append(
            [
                str(row.rank),
                row.host or "",
                "" if row.local_rank is None else str(row.local_rank),
                *cells,
                str(row.steps) if row.reported else "",
                row.exit.summary(),
                row.exit.error or "",
                "heaviest" if row.rank == heaviest else "",
            ]
        )
        failed = not row.reported or row.exit.status in ("error", "oom")
        classes.append("hl" if row.rank == heaviest else "bad" if failed else "")
    ranks_table = table(headers, body, left=2, row_classes=classes, text_columns=[-3, -2, -1])
    by_rank = _categories_table(rows)
    return Section(
        "ranks.html",
        "ranks",
        "Ranks",
        f"Ranks ({len(rows)})",
        f"One row per rank of the job. The rest of this page is rank {_s(job.get('rank'))}'s "
        "own report" + (" (the heaviest)." if heaviest is not None else "."),
        {
            "chart": _chart(rows, measures[0], heaviest, figures),
            "table": ranks_table,
            "categories": by_rank,
            "lines": [t for t in (jobtext.imbalance(job), jobtext.gathering(job)) if t],
            "memory": jobtext.memory(job),
        },
    )


def _chart(
    rows: list[RankEntry], measure: tuple[str, str], heaviest: Any, figures: dict[str, Any]
) -> Chart | None:
    """A bar per rank of the measure that names the heaviest rank."""
    name, key = measure
    values = [getattr(r.peak, key) if r.reported else None for r in rows]
    if len(rows) < 2 or not any(v is not None for v in values):
        return None
    go = charts.go()
    unit, scale = unit_for(max(v for v in values if v is not None))
    colors = [
        SERIES_COLORS["host_rss" if key == "host_rss_bytes" else "allocated"]
        if r.rank != heaviest
        else "#dc2626"
        for r in rows
    ]
    fig = go.Figure(
        go.Bar(
            x=[f"rank {r.rank}" for r in rows],
            y=scaled(values, scale),
            marker={"color": colors},
            customdata=[chart_text(r.host or "") for r in rows],
            hovertemplate=f"%{{x}} (%{{customdata}}): %{{y:.2f}} {unit}<extra></extra>",
        )
    )
    fig.update_layout(
        height=260,
        yaxis={"title": {"text": f"{name} ({unit})"}, "rangemode": "tozero"},
        margin={"l": 60, "r": 20, "t": 20, "b": 40},
    )
    figures["chart-ranks"] = figure_dict(fig)
    return Chart("chart-ranks", 260)


def _categories_table(rows: list[RankEntry]) -> Any:
    """What each rank's peak is made of, side by side (categories some rank measured)."""
    reported = [r for r in rows if r.reported]
    names = [n for n in CATEGORY_NAMES if any(getattr(r.categories_at_peak, n) for r in reported)]
    if len(reported) < 2 or not names:
        return None
    body = [[str(r.rank), *(b(getattr(r.categories_at_peak, n)) for n in names)] for r in reported]
    return table(["rank", *(n.replace("_", " ") for n in names)], body)
