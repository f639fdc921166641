"""Render a Report as one self-contained HTML page: plotly charts, tables and findings.

The page opens offline: plotly.js comes from the installed ``plotly`` package and is
embedded once (gzip + base64, unpacked by the browser's DecompressionStream, so a report
weighs about 2 MB instead of 5). Tables and text are plain HTML and read without
JavaScript. The timeline and the charts in view are drawn first, the others next, nearest
to the screen first. Every string that comes from the user's code or machine is escaped,
in HTML and in the JSON handed to the charts. Long runs are thinned for drawing (min and
max per bucket, so every peak stays) and their tables capped. Knows nothing of torch.

The markup lives in ``templates/`` (``base.html``, ``report.html``, one template per
section, the CSS and JavaScript under ``assets/``); the modules here only shape data:
one per section, ``page`` puts them in order and ``environment`` renders the templates.
"""

from __future__ import annotations

from vramscope.report.html.categories import categories_over_time
from vramscope.report.html.charts import (
    MAX_POINTS,
    chart_text,
    downsample_minmax,
    figure_dict,
    unit_for,
)
from vramscope.report.html.environment import escape, plotlyjs_payload, script_json
from vramscope.report.html.header import explain_peak, workload_title
from vramscope.report.html.modules import module_tree
from vramscope.report.html.page import render, write
from vramscope.report.html.reconciliation import reconciliation_steps
from vramscope.report.html.steps import STEP_ROWS_HEAD, STEP_ROWS_TAIL, pick_step_rows
from vramscope.report.html.timeline import MAX_BANDS, phase_bands

__all__ = [
    "MAX_BANDS",
    "MAX_POINTS",
    "STEP_ROWS_HEAD",
    "STEP_ROWS_TAIL",
    "categories_over_time",
    "chart_text",
    "downsample_minmax",
    "escape",
    "explain_peak",
    "figure_dict",
    "module_tree",
    "phase_bands",
    "pick_step_rows",
    "plotlyjs_payload",
    "reconciliation_steps",
    "render",
    "script_json",
    "unit_for",
    "workload_title",
    "write",
]
