"""On a GPU: a stopped CUDA run leaves its report with the allocator's peaks, and fit
--verify's headline is the verified answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope import schema

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "train_until_stopped.py"


def test_a_cuda_run_stopped_by_sigterm_leaves_its_report(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramscope", "run", "-q", "--json", "r.json", str(SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    for line in proc.stdout:
        if "training" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    data = json.loads((tmp_path / "r.json").read_text())
    assert schema.errors(data) == []
    assert data["exit"]["status"] == "terminated" and data["exit"]["signal"] == "SIGTERM"
    assert data["device"]["name"].startswith("NVIDIA")
    assert data["peak"]["allocated_bytes"] > 0 and data["peak"]["reserved_bytes"] > 0
    assert len(data["steps"]) >= 1


def test_fit_verify_headline_is_the_verified_answer(tmp_path):
    out = tmp_path / "fit.json"
    args = ["fit", "example:cnn", "--budget", "2GiB", "--verify", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300"},  # the headline on one line
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    section = data["fit"]
    answer = section["answer"]
    assert answer["source"] == "verify" and answer["margin_applied"] is False
    assert answer["max_batch_size"] == section["verify"]["max_batch_size"]
    assert answer["real_trials"] == len(section["verify"]["trials"])
    statuses = {t["batch_size"]: t["status"] for t in section["verify"]["trials"]}
    assert statuses[answer["max_batch_size"]] == "fits"
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Largest"))
    assert lines[at] == f"Largest batch size: {answer['max_batch_size']:,}"
    assert (
        lines[at + 2]
        .strip()
        .startswith(
            f"verified with {answer['real_trials']} real trials at the full budget; the estimate "
            f"said {section['max_batch_size']:,} with the 5% margin"
        )
    )
    assert "Verified with" not in proc.stdout
