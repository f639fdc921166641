"""fit --verify and measured compare on a real GPU, each trial in a fresh process."""

from __future__ import annotations

import pytest

from vramscope.fit.compare import compare
from vramscope.fit.search import fit
from vramscope.fit.trial import run_trial

pytestmark = pytest.mark.gpu


def test_trial_oom_is_caught_as_out_of_memory_error_in_a_fresh_process():
    result = run_trial("example:cnn", 4096, budget_bytes=512 * 2**20)
    assert result.status == "oom"
    ok = run_trial("example:cnn", 8, budget_bytes=512 * 2**20)
    assert ok.status == "fits" and ok.peak["reserved_bytes"] <= 512 * 2**20


def test_a_trial_that_crashes_is_not_an_oom(tmp_path):
    wl = tmp_path / "bad.py"
    wl.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    m = torch.nn.Linear(4, 4).to(device)\n"
        "    def loss(m, x):\n"
        "        raise ValueError('broken loss')\n"
        "    return vramscope.Workload(model=m, optimizer=torch.optim.SGD(m.parameters()),\n"
        "                              batch=lambda: torch.randn(batch_size, 4, device=device), loss=loss)\n"
    )
    result = run_trial(f"{wl}:build", 4)
    assert result.status == "crashed" and "broken loss" in (result.error or "")


def test_verify_is_exact_with_few_trials():
    report = fit("example:cnn", budget="1GiB", margin="0%", max_batch_size=1024, verify=True)
    section = report.extra["fit"]
    verify = section["verify"]
    assert verify["max_batch_size"] is not None
    statuses = {t["batch_size"]: t["status"] for t in verify["trials"]}
    best = verify["max_batch_size"]
    assert statuses[best] == "fits" and statuses.get(best + 1) == "oom"
    assert verify["real_trials"] <= 4


def test_measured_compare_reports_step_times():
    report = compare(["example:cnn"], batch_size=64, strategies=["bf16-mixed"], measured=True)
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    assert rows["baseline"]["step_time_s"] > 0
    assert (
        rows["bf16-mixed"]["peak"]["allocated_bytes"] < rows["baseline"]["peak"]["allocated_bytes"]
    )
