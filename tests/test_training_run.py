"""The framework-neutral part of the trainer callbacks: a run that raised, wrapped optimizers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from vramscope.integrations.metrics import as_metrics, unwrap_optimizer
from vramscope.report.model import Report

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from vramscope.integrations.training import TrainingRun

    run = TrainingRun(html=False)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.start({"spec": "loop"}, sys.argv[1])
    run.watch(model, [optimizer])
    run.built()
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        run.train_step()
    raise RuntimeError("stopped after 3 steps")
    """
)


def test_a_script_whose_training_raised_leaves_the_report_when_it_exits(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "stopped after 3 steps" in done.stderr
    report = Report.load(tmp_path / "out" / "vramscope.json")
    assert report.exit.status == "error"
    assert report.exit.error == "RuntimeError: stopped after 3 steps"
    assert [s.mode for s in report.steps] == ["train"] * 3
    assert report.categories_at_peak.parameters == (16 + 4) * 4


def test_framework_wrappers_give_back_the_torch_optimizer():
    lightning = pytest.importorskip("lightning.pytorch.core.optimizer")
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert unwrap_optimizer(lightning.LightningOptimizer(sgd)) is sgd
    assert unwrap_optimizer(sgd) is sgd
    assert unwrap_optimizer(object()) is None


def test_metrics_are_named_for_what_they_are_in_mib():
    assert as_metrics({"peak_allocated": 3 * 2**20 + 2**19, "host_rss": 2**30}, "epoch_") == {
        "vramscope/epoch_peak_allocated_mib": 3.5,
        "vramscope/epoch_host_rss_mib": 1024.0,
    }


def test_a_second_run_in_the_same_directory_starts_its_files_afresh(tmp_path):
    from vramscope.integrations.training import TrainingRun

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = TrainingRun(html=False)
    for epochs in (3, 1):
        run.start({"spec": f"{epochs} epochs"}, tmp_path)
        run.watch(model, [optimizer])
        run.built()
        for _ in range(epochs):
            for _ in range(2):
                model(torch.randn(2, 4)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                run.train_step()
            run.end_epoch()
        run.finish()
    lines = (tmp_path / "vramscope.epochs.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0]
    report = Report.load(tmp_path / "vramscope.json")
    assert report.workload["spec"] == "1 epochs"
    assert [(s.epoch, s.mode) for s in report.steps] == [(0, "train"), (0, "train")]
