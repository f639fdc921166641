"""Steps and epochs: memory step by step (long runs thinned), and a row per epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramscope.report.aggregate import holds_step, step_label
from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import (
    SERIES_COLORS,
    downsample_minmax,
    duration,
    figure_dict,
    largest,
    scaled,
    unit_for,
)
from vramscope.report.model import Report, StepStats
from vramscope.units import format_bytes as b

STEP_ROWS_HEAD = 10  # the steps table shows the first and last rows and the peak step
STEP_ROWS_TAIL = 10


def pick_step_rows(
    steps: Sequence[StepStats], head: int = STEP_ROWS_HEAD, tail: int = STEP_ROWS_TAIL
) -> list[StepStats | None]:
    """The first and last steps and the peak step; ``None`` marks each elision."""
    if len(steps) <= head + tail + 1:
        return list(steps)
    keep = {id(s) for s in steps[:head]} | {id(s) for s in steps[-tail:]}
    with_peak = [s for s in steps if s.peak_allocated_bytes is not None]
    if with_peak:
        keep.add(id(max(with_peak, key=lambda s: s.peak_allocated_bytes or 0)))
    with_rss = [s for s in steps if s.host_rss_bytes is not None]
    if with_rss:
        keep.add(id(max(with_rss, key=lambda s: s.host_rss_bytes or 0)))
    rows: list[StepStats | None] = []
    skipped = False
    for s in steps:
        if id(s) in keep:
            if skipped:
                rows.append(None)
            rows.append(s)
            skipped = False
        else:
            skipped = True
    return rows


def _phase_peak(step: StepStats, name: str) -> int | None:
    values = [p.peak_allocated_bytes for p in step.phases if p.name == name]
    return largest(values)  # type: ignore[return-value]


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """Peak and end-of-step memory per step: a chart of every step, a table of some."""
    steps = report.steps
    if not steps:
        return None
    go = charts.go()
    gpu = any(s.peak_allocated_bytes is not None for s in steps)
    series = (
        [
            ("peak_allocated_bytes", "peak allocated", SERIES_COLORS["allocated"], "solid"),
            ("peak_reserved_bytes", "peak reserved", SERIES_COLORS["reserved"], "solid"),
            ("end_allocated_bytes", "allocated at step end", "#0ea5e9", "dot"),
        ]
        if gpu
        else [("host_rss_bytes", "host RSS", SERIES_COLORS["host_rss"], "solid")]
    )
    top = max((largest([getattr(s, f) for s in steps]) or 0) for f, *_ in series)
    unit, scale = unit_for(top)
    fig = go.Figure()
    index = [s.index for s in steps]
    for field, name, color, dash in series:
        xs, ys = downsample_minmax(index, [getattr(s, field) for s in steps])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=scaled(ys, scale),
                name=name,
                mode="lines+markers" if len(xs) <= 200 else "lines",
                line={"color": color, "dash": dash, "width": 1.8},
                marker={"size": 5},
                hovertemplate=f"%{{y:.2f}} {unit}",
            )
        )
    fig.update_layout(
        height=300,
        hovermode="x unified",
        xaxis={"title": {"text": "step"}, "automargin": False},  # numbers: the margins hold them
        yaxis={"title": {"text": unit}, "rangemode": "tozero", "automargin": False},
        legend={"orientation": "h", "y": 1.14},
        margin={"l": 60, "r": 20, "t": 42, "b": 40},  # t: what the legend pushes it to
    )
    figures["chart-steps"] = figure_dict(fig)
    epochs = len({s.epoch for s in steps}) > 1
    modes = len({s.mode for s in steps}) > 1
    headers = ["step"] + (["epoch"] if epochs else []) + (["mode"] if modes else [])
    if gpu:
        headers += ["peak allocated", "peak reserved", "allocated at end", "change in step"]
        headers += ["forward peak", "backward peak", "optimizer peak"]
    headers += ["host RSS", "time"]
    rows: list[list[str] | None] = []
    classes: list[str] = []
    for s in pick_step_rows(steps):
        if s is None:
            rows.append(None)
            classes.append("")
            continue
        row = [step_label(s)] + ([str(s.epoch)] if epochs else []) + ([s.mode] if modes else [])
        if gpu:
            change = ""
            if s.end_allocated_bytes is not None and s.start_allocated_bytes is not None:
                grew = s.end_allocated_bytes - s.start_allocated_bytes
                change = b(grew, signed=True) if grew else "0 B"
            row += [
                b(s.peak_allocated_bytes),
                b(s.peak_reserved_bytes),
                b(s.end_allocated_bytes),
                change,
            ]
            row += [
                b(v) if v is not None else ""
                for v in (_phase_peak(s, n) for n in ("forward", "backward", "optimizer"))
            ]
        row += [b(s.host_rss_bytes), duration(s.duration_s)]
        rows.append(row)
        classes.append("hl" if holds_step(s, report.peak.step) and gpu else "")
    summary = ""
    if len(steps) > STEP_ROWS_HEAD + STEP_ROWS_TAIL + 1:
        shown = sum(1 for r in rows if r is not None)
        durations = sorted(s.duration_s / max(1, s.count) for s in steps)
        total = sum(s.count for s in steps)
        counted = f"{total:,} steps" + (
            "" if total == len(steps) else f" in {len(steps):,} entries"
        )
        summary = (
            f"{counted}; {shown} shown (the first, the last and the peak). Median "
            f"step time {duration(durations[len(durations) // 2])}; all steps are in the JSON "
            "and the --csv export."
        )
    return Section(
        "steps.html",
        "steps",
        "Steps",
        "Steps",
        "Peak and end-of-step memory for every step; a rising end-of-step line means "
        "something keeps tensors alive between steps.",
        {
            "chart": Chart("chart-steps", 300),
            "table": table(headers, rows, left=1, row_classes=classes),
            "note": summary,
        },
    )


def epochs_section(report: Report) -> Section | None:
    """A row per epoch, when the run had more than one."""
    if len(report.epochs) < 2:
        return None
    rows = [
        [
            str(e.index),
            f"{e.steps:,}",
            b(e.peak_allocated_bytes),
            b(e.peak_reserved_bytes),
            b(e.end_allocated_bytes),
            b(e.host_rss_bytes),
            duration(e.duration_s),
        ]
        for e in report.epochs
    ]
    return Section(
        "epochs.html",
        "epochs",
        "Epochs",
        "Epochs",
        "",
        {
            "table": table(
                [
                    "epoch",
                    "steps",
                    "peak allocated",
                    "peak reserved",
                    "allocated at end",
                    "host RSS",
                    "time",
                ],
                rows,
            )
        },
    )
