"""`vramscope demo` on a machine without a GPU: real CPU measurements, real estimates, one
screen of 80 columns; and its GPU layout, fed with a run recorded on an H200."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from vramscope.demo import DemoResult, ExampleResult, add_estimates
from vramscope.estimate.estimator import estimate
from vramscope.estimate.profiles import get_profile
from vramscope.examples import ExampleCNN, ExampleGPT
from vramscope.fit.search import fit
from vramscope.report.demo import render
from vramscope.report.model import Report
from vramscope.units import format_bytes, round_up

DATA = Path(__file__).parent / "data"
# one worker runs this module (`--dist loadgroup`): `vramscope demo` runs once
pytestmark = pytest.mark.xdist_group("demo")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of `vramscope demo` as a user starts it, in an empty folder, 80 columns."""
    folder = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "demo"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return {
        "stdout": proc.stdout,
        "folder": folder,
        "data": json.loads((folder / "vramscope-demo.json").read_text()),
    }


def storage_bytes(model) -> list[int]:
    """Each parameter storage's bytes, a storage shared by two parameters (tied) once."""
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    return list(storages.values())


def row(stdout: str, label: str, after: str) -> list[str]:
    """The cells of the first row called ``label`` below the line containing ``after``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    line = next(line for line in lines[start:] if line.strip().startswith(label))
    return [cell for cell in re.split(r"\s{2,}", line.strip()[len(label) :]) if cell]


def test_one_screen_of_80_columns_without_a_cell_left_empty(demo):
    lines = demo["stdout"].splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) <= 45
    assert "n/a" not in demo["stdout"]
    assert "Measured on the CPU" in demo["stdout"]
    assert "Estimated for NVIDIA H100 80GB HBM3" in demo["stdout"]
    assert "Estimated for NVIDIA GeForce RTX 4090" in demo["stdout"]


def test_the_recorded_demo_in_the_docs_has_todays_layout(demo):
    """docs/outputs/demo.txt is a recording: when the screen changes, re-record it
    (python docs/gen/record_outputs.py demo)."""
    recorded = (Path(__file__).parent.parent / "docs" / "outputs" / "demo.txt").read_text()

    def layout(text: str) -> list[str]:
        """Each line's first cell, numbers and torch's build (+cpu, +cu130) left out, a
        table's rules of any width alike (the widths follow the numbers: a slower machine's
        times widen a column)."""
        cells = [re.split(r"\s{2,}", line.strip())[0] for line in text.splitlines() if line.strip()]
        numbers = [re.sub(r"\+[a-z]+#?", "+#", re.sub(r"\d[\d.,]*", "#", c)) for c in cells]
        return [re.sub(r"─+", "─", cell) for cell in numbers]

    assert layout(recorded)[0] == "$ vramscope demo"
    assert layout(recorded)[1:] == layout(demo["stdout"])


def test_cpu_measurement_has_the_objects_exact_bytes(demo):
    reports = demo["data"]["reports"]
    assert set(reports) == {"example:cnn", "example:gpt"}
    cnn, gpt = reports["example:cnn"], reports["example:gpt"]
    for report in (cnn, gpt):
        assert report["kind"] == "measured" and report["device"]["type"] == "cpu"
        assert len(report["steps"]) == 3 and report["peak"]["host_rss_bytes"] > 0
        assert {"forward", "backward", "optimizer"} <= {p["name"] for p in report["phases"]}
    cnn_params = sum(storage_bytes(ExampleCNN()))
    gpt_params = sum(storage_bytes(ExampleGPT()))  # tied embeddings: counted once
    assert cnn["categories_at_peak"]["parameters"] == cnn_params
    assert cnn["categories_at_peak"]["gradients"] == cnn_params
    assert cnn["categories_at_peak"]["optimizer_state"] == cnn_params  # SGD momentum
    assert gpt["categories_at_peak"]["parameters"] == gpt_params
    # AdamW: two moments per parameter, and a step count per parameter tensor on the CPU
    assert 2 * gpt_params <= gpt["categories_at_peak"]["optimizer_state"] < 2 * gpt_params + 4096
    assert format_bytes(cnn_params) in row(demo["stdout"], "parameters", "Measured on")


def test_estimates_are_what_vramscope_estimate_gives(demo):
    shown = demo["data"]["estimates"]["example:gpt"]["h100-80gb"]
    again = estimate("example:gpt", batch_size=32, gpu="h100-80gb")
    assert shown["kind"] == "estimated" and shown["workload"]["batch_size"] == 32
    assert shown["peak"]["allocated_bytes"] == again.peak.allocated_bytes
    assert shown["peak"]["reserved_bytes"] == again.peak.reserved_bytes
    assert shown["peak"]["device_used_bytes"] == again.peak.device_used_bytes
    # on the GPU, parameters are allocator blocks: each storage rounded up to 512 bytes
    rounded = sum(round_up(n, 512) for n in storage_bytes(ExampleGPT()))
    assert shown["categories_at_peak"]["parameters"] == rounded
    cells = row(demo["stdout"], "peak allocated", "Estimated for NVIDIA H100")
    assert format_bytes(again.peak.allocated_bytes) in cells


def test_largest_batch_is_where_the_estimate_stops_fitting(demo):
    for spec, by_gpu in demo["data"]["estimates"].items():
        for gpu, report in by_gpu.items():
            section = report["fit"]
            best = section["answer"]["max_batch_size"]
            curve = {p["batch_size"]: p for p in section["curve"]}
            usable = section["target"]["usable_bytes"]
            assert curve[best]["fits"] and curve[best]["peak"]["device_used_bytes"] <= usable
            assert not curve[best + 1]["fits"], (spec, gpu)
            assert section["estimates"] <= 48, (spec, gpu)  # the window below the answer included
    on_4090 = demo["data"]["estimates"]["example:gpt"]["rtx4090"]["fit"]["max_batch_size"]
    assert fit("example:gpt", gpu="rtx4090").extra["fit"]["max_batch_size"] == on_4090
    cells = row(demo["stdout"], "largest batch that fits", "Estimated for NVIDIA GeForce")
    assert f"{on_4090:,}" in cells


def test_html_reports_are_written_and_named(demo):
    folder = demo["folder"]
    for name in ("cnn", "gpt"):
        page = (folder / f"vramscope-demo-{name}.html").read_text()
        best = demo["data"]["estimates"][f"example:{name}"]["h100-80gb"]["fit"]["max_batch_size"]
        assert f"Largest batch size: {best:,}" in page
    assert "vramscope-demo-cnn.html · vramscope-demo-gpt.html" in demo["stdout"]


def test_gpu_layout_puts_the_estimate_beside_a_run_recorded_on_an_h200():
    measured = Report.from_dict(json.loads((DATA / "report_h200_gpt.json").read_text()))
    example = ExampleResult("example:gpt", "a GPT", measured)
    h200 = get_profile("h200")
    add_estimates(example, ["h200"], measured.workload["batch_size"], local=h200)
    result = DemoResult("cuda", "NVIDIA H200", ["h200"], [example], steps=6, local_gpu="h200")
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(result))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "n/a" not in text
    validation = example.estimates["h200"].extra["validation"]
    for label, key in (
        ("peak allocated, error", "allocated"),
        ("peak reserved, error", "reserved"),
    ):
        estimated = validation["estimated"][f"{key}_bytes"]
        real = validation["measured"][f"{key}_bytes"]
        assert real == getattr(measured.peak, f"{key}_bytes")
        error = 100 * (estimated / real - 1)
        cell = f"{format_bytes(estimated)} {error:+.1f}%"
        assert cell in text.split(label)[1].splitlines()[0]
    # measured on the H200: the allocator's peaks, as the recording has them
    assert format_bytes(measured.peak.allocated_bytes) in row(text, "peak allocated", "Measured")
    html = result.html_report(example)
    assert html.kind == "measured" and html.extra["validation"] == validation
    assert "validation" not in measured.extra  # the measured report is left as it was
