"""Every table reads at 80 columns, as in a log file (stdout not a terminal): no cell cut
with "…", no line wider than 80; a wide terminal gets the full tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

import vramscope
from vramscope.cli.info import render_info
from vramscope.devices import SystemInfo
from vramscope.fit.compare import compare
from vramscope.fit.search import fit
from vramscope.report.diff import diff_reports, render_terminal
from vramscope.report.model import Report
from vramscope.report.terminal import render

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SAVED = ["report_h200_gpt.json", "report_h200_leak.json", "fit_cpu_cnn_2g.json"]
# one worker runs this module (`--dist loadgroup`): the reports are made once
pytestmark = pytest.mark.xdist_group("widths")
WIDE = (
    "import torch, vramscope\n"
    "def build(batch_size, device):\n"
    "    m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),\n"
    "                            torch.nn.Linear(1024, 256)).to(device)\n"
    "    return vramscope.Workload(model=m, optimizer=torch.optim.AdamW(m.parameters()),\n"
    "        batch=lambda: (torch.randn(batch_size, 256, device=device),),\n"
    "        loss=lambda m, x: m(x).square().mean())\n"
)


def text_of(renderable: RenderableType, width: int) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=width, record=True, file=sink, color_system=None)
        console.print(renderable)
    return console.export_text()


def assert_reads_at(text: str, width: int) -> None:
    for line in text.splitlines():
        assert len(line) <= width, line
        assert "…" not in line, line


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Report]:
    """Saved reports (an H200 run, a leaking run, a fit) and fresh CPU ones: a run with the
    module tree, peak tensors and line tables; compare with every strategy; two variants;
    micro-batch plans."""
    out = {name: Report.load(DATA / name) for name in SAVED}
    out["cpu-lines"] = vramscope.measure(
        "example:cnn", batch_size=2, steps=2, device="cpu", detail="lines"
    )
    folder = tmp_path_factory.mktemp("wl")
    for name in ("narrow", "a_much_longer_variant_name"):
        (folder / f"{name}.py").write_text(WIDE)
    spec = f"{folder / 'narrow.py'}:build"
    out["compare"] = compare([spec], batch_size=8, gpu="h200", measured=False)
    out["variants"] = compare(
        [spec, f"{folder / 'a_much_longer_variant_name.py'}:build"], batch_size=8, gpu="h200"
    )
    out["plans"] = fit(spec, gpu="h200", max_batch_size=64, effective_batch=64)
    return out


@pytest.mark.parametrize("name", [*SAVED, "cpu-lines", "compare", "variants", "plans"])
def test_a_report_reads_at_80_columns(reports, name):
    text = text_of(render(reports[name]), 80)
    assert_reads_at(text, 80)
    assert "What the peak is made of" in text


def test_narrow_steps_move_the_phase_peaks_to_a_table_of_their_own(reports):
    report = reports["report_h200_gpt.json"]
    narrow, wide = text_of(render(report), 80), text_of(render(report), 200)
    assert "Peak allocated in each phase, per step" in narrow and "fwd peak" not in narrow
    assert "fwd peak" in wide and "Peak allocated in each phase" not in wide
    # the same numbers either way: step 1's backward peak
    assert narrow.count("774.47 MiB") == wide.count("774.47 MiB")
    assert max(len(line) for line in wide.splitlines()) > 80


def test_narrow_module_and_line_tables_keep_every_column(reports):
    narrow = text_of(render(reports["cpu-lines"]), 80)
    for header in ("params", "grads", "optim", "activations", "fwd temps", "bwd temps"):
        assert header in narrow
    # line tables become a listing of the code, each line that ran with its numbers under it
    assert "    model = ExampleCNN().to(device)" in narrow
    after = narrow.split("    model = ExampleCNN().to(device)", 1)[1].splitlines()[1]
    for label in ("hits 1", "mem ", "peak ", "incr. +", "host RSS "):
        assert label in after
    wide = text_of(render(reports["cpu-lines"]), 200)
    for header in ("Mem usage", "Increment", "Host RSS", "RSS incr.", "Line Contents"):
        assert header in wide


def test_a_long_run_marks_the_steps_left_out_without_an_ellipsis():
    data = json.loads((DATA / "report_h200_leak.json").read_text())
    report = Report.from_dict(data)
    assert len(report.steps) > 12
    text = text_of(render(report), 80)
    assert "⋮" in text
    assert_reads_at(text, 80)


def test_a_diff_reads_at_80_columns(reports):
    diff = diff_reports(reports["report_h200_gpt.json"], reports["report_h200_leak.json"])
    assert_reads_at(text_of(render_terminal(diff), 80), 80)


def test_info_reads_at_80_columns_and_keeps_its_table_when_wide():
    reading = json.loads((DATA / "nvml_h200.json").read_text())["readings"][-1]
    info = SystemInfo.from_dict(reading)
    narrow, wide = text_of(render_info(info), 80), text_of(render_info(info), 200)
    assert_reads_at(narrow, 80)
    assert "record_nvml_fixture.py: 1 GiB a step" in wide  # one line, whole
    assert "ALLOCATED / RESERVED" in wide


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(DATA / "report_h200_gpt.json")],
        [
            "report",
            str(DATA / "report_h200_gpt.json"),
            "--diff",
            str(DATA / "report_h200_leak.json"),
        ],
        ["report", str(DATA / "fit_cpu_cnn_2g.json")],
    ],
    ids=["report", "diff", "fit"],
)
def test_a_log_file_is_80_columns_and_a_wide_terminal_is_not(args):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    log = subprocess.run(
        [sys.executable, "-m", "vramscope", *args], capture_output=True, text=True, env=env
    )
    assert log.returncode == 0, log.stderr
    assert_reads_at(log.stdout, 80)
    wide = subprocess.run(
        [sys.executable, "-m", "vramscope", *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
    )
    assert max(len(line) for line in wide.stdout.splitlines()) > 80
