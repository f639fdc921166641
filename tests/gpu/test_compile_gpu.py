"""torch.compile on the GPU under tracking: inductor, CUDA graphs, exact phase peaks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vramscope
from vramscope.examples import build_gpt
from vramscope.report.model import Report
from vramscope.workload import StepRunner

from .windows import manual_phase_peaks

pytestmark = pytest.mark.gpu
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compiled_gpt.py"


def _run(*argv: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=900, env=env
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _compare(tracked: dict, plain: dict) -> None:
    assert tracked["frames"] == plain["frames"]
    assert tracked["graphs"] == plain["graphs"]
    assert tracked["graph_breaks"] == plain["graph_breaks"]
    for a, b in zip(tracked["losses"], plain["losses"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-4), (tracked["losses"], plain["losses"])


@pytest.mark.parametrize(
    "options",
    [
        ("--backend", "inductor"),
        ("--backend", "inductor", "--mode", "max-autotune-no-cudagraphs"),
        ("--backend", "inductor", "--mode", "reduce-overhead"),
        ("--backend", "inductor", "--compile", "method"),
        ("--backend", "inductor", "--compile", "step"),
    ],
    ids=["inductor", "max-autotune-no-cudagraphs", "reduce-overhead", "method", "step"],
)
def test_compiled_script_under_run_is_the_plain_run_with_exact_peaks(tmp_path, options):
    out = tmp_path / "r.json"
    plain = _run(str(SCRIPT), *options)
    tracked = _run("-m", "vramscope", "run", "--json", str(out), str(SCRIPT), *options)
    _compare(tracked, plain)
    report = Report.load(out)
    assert report.exit.status == "ok"
    assert report.peak.allocated_bytes == tracked["max_allocated"]
    assert report.peak.reserved_bytes == tracked["max_reserved"]
    assert sum(1 for s in report.steps if s.mode == "train") == 3
    end = next(r for r in report.reconciliation if r.moment == "end")
    if "reduce-overhead" in options:
        assert end.private_pools_bytes and end.private_pools_bytes > 0
        assert end.private_pools_bytes <= end.reserved_bytes
        assert any(f.kind == "private_pools" for f in report.findings)
    else:
        assert not end.private_pools_bytes


def test_modules_detail_keeps_the_compiled_model_compiled(tmp_path):
    out = tmp_path / "r.json"
    options = ("--backend", "inductor")
    plain = _run(str(SCRIPT), *options)
    tracked = _run(
        "-m", "vramscope", "run", "--detail", "modules", "--json", str(out), str(SCRIPT), *options
    )
    _compare(tracked, plain)
    report = Report.load(out)
    assert report.peak.allocated_bytes == tracked["max_allocated"]
    assert "torch.compile" in " ".join(report.extra.get("attribution_notes", []))


def test_module_markers_on_some_steps_keep_the_compiled_model_compiled(tmp_path):
    """--module-steps 2: the markers turn on and off between steps; no frame compiles again."""
    out = tmp_path / "r.json"
    options = ("--backend", "inductor", "--steps", "9")
    plain = _run(str(SCRIPT), *options)
    tracked = _run(
        "-m", "vramscope", "run", "--detail", "modules", "--module-steps", "2",
        "--json", str(out), str(SCRIPT), *options,
    )  # fmt: skip
    _compare(tracked, plain)
    report = Report.load(out)
    assert report.peak.allocated_bytes == tracked["max_allocated"]
    schedule = report.extra["attribution"]["module_steps"]
    assert schedule["unmarked_steps"] > 0, schedule


@pytest.mark.parametrize("how", ["model", "method"])
def test_compiled_phase_peaks_equal_max_memory_allocated_windows(how):
    device = torch.device("cuda")
    w = build_gpt(8, device)
    if how == "model":
        w.model = torch.compile(w.model)
    else:
        w.model.compile()
    runner = StepRunner(w, device)
    for _ in range(3):  # compile, optimizer state, workspaces
        runner()
    expected = manual_phase_peaks(runner)
    with vramscope.track() as session:
        manual_phase_peaks(runner)  # discovery sees this model: its class is wrapped
        w.optimizer.zero_grad(set_to_none=True)
        manual_phase_peaks(runner)
    report = session.report()
    step = report.steps[-1]
    got = {p.name: p.peak_allocated_bytes for p in step.phases}
    for name in ("forward", "backward", "optimizer"):
        assert got[name] == expected[name], (name, got, expected)
