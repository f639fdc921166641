"""The integrations on a real GPU: the pytest markers measure, trainers log CUDA peaks."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

# pytester drops the modules imported during a test when it ends; see test_pytest_plugin.py
import torch._dynamo

from vramscope.report.model import Report

pytestmark = pytest.mark.gpu
pytest_plugins = ["pytester"]
PLUGIN = "vramscope.integrations.pytest_plugin"
MIB = 2**20


def _cuda_bytes(tensors) -> int:
    """What the tensors' storages take from the CUDA caching allocator (512 B blocks)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(-(-n // 512) * 512 for n in storages.values())


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run_file(source: str) -> pytest.RunResult:
        pytester.makepyfile(source)
        return pytester.runpytest_inprocess("-p", PLUGIN, "--strict-markers", "-p", "no:randomly")

    return run_file


def test_limit_gpu_memory_measures_the_peak_of_tensor_operations(run):
    torch.cuda.empty_cache()
    result = run(
        """
import pytest, torch

def make_and_free():
    x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    y = x + 1  # 128 MiB alive at once, no module anywhere
    del x, y

@pytest.mark.limit_gpu_memory("32 MiB")
def test_over():
    make_and_free()

@pytest.mark.limit_gpu_memory("64 GiB")
def test_under():
    make_and_free()
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert "exceeds the limit of 32.00 MiB" in output
    line = next(x for x in output.splitlines() if "limit_gpu_memory: peak allocated" in x)
    peak_mib = float(line.split("memory ")[1].split(" ")[0])
    unit = line.split("memory ")[1].split(" ")[1]
    assert unit == "MiB" and peak_mib >= 128  # both tensors, whatever else was alive
    assert "Captured vramscope call" in output


def test_check_gpu_leaks_fails_a_test_that_keeps_tensors_and_passes_a_cache(run):
    result = run(
        """
import pytest, torch

kept = []
cache = {}

@pytest.mark.check_gpu_leaks(repeat=3)
def test_keeps_a_tensor_each_run():
    kept.append(torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda"))

@pytest.mark.check_gpu_leaks(repeat=3)
def test_fills_a_cache_once():
    cache.setdefault("table", torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda"))

@pytest.mark.check_gpu_leaks(repeat=4, tolerance="16 MiB")
def test_within_tolerance():
    kept.append(torch.empty(2**20, dtype=torch.uint8, device="cuda"))

def test_runs_counted():
    assert len(kept) == 3 + 4
""",
    )
    result.assert_outcomes(passed=3, failed=1)
    output = result.stdout.str()
    assert (
        "check_gpu_leaks: CUDA memory allocated grew by 8.00 MiB from the first run to run 3 "
        "(more than the tolerance of 0 B)"
    ) in output


def test_the_fixture_reports_the_cuda_peak_and_exact_categories(run):
    result = run(
        """
import torch

def test_training(vramscope):
    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    report = vramscope.report()
    weights = (1024 * 1024 + 1024) * 4
    assert report.peak.allocated_bytes >= 3 * weights
    assert report.categories_at_peak.parameters == weights
    assert [s.mode for s in report.steps] == ["train", "train"]
""",
    )
    result.assert_outcomes(passed=1)


def test_lightning_logs_cuda_window_peaks_that_match_the_report(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from vramscope.integrations.lightning import VramscopeCallback

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = TensorDataset(torch.randn(64, 512), torch.randint(0, 10, (64,)))
    model = Net()
    callback = VramscopeCallback()
    trainer = L.Trainer(
        accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=2,
        accumulate_grad_batches=2, log_every_n_steps=1, logger=CSVLogger(tmp_path),
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )  # fmt: skip
    trainer.fit(model, DataLoader(data, batch_size=16))

    report = Report.load(Path(trainer.log_dir) / "vramscope.json")
    assert sum(s.mode == "train" for s in report.steps) == trainer.global_step == 4
    assert report.categories_at_peak.parameters == _cuda_bytes(model.parameters())
    assert report.categories_at_peak.gradients == _cuda_bytes(model.parameters())
    rows = list(csv.DictReader((Path(trainer.log_dir) / "metrics.csv").read_text().splitlines()))
    windows = [
        float(r["vramscope/peak_allocated_mib"])
        for r in rows
        if r.get("vramscope/peak_allocated_mib")
    ]
    assert len(windows) == 4
    assert abs(max(windows) * MIB - report.peak.allocated_bytes) <= 0.01 * MIB
    reserved = [
        float(r["vramscope/peak_reserved_mib"])
        for r in rows
        if r.get("vramscope/peak_reserved_mib")
    ]
    assert all(r >= a for r, a in zip(reserved, windows, strict=True))


def test_transformers_logs_cuda_peaks_with_accumulation(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from vramscope.integrations.transformers import VramscopeCallback

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=64)
    config.bos_token_id = config.eos_token_id = 0
    model = GPT2LMHeadModel(config)
    samples = [
        {"input_ids": (ids := torch.randint(0, 512, (64,))), "labels": ids} for _ in range(16)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1, bf16=True,
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callback = VramscopeCallback()
    trainer = Trainer(model=model, args=args, train_dataset=samples, callbacks=[callback])
    trainer.train()

    report = Report.load(tmp_path / "vramscope.json")
    train_steps = [s for s in report.steps if s.mode == "train"]
    assert len(train_steps) == trainer.state.global_step == 2
    assert all(s.micro_batches == 2 for s in train_steps)
    assert report.categories_at_peak.parameters == _cuda_bytes(model.parameters())
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert all(e["vramscope/peak_allocated_mib"] > 1 for e in logged)
    assert all(
        e["vramscope/peak_reserved_mib"] >= e["vramscope/peak_allocated_mib"] for e in logged
    )
    assert max(e["vramscope/peak_allocated_mib"] for e in logged) * MIB <= (
        report.peak.allocated_bytes + 0.01 * MIB
    )
