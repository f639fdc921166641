"""``%load_ext vramscope``, ``%%vramscope`` and the inline report, in a real IPython shell."""

from __future__ import annotations

import pytest

from vramscope.report.model import Report

IPython = pytest.importorskip("IPython", reason="the magic needs IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

TRAINING = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.Adam(model.parameters())
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""
WEIGHTS = (8 * 16 + 16 + 16 * 2 + 2) * 4


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "vramscope")
    return shell


def test_a_tracked_cell_shows_a_short_table_and_saves_the_report(shell, tmp_path):
    with capture_output() as captured:
        result = shell.run_cell(f"%%vramscope --json {tmp_path}/cell.json\n{TRAINING}")
    assert result.success and result.result is None

    (shown,) = captured.outputs
    page = shown.data["text/html"]
    assert page.startswith('<div class="vramscope-summary"')
    assert "<script" not in page and len(page) < 4000
    assert "3 (3 train, 0 eval)" in page
    assert "vramscope · measured · notebook cell" in shown.data["text/plain"]

    report = Report.load(tmp_path / "cell.json")
    assert [s.mode for s in report.steps] == ["train"] * 3
    assert report.categories_at_peak.parameters == WEIGHTS
    assert report.categories_at_peak.optimizer_state == 2 * WEIGHTS + 4 * 4  # Adam: 2 + step


def test_output_option_returns_the_report_with_module_detail(shell):
    with capture_output():
        result = shell.run_cell(f"%%vramscope -o --detail modules --depth 1\n{TRAINING}")
    report = result.result
    assert isinstance(report, Report)
    assert {m["name"] for m in report.modules} >= {"", "0", "2"}
    assert report.modules[0]["parameters_bytes"] == WEIGHTS


def test_a_cell_that_raises_still_shows_its_report(shell):
    with capture_output() as captured:
        result = shell.run_cell(f"%%vramscope -o\n{TRAINING}\nraise ValueError('bad batch')")
    report = result.result
    assert report.exit.status == "error" and report.exit.error == "ValueError: bad batch"
    assert len(report.steps) == 3
    assert "ValueError" in captured.stdout  # IPython showed the cell's own traceback


def test_bad_options_are_usage_errors(shell):
    for line in ("%%vramscope --detail lines", "%%vramscope --depth -1", "%%vramscope --nope"):
        with capture_output() as captured:
            result = shell.run_cell(f"{line}\nx = 1")
        assert type(result.error_in_exec).__name__ == "UsageError", line
        assert "Traceback" not in captured.stdout + captured.stderr
    with capture_output():
        result = shell.run_cell("%%vramscope --json /no/such/dir/r.json -q\nx = 1")
    assert "cannot write /no/such/dir/r.json" in str(result.error_in_exec)


def test_the_inline_table_escapes_what_came_from_the_program():
    from vramscope.tracking.session import Session

    spec = '<img src=x onerror="alert(1)">'
    session = Session(workload={"spec": spec}, status=False).start()
    session.stop()
    report = session.report()
    page = report._repr_html_()
    assert spec not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
