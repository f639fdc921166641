"""The whole report page: its sections in reading order and the table of contents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markupsafe import Markup

from vramscope.report.html import (
    categories,
    findings,
    fit,
    header,
    modules,
    oom,
    phases,
    ranks,
    reconciliation,
    startup,
    steps,
    timeline,
    validation,
    verdict,
)
from vramscope.report.html.blocks import Section
from vramscope.report.html.charts import PLOTLY_CONFIG
from vramscope.report.html.environment import plotlyjs_payload, render_template
from vramscope.report.model import Report


def page_context(
    title: str,
    figures: dict[str, Any],
    nav: list[tuple[str, str]],
    compress_plotlyjs: bool = True,
) -> dict[str, Any]:
    """What ``templates/base.html`` needs besides its blocks: title, contents, chart data."""
    encoding, plotlyjs = plotlyjs_payload(compress_plotlyjs)
    return {
        "title": title,
        "nav": nav,
        "plotly_config": PLOTLY_CONFIG,
        "figures": figures,
        "plotlyjs_encoding": encoding,
        "plotlyjs": Markup(plotlyjs),  # a base64 text, or a script whose "</script" is escaped
    }


def sections(report: Report, figures: dict[str, Any]) -> list[Section]:
    """The report's cards in reading order; those without data are left out."""
    parts = [
        oom.section(report),
        verdict.section(report),
        findings.section(report),
        ranks.section(report, figures),
        timeline.section(report, figures),
        fit.section(report, figures),
        validation.section(report, figures),
        categories.section(report, figures),
        reconciliation.section(report, figures),
        modules.section(report, figures),
        phases.section(report, figures),
        steps.section(report, figures),
        steps.epochs_section(report),
        startup.section(report),
    ]
    return [part for part in parts if part is not None]


def render(report: Report, compress_plotlyjs: bool = True) -> str:
    """The whole report as one self-contained HTML page."""
    figures: dict[str, Any] = {}
    cards = sections(report, figures)
    return render_template(
        "report.html",
        header=header.context(report),
        peakline=header.explain_peak(report),
        unavailable=header.unavailable(report),
        sections=cards,
        report=report,
        **page_context(
            f"vramscope · {header.workload_title(report)}",
            figures,
            [(s.anchor, s.nav) for s in cards],
            compress_plotlyjs,
        ),
    )


def write(report: Report, path: str | Path) -> Path:
    """Write the HTML report to ``path``."""
    target = Path(path)
    target.write_text(render(report), encoding="utf-8")
    return target
