"""vramscope against the independent oracle (benchmarks/peak_oracle.py), on a GPU.

Each script of ``benchmarks/scripts/`` (the ways people write training: a model at the top
level, in a function, in a class; Lightning; HF Trainer; nanoGPT's loop; a GAN; accumulation;
gradients kept between steps; frozen weights; torch.compile; DataParallel; DDP; FSDP2; a leak
until the device runs out) runs under the oracle and under ``vramscope run`` in each detail:
parameters, buffers, gradients and optimizer state at the peak within 0.1 % of the oracle's
classification by tensor identity, activations plus temporaries within 2 % of the peak, the
same categories in every detail, and every step entry's peak equal to the highest of the
oracle's per-step peaks among the steps it stands for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peak_oracle  # noqa: E402

pytestmark = pytest.mark.gpu
DETAILS = ["default", "modules", "lines"]


@pytest.mark.parametrize("name", list(peak_oracle.SCRIPTS))
def test_every_detail_agrees_with_the_oracle(name: str, tmp_path: Path) -> None:
    row = peak_oracle.check_script(name, tmp_path, DETAILS, small=False, timeout=540)
    assert "error" not in row, row.get("error")
    problems = {d: run["problems"] for d, run in row["runs"].items() if not run.get("ok")}
    assert not problems, problems
    assert row.get("details_agree"), {d: run.get("categories") for d, run in row["runs"].items()}
