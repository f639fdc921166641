"""`vramscope demo` on a GPU: each example measured there in a fresh process, the estimate for
that GPU beside it with its error, one screen of 80 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_demo_on_a_gpu_shows_measured_and_estimated_with_the_error(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "demo", "--gpu", "rtx4090"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "n/a" not in proc.stdout
    name = torch.cuda.get_device_name(0)
    assert f"Measured on {name}" in proc.stdout and f"Estimated for {name}" in proc.stdout
    data = json.loads((tmp_path / "vramscope-demo.json").read_text())
    for spec, measured in data["reports"].items():
        assert measured["device"]["type"] == "cuda" and measured["exit"]["status"] == "ok"
        own = next(iter(data["estimates"][spec].values()))  # this machine's GPU comes first
        validation = own["validation"]
        assert validation["measured"]["allocated_bytes"] == measured["peak"]["allocated_bytes"]
        # allocated does not depend on the (possibly uncalibrated) context: within 2 %
        assert abs(validation["error_pct"]["allocated"]) <= 2.0, (spec, validation)
        shown = f"{validation['error_pct']['allocated']:+.1f}%"
        assert shown in proc.stdout
    assert (tmp_path / "vramscope-demo-gpt.html").exists()
