"""On a GPU, nothing lost when a run dies: a CUDA error (a device-side assert from an index
out of range) is named in the report, and a run that hit a real CUDA out-of-memory error and
was then killed leaves a report from its journal with the allocator's peak and the OOM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope import schema

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "train_until_killed.py"


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    command = [sys.executable, "-m", "vramscope", "run", "-q", "--json", "r.json"]
    proc = subprocess.run(
        [*command, str(SCRIPT), "--device", "cuda", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads((tmp_path / "r.json").read_text())
    assert schema.errors(data) == []
    return proc, data


def done(proc: subprocess.CompletedProcess) -> list[list[str]]:
    return [line.split() for line in proc.stdout.splitlines() if line.startswith("done")]


def test_a_cuda_error_is_named_in_the_report(tmp_path):
    proc, data = run(tmp_path, "--die", "cuda-error", "--at", "3")
    assert proc.returncode != 0, proc.stderr
    code = proc.returncode if proc.returncode > 0 else 128 - proc.returncode
    assert data["exit"]["code"] == code  # whoever wrote it: the script's process, or its journal
    assert "device-side assert triggered" in data["exit"]["error"] or (
        "illegal memory access" in data["exit"]["error"]
    ), data["exit"]
    assert data["device"]["name"].startswith("NVIDIA")
    assert {0, 1, 2} <= {s["index"] for s in data["steps"]}  # (3 had not ended)
    assert data["peak"]["allocated_bytes"] >= max(int(d[4]) for d in done(proc))


def test_a_run_killed_after_a_real_cuda_oom_leaves_its_report_from_the_journal(tmp_path):
    proc, data = run(tmp_path, "--die", "cuda-oom-then-killed", "--at", "3")
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # a shell says 137
    ended = data["exit"]
    assert (ended["status"], ended["code"], ended["signal"]) == ("killed", 137, "SIGKILL")
    assert ended["source"] == "journal" and 0 <= ended["lost_seconds"] <= 1.0
    oom = next(line.split() for line in proc.stdout.splitlines() if line.startswith("oom"))
    assert int(oom[1]) > data["device"]["total_bytes"] // 2  # it filled the device
    # the memory it held after the OOM, for 1.5 s: the timeline sampled it in the step that
    # never ended (the allocator's peaks are read where a phase ends)
    assert data["peak"]["allocated_bytes"] >= int(oom[1]) - 64 * 2**20
    assert data["peak"]["step"] == 3 and data["peak"]["phase"] is None
    assert data["allocator"]["num_ooms"] >= 1
    assert any(f["kind"] == "caught_oom" for f in data["findings"]), data["findings"]
    assert [s["index"] for s in data["steps"]] == [0, 1, 2]
