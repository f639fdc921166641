"""The estimator's classes of code (``tests/test_estimate_classes.py``: deep-copied layers, a
model compiled in build, CTC, sparse gradients, grouped GEMM, weight_norm, TorchScript, pinned
batches, LBFGS, several optimizers, a step of the workload's own, CUDA calls in the step...)
estimated and measured on this GPU, each measured in a fresh process: allocated never under
by more than 3 %, nor over by more than 3 % or 4 MiB (a tiny model's whole step is smaller
than a cuDNN workspace the rules take for a shape no recording has)."""

from __future__ import annotations

import re
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
SOURCE = (TESTS / "test_estimate_classes.py").read_text()
WORKLOADS = SOURCE.split('WORKLOADS = """', 1)[1].split('"""', 1)[0]
REFUSED = {"exits", "not_a_module", "positions_too_few", "ids_past_the_vocabulary",
           "index_add_of_another_dtype", "grouped_experts_misaligned"}  # fmt: skip
NAMES = [
    n
    for n in re.findall(r"^def ([a-z]\w*)\(batch_size, device", WORKLOADS, re.M)
    if n not in REFUSED
]
BATCH = 8


def _profile() -> str:
    name = torch.cuda.get_device_name(0)
    return next((p.name for p in PROFILES if p.display_name == name), "h200")


@pytest.fixture(scope="module")
def workloads(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("classes") / "class_workloads.py"
    path.write_text(WORKLOADS)
    return path


@pytest.mark.parametrize("name", NAMES)
def test_class_estimate_matches_the_gpu(name: str, workloads: Path, tmp_path: Path) -> None:
    spec = f"{workloads}:{name}"
    out = tmp_path / "measured.json"
    command = [sys.executable, "-m", "vramscope", "measure", spec, "-b", str(BATCH)]
    command += ["--steps", "3", "--json", str(out), "--quiet"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = Report.load(out).peak.allocated_bytes
    estimated = estimate(spec, BATCH, gpu=_profile()).peak.allocated_bytes
    error = estimated / measured - 1
    print(f"CLASS {name} estimated {estimated} measured {measured} error {error:+.4f}")
    within = -0.03 <= error <= 0.03 or 0 <= estimated - measured <= 4 * 2**20
    assert within, f"{name}: estimated {estimated:,} B, measured {measured:,} B"
