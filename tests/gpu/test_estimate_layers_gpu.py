"""The layer workloads of ``tests/layer_workloads.py``: estimated against a real run on this
GPU, each measured in a fresh process (memory a library caches for the process, such as
cuDNN's dropout state, would otherwise carry over from one case to the next). Recurrent
layers are held to the issue's target (allocated within 2 %), the others to the accuracy
suite's 90th-percentile target (3 %)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vramscope.estimate.estimator import estimate
from vramscope.estimate.profiles import PROFILES
from vramscope.report.model import Report

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from layer_workloads import BUILDERS, CASES, RECURRENT  # noqa: E402


def _profile() -> str:
    name = torch.cuda.get_device_name(0)
    return next((p.name for p in PROFILES if p.display_name == name), "h200")


@pytest.mark.parametrize("name", list(CASES))
def test_layer_estimate_matches_the_gpu(name, tmp_path):
    batch, precision = CASES[name]
    spec = f"{TESTS / 'layer_workloads.py'}:{BUILDERS.get(name, name)}"
    out = tmp_path / "measured.json"
    command = [sys.executable, "-m", "vramscope", "measure", spec, "-b", str(batch)]
    command += ["--precision", precision, "--steps", "3", "--json", str(out), "--quiet"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = Report.load(out)
    estimated = estimate(spec, batch, gpu=_profile(), precision=precision)
    error = estimated.peak.allocated_bytes / measured.peak.allocated_bytes - 1
    limit = 0.02 if name in RECURRENT else 0.03
    assert abs(error) <= limit, (
        f"{name}: estimated {estimated.peak.allocated_bytes:,} B, measured "
        f"{measured.peak.allocated_bytes:,} B ({error:+.2%})"
    )


def _measured_peak(spec: str, batch: int, steps: int, tmp_path: Path) -> int:
    out = tmp_path / f"{spec.rsplit(':', 1)[1]}.json"
    command = [sys.executable, "-m", "vramscope", "measure", spec, "-b", str(batch)]
    command += ["--steps", str(steps), "--json", str(out), "--quiet"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Report.load(out).peak.allocated_bytes


def test_lengths_drawn_in_every_step_are_estimated_at_their_longest(tmp_path):
    """A packed LSTM whose batch draws its lengths in every step: the estimate (every length
    at the top of its range) is the measured peak of every sequence at full length, within
    the recurrent 2 %, and above what 20 steps of drawn lengths reached."""
    batch = 32
    drawn = f"{TESTS / 'layer_workloads.py'}:lstm_drawn_lengths"
    longest = f"{TESTS / 'layer_workloads.py'}:lstm_longest_lengths"
    estimated = estimate(drawn, batch, gpu=_profile(), precision="32-true")
    assert estimated.extra["estimate"]["integer_draws"]["at_top"] is True
    full = _measured_peak(longest, batch, 3, tmp_path)
    reached = _measured_peak(drawn, batch, 20, tmp_path)
    assert abs(estimated.peak.allocated_bytes / full - 1) <= 0.02, (estimated.peak, full)
    assert reached <= estimated.peak.allocated_bytes, (reached, estimated.peak)
