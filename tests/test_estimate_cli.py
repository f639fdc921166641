"""`vramscope estimate` on the command line: a report, a verdict, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import vramscope_here


def vramscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vramscope", *args], capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("vramscope: error:") and needle in lines[0]


def test_estimate_writes_the_report_and_prints_the_verdict(tmp_path: Path):
    out = tmp_path / "estimate.json"
    proc = vramscope(
        "estimate",
        "example:gpt",
        "--gpu",
        "h100-sxm",
        "-b",
        "4",
        "--precision",
        "bf16-mixed",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    verdict = proc.stdout.splitlines()[-1]  # after the report
    assert verdict.startswith("vramscope: fits on NVIDIA H100 80GB HBM3: device used ")
    assert verdict.endswith("; the peak is in the backward phase of step 1")
    data = json.loads(out.read_text())
    assert data["kind"] == "estimated"
    assert data["workload"]["precision"] == "bf16-mixed"
    assert data["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert data["verdict"]["fits"] is True
    assert data["estimate"]["sdpa_kernels"] == {"cudnn": 8}


def test_a_workload_that_does_not_fit_says_by_how_much():
    proc = vramscope("estimate", "example:gpt", "-b", "64", "--memory", "1GiB", "--json", "-")
    assert proc.returncode == 1, proc.stderr  # answered: it does not fit
    assert "does not fit on NVIDIA H200: it needs " in proc.stderr
    assert " more than its 1.00 GiB; it runs out in the " in proc.stderr
    assert json.loads(proc.stdout)["verdict"]["fits"] is False


def test_list_gpus_names_every_profile():
    proc = vramscope_here("estimate", "--list-gpus")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    names = [line.split()[0] for line in lines[1:]]
    assert names[:6] == ["h200", "h100-80gb", "a100-80gb", "a100-40gb", "l40s", "a10g"]
    assert lines[1].endswith(" calibrated") and lines[2].endswith(" uncalibrated")
    assert "742.00 MiB" in lines[1]  # the context, as an estimate's report shows it


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu", "h900"], "unknown GPU 'h900'; known: h200, h100-80gb"),
        (["--memory", "garbage"], "cannot read 'garbage' as a size"),
        (["--batch-size", "0"], "0 is not in the range"),
        (["--validate"], "--validate measures for real and needs a CUDA GPU"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str):
    if "--validate" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: --validate would measure")
    assert_one_line_error(vramscope_here("estimate", "example:gpt", *args), needle)


def test_bad_input_in_a_fresh_process_is_one_line_and_exit_2():
    """As above, from ``python -m vramscope``: nothing the estimator's imports print gets in."""
    assert_one_line_error(vramscope("estimate", "example:gpt", "--gpu", "h900"), "unknown GPU")


def test_missing_workload_is_a_usage_error():
    proc = vramscope_here("estimate")
    assert proc.returncode == 2 and "missing WORKLOAD" in proc.stderr


def test_a_lazy_module_in_build_is_one_line_saying_what_to_do(tmp_path: Path):
    path = tmp_path / "lazy_net.py"
    path.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(10)).to(device)\n"
        "    return vramscope.Workload(model=model,\n"
        "        batch=torch.randn(batch_size, 3, 8, 8, device=device),\n"
        "        loss=lambda m, x: m(x).sum(), optimizer=None)\n"
    )
    proc = vramscope("estimate", f"{path}:build", "-b", "2", "--gpu", "h200")
    assert_one_line_error(proc, "lazy module (nn.LazyLinear")
    assert "nn.Linear(in_features, out_features)" in proc.stderr
