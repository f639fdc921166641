"""The Lightning callback with the real Lightning, on the CPU: steps, epochs, files, metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning.pytorch", reason="the Lightning callback needs lightning")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from vramscope.integrations.lightning import VramscopeCallback  # noqa: E402
from vramscope.report.model import Report  # noqa: E402


class TinyClassifier(L.LightningModule):
    def __init__(self, fail_at_batch: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
        )
        self.fail_at_batch = fail_at_batch

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at_batch:
            raise RuntimeError("the data went bad")
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(24, 16, generator=generator), torch.randint(0, 2, (24,)))
    val = TensorDataset(torch.randn(8, 16, generator=generator), torch.randint(0, 2, (8,)))
    return DataLoader(train, batch_size=4), DataLoader(val, batch_size=4)


def _trainer(tmp_path, callback, **options) -> L.Trainer:
    settings = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": [callback],
    }
    settings.update(options)
    return L.Trainer(**settings)


def _bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_a_fit_leaves_its_report_in_the_log_dir_with_one_step_per_optimizer_step(tmp_path):
    model = TinyClassifier()
    callback = VramscopeCallback()
    trainer = _trainer(
        tmp_path,
        callback,
        max_epochs=2,
        accumulate_grad_batches=2,
        log_every_n_steps=1,
        logger=CSVLogger(tmp_path),
    )
    trainer.fit(model, *_loaders())

    log_dir = trainer.log_dir
    report = Report.load(f"{log_dir}/vramscope.json")
    assert (tmp_path / "lightning_logs/version_0/vramscope.html").stat().st_size > 10_000
    train_steps = [s for s in report.steps if s.mode == "train"]
    assert trainer.global_step == 6  # 6 batches per epoch, 2 per optimizer step, 2 epochs
    assert len(train_steps) == 6
    assert all(s.micro_batches == 2 for s in train_steps)
    assert [e.index for e in report.epochs] == [0, 1]
    assert [sum(s.epoch == e for s in train_steps) for e in (0, 1)] == [3, 3]
    # the sanity check's 2 batches and 2 validation batches per epoch are eval steps
    assert sum(s.mode == "eval" for s in report.steps) == 2 + 2 * 2
    assert report.exit.status == "ok"

    optimizer = trainer.optimizers[0]
    assert report.categories_at_peak.parameters == _bytes(model.parameters())
    assert report.categories_at_peak.gradients == _bytes(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert report.categories_at_peak.optimizer_state == _bytes(state)

    lines = Path(log_dir, "vramscope.epochs.jsonl").read_text().splitlines()
    epochs = [json.loads(line) for line in lines]
    assert [(e["epoch"], e["steps"]) for e in epochs] == [(0, 3), (1, 3)]
    assert all(e["host_rss_bytes"] > 10 * 2**20 for e in epochs)

    rows = list(csv.DictReader(Path(log_dir, "metrics.csv").read_text().splitlines()))
    loss_steps = {r["step"] for r in rows if r["loss"]}
    memory_steps = {r["step"] for r in rows if r["vramscope/host_rss_mib"]}
    assert memory_steps == loss_steps == {str(i) for i in range(6)}
    assert all(float(r["vramscope/host_rss_mib"]) > 10 for r in rows if r["vramscope/host_rss_mib"])
    assert sum(bool(r["vramscope/epoch_host_rss_mib"]) for r in rows) == 2


def test_bf16_mixed_with_fast_dev_run_reports_the_model_bytes(tmp_path):
    model = TinyClassifier()
    callback = VramscopeCallback(html=False)
    trainer = _trainer(tmp_path, callback, precision="bf16-mixed", fast_dev_run=True)
    trainer.fit(model, *_loaders())

    report = Report.load(tmp_path / "vramscope.json")  # fast_dev_run logs nowhere
    assert report.workload["precision"] == "bf16-mixed"
    assert [s.mode for s in report.steps] == ["train", "eval"]
    assert report.categories_at_peak.parameters == _bytes(model.parameters())
    assert report.categories_at_peak.gradients == _bytes(model.parameters())
    assert not (tmp_path / "vramscope.html").exists()


def test_a_fit_that_raises_leaves_a_partial_report_and_removes_every_hook(tmp_path):
    originals = (torch.autograd.backward, torch.optim.Optimizer.zero_grad)
    callback = VramscopeCallback(dirpath=tmp_path / "memory", html=False)
    trainer = _trainer(tmp_path, callback, max_epochs=1, num_sanity_val_steps=0, logger=False)
    with pytest.raises(RuntimeError, match="the data went bad"):
        trainer.fit(TinyClassifier(fail_at_batch=3), *_loaders())

    report = Report.load(tmp_path / "memory" / "vramscope.json")
    assert report.exit.status == "error"
    assert "the data went bad" in report.exit.error
    assert [s.mode for s in report.steps] == ["train"] * 3
    assert (torch.autograd.backward, torch.optim.Optimizer.zero_grad) == originals


def test_the_callback_runs_under_the_pytorch_lightning_package(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")

    class Classic(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(16, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    callback = VramscopeCallback(html=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    model = Classic()
    trainer.fit(model, _loaders()[0])
    assert len(callback.report.steps) == trainer.global_step == 6
    assert callback.report.categories_at_peak.optimizer_state == _bytes(model.parameters())


class JournalSeen(L.Callback):
    """After each training batch: whether the callback's journal is on disk."""

    def __init__(self, callback: VramscopeCallback) -> None:
        self.callback, self.seen = callback, []

    def on_train_batch_end(self, *args) -> None:
        self.seen.append(self.callback.journal_path.is_file())


def test_the_fit_journals_beside_its_report_until_the_report_is_written(tmp_path, capsys):
    callback = VramscopeCallback(html=False, print_report=True)
    looks = JournalSeen(callback)
    trainer = _trainer(tmp_path, callback, max_epochs=1, num_sanity_val_steps=0, logger=False)
    trainer.callbacks.append(looks)
    trainer.fit(TinyClassifier(), *_loaders())

    journal = tmp_path / "vramscope.journal"
    assert callback.journal_path == journal
    assert looks.seen == [True] * 6  # written as the fit went
    assert not journal.exists() and (tmp_path / "vramscope.json").is_file()
    said = f"the run's journal is {journal}; if this process dies, `vramscope report {journal}`"
    assert capsys.readouterr().out.count(said) == 1


def test_a_journal_the_user_names_is_kept_and_journal_none_writes_none(tmp_path):
    from vramscope.journal.reader import read_journal
    from vramscope.journal.rebuild import report_from_journal

    named = VramscopeCallback(html=False, journal=tmp_path / "fit.journal")
    trainer = _trainer(tmp_path / "a", named, max_epochs=1, logger=False)
    trainer.fit(TinyClassifier(), *_loaders())
    journal = read_journal(tmp_path / "fit.journal")
    assert journal.stopped and journal.script_exit["status"] == "ok"
    assert report_from_journal(journal).steps == named.report.steps  # 2 sanity, 6, 2 eval

    none = VramscopeCallback(html=False, journal=None)
    trainer = _trainer(tmp_path / "b", none, max_epochs=1, logger=False)
    trainer.fit(TinyClassifier(), *_loaders())
    assert none.journal_path is None
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "vramscope.epochs.jsonl",
        "vramscope.json",
    ]


def test_a_bad_option_fails_when_the_callback_is_made():
    from vramscope.errors import VramscopeError

    with pytest.raises(VramscopeError, match="unknown detail"):
        VramscopeCallback(detail="everything")
