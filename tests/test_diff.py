"""What changed between two runs: the pure diff, the terminal and HTML views, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from vramscope.cli.main import cli
from vramscope.report.diff import diff_reports, render_html, render_terminal
from vramscope.report.model import Report

DATA = Path(__file__).parent / "data"
MIB = 2**20


def load(name: str) -> Report:
    return Report.load(DATA / name)


@pytest.fixture(scope="module")
def diff():
    return diff_reports(load("report_h200_gpt.json"), load("report_h200_leak.json"), "gpt", "leak")


def test_peaks_change_by_bytes_and_percent(diff):
    allocated = diff.row("peak", "allocated")
    assert (allocated.a, allocated.b) == (812094976, 107277312)
    assert allocated.delta == 107277312 - 812094976
    assert allocated.pct == pytest.approx(-86.79, abs=0.01)
    assert diff.row("peak", "device used").delta == 0


def test_categories_layers_and_phases_are_compared(diff):
    assert diff.row("categories", "activations").b == 0
    assert diff.row("categories", "activations").pct == -100
    assert diff.row("layers", "fragmentation").a == 114846208
    data = diff.row("phases", "data")  # only the script has a data phase
    assert data.a is None and data.b == 105180160 and data.delta is None


def test_the_set_up_differences_are_listed(diff):
    keys = {key for key, _, _ in diff.workload_changes}
    assert {"spec", "batch_size", "argv"} <= keys
    assert diff.device_changes == []


def test_a_report_against_itself_changes_nothing():
    report = load("report_h200_gpt.json")
    same = diff_reports(report, report)
    assert all(r.delta in (0, None) for r in same.rows)
    assert same.workload_changes == []


def test_modules_are_matched_by_name_and_sorted_by_change():
    a, b = load("report_h200_gpt.json"), load("report_h200_gpt.json")
    a.modules = [
        {"name": "h.0", "activations_bytes": 10 * MIB},
        {"name": "h.1", "activations_bytes": MIB},
    ]
    b.modules = [
        {"name": "h.0", "activations_bytes": 4 * MIB, "parameters_bytes": MIB},
        {"name": "h.1", "activations_bytes": MIB},
        {"name": "h.2", "activations_bytes": 2 * MIB},
    ]
    rows = diff_reports(a, b).section("modules")
    assert [r.name for r in rows] == ["h.0", "h.2", "h.1"]
    assert rows[0].delta == -5 * MIB
    assert next(r for r in rows if r.name == "h.2").a is None


def test_the_terminal_view_shows_changes_with_signs(diff):
    console = Console(record=True, width=120)
    console.print(render_terminal(diff))
    text = console.export_text()
    assert "a gpt → b leak" in text
    assert "-672.17 MiB" in text and "-86.8%" in text
    assert "What the peak is made of" in text and "Peak allocated by phase" in text


def test_the_html_view_is_escaped_and_colours_the_changes():
    a, b = load("report_h200_gpt.json"), load("report_h200_leak.json")
    b.workload["spec"] = "<script>alert(1)</script>"
    page = render_html(diff_reports(a, b, "<b>a</b>", "b.json"), a, b)
    assert "<script>alert(1)</script>" not in page and "<b>a</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<td class="neg">-672.17 MiB</td>' in page
    figures = json.loads(
        re.search(r'id="vs-figures">(.*?)</script>', page, re.S).group(1)  # type: ignore[union-attr]
    )
    assert {"chart-diff-peak", "chart-diff-categories", "chart-diff-phases"} <= set(figures)


def test_report_diff_on_the_command_line(tmp_path):
    out_html, out_json = tmp_path / "d.html", tmp_path / "d.json"
    result = CliRunner().invoke(
        cli,
        [
            "report",
            str(DATA / "report_h200_gpt.json"),
            "--diff",
            str(DATA / "report_h200_leak.json"),
            "--html",
            str(out_html),
            "--json",
            str(out_json),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "report_h200_gpt.json" in result.output and "-86.8%" in result.output
    assert "what changed between two runs" in out_html.read_text()
    saved = json.loads(out_json.read_text())
    assert saved["schema"] == "vramscope.diff/1"
    assert next(r for r in saved["rows"] if r["name"] == "allocated")["delta"] == -704817664


def test_report_diff_refuses_single_report_exports(tmp_path):
    result = CliRunner().invoke(
        cli,
        [
            "report",
            str(DATA / "report_h200_gpt.json"),
            "--diff",
            str(DATA / "report_h200_leak.json"),
            "--csv",
            str(tmp_path / "x.csv"),
        ],
    )
    assert result.exit_code != 0
    assert "drop them when using --diff" in str(result.exception)
