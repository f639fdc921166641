"""The HTML pages stay as they were: each sample renders exactly as its committed golden file.

A golden file is the page without the embedded plotly.js (the installed package's, checked
in test_html.py), CSS and JavaScript (the package's own files), and with the chart data
printed one value a line, so that a change shows as a readable diff. After a change to the
pages that is meant, rewrite them with
``VRAMSCOPE_UPDATE_GOLDEN=1 python -m pytest tests/test_html_golden.py`` and read the diff.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from vramscope.report import html
from vramscope.report.diff import diff_reports, render_html
from vramscope.report.html.environment import asset
from vramscope.report.model import Finding, OomInfo, Report

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "html_golden"
XSS = "<script>alert(1)</script>"
GIB, MIB = 2**30, 2**20
ASSETS = ("report.css", "loader.js")


def load(name: str) -> Report:
    return Report.load(DATA / name)


def estimate_with_everything() -> Report:
    """The GPT fixture as an estimate with every optional section and hostile strings."""
    report = load("report_h200_gpt.json")
    report.kind = "estimated"
    report.workload["spec"] = f"it's {XSS}"
    report.workload["argv"] = ["train.py", "--name", f'"{XSS}"']
    report.findings.append(Finding("odd", "note", f"{XSS} & more"))
    report.unavailable["reconciliation.end"] = XSS
    report.extra["verdict"] = {
        "fits": False,
        "headroom_bytes": -3 * GIB,
        "gpu": "24 GB card",
        "closest_strategy": "bf16-mixed",
        "activations_bytes": 5 * GIB,
    }
    report.extra["validation"] = {
        "estimated": {"peak": {"allocated_bytes": 800 * MIB, "reserved_bytes": 900 * MIB}},
        "measured": {"peak": {"allocated_bytes": 774 * MIB, "reserved_bytes": 884 * MIB}},
    }
    report.extra["fit"] = {
        "max_batch_size": 12,
        "budget_bytes": 20 * GIB,
        "strategies": [
            {"name": "baseline", "max_batch_size": 12, "peak": {"allocated_bytes": 8 * GIB}},
            {"name": XSS, "max_batch_size": 20, "peak": {"allocated_bytes": 5 * GIB}},
        ],
        "curve": [
            {"batch_size": 8, "peak": {"allocated_bytes": 6 * GIB, "reserved_bytes": 7 * GIB}},
            {"batch_size": 16, "peak": {"allocated_bytes": 11 * GIB, "reserved_bytes": 12 * GIB}},
        ],
    }
    report.modules = [
        {"name": "", "class": "GPT", "peak_bytes": 700 * MIB, "share_of_peak": 0.9},
        {"name": "blocks.0", "class": "Block", "peak_bytes": 300 * MIB, "share_of_peak": 0.4},
        {"name": f"blocks.0.{XSS}", "class": "<Attn>", "peak_bytes": 100 * MIB},
        {"name": "head", "class": "Linear", "peak_bytes": 50 * MIB},
    ]
    report.extra["attribution_notes"] = [f"modules are {XSS}"]
    report.extra["categories_over_time"] = {
        "t": [0.0, 0.5, 1.0],
        "parameters": [10 * MIB, 10 * MIB, 10 * MIB],
        "activations": [0, 400 * MIB, 5 * MIB],
    }
    return report


def out_of_memory() -> Report:
    """The leak fixture ended by an OOM, with the allocator's largest blocks."""
    report = copy.deepcopy(load("report_h200_leak.json"))
    report.exit.status, report.exit.code = "oom", 1
    report.exit.error = "CUDA out of memory. Tried to allocate 2.00 GiB"
    report.oom = OomInfo(
        phase="forward",
        step=7,
        module="blocks.3.<mlp>",
        message=f"{report.exit.error} {XSS}",
        requested_bytes=2 * GIB,
        allocated_bytes=130 * GIB,
        reserved_bytes=136 * GIB,
        fragmentation_bytes=GIB,
        free_bytes=GIB,
        total_bytes=140 * GIB,
        other_processes_bytes=0,
        largest_blocks=[
            {"size_bytes": 4 * GIB, "state": "active"},
            {"size_bytes": 512, "note": XSS},
        ],
        largest_free_block_bytes=600 * MIB,
    )
    return report


def diff_page() -> str:
    a, b = load("report_h200_gpt.json"), load("report_h200_leak.json")
    diff = diff_reports(a, b, "gpt.json", "<b>leak</b>.json")
    diff.notes.append(f"a note with {XSS}")
    return render_html(diff, a, b)


PAGES: dict[str, Callable[[], str]] = {
    "estimate_with_everything": lambda: html.render(estimate_with_everything()),
    "out_of_memory": lambda: html.render(out_of_memory()),
    "empty": lambda: html.render(Report()),
    "diff": diff_page,
}


def golden_text(page: str) -> str:
    """The page without plotly.js and the assets, its chart data one value a line."""
    _, payload = html.plotlyjs_payload()
    for name, text in (("plotly.js", payload), *((a, asset(a)) for a in ASSETS)):
        assert page.count(text) == 1, name
        page = page.replace(text, f"({name})")
    found = re.search(r'(<script type="application/json" id="vs-figures">)(.*?)(</script>)', page)
    assert found is not None
    figures = json.dumps(json.loads(found.group(2)), indent=0, ensure_ascii=False)
    return page[: found.start(2)] + "\n" + figures + "\n" + page[found.end(2) :]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_renders_as_its_golden_file(name):
    text = golden_text(PAGES[name]())
    path = GOLDEN / f"{name}.html"
    if os.environ.get("VRAMSCOPE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = difflib.unified_diff(
            expected.replace("><", ">\n<").splitlines(),
            text.replace("><", ">\n<").splitlines(),
            "golden",
            "rendered",
            lineterm="",
        )
        pytest.fail(f"{name} differs from {path.name}:\n" + "\n".join(list(diff)[:60]))


def test_no_user_string_reaches_the_pages_unescaped():
    for name in ("estimate_with_everything", "out_of_memory", "diff"):
        page = PAGES[name]()
        assert XSS not in page and "<b>leak</b>" not in page, name
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, name
        for block in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page):
            assert "<" not in block and "\u2028" not in block, name
