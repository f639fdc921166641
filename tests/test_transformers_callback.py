"""The Hugging Face callback with the real transformers Trainer, on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the HF callback needs transformers")
pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from vramscope.integrations.metrics import unwrap_optimizer  # noqa: E402
from vramscope.integrations.transformers import VramscopeCallback  # noqa: E402
from vramscope.report.model import Report  # noqa: E402

KEY = "vramscope/host_rss_mib"


def _tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    config.bos_token_id = config.eos_token_id = 0
    return GPT2LMHeadModel(config)


def _samples(n: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(n):
        ids = torch.randint(0, 64, (8,), generator=generator)
        samples.append({"input_ids": ids, "labels": ids})
    return samples


def _args(tmp_path, **options) -> TrainingArguments:
    settings = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "report_to": [],
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 4,
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
    }
    settings.update(options)
    return TrainingArguments(**settings)


def _bytes(tensors) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def test_training_with_accumulation_has_one_step_per_optimizer_step(tmp_path):
    model = _tiny_gpt2()
    callback = VramscopeCallback()
    args = _args(tmp_path, gradient_accumulation_steps=2, num_train_epochs=2, eval_strategy="epoch")
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_samples(8),
        eval_dataset=_samples(4),
        callbacks=[callback],
    )
    trainer.train()

    report = Report.load(tmp_path / "vramscope.json")
    assert (tmp_path / "vramscope.html").is_file()
    train_steps = [s for s in report.steps if s.mode == "train"]
    assert trainer.state.global_step == 4  # 8 samples, 2 a micro-batch, 2 micro-batches a step
    assert len(train_steps) == 4
    assert all(s.micro_batches == 2 for s in train_steps)
    # one evaluation batch at the end of each epoch, kept in its epoch
    assert [(s.epoch, s.mode) for s in report.steps] == [
        (0, "train"), (0, "train"), (0, "eval"), (1, "train"), (1, "train"), (1, "eval")
    ]  # fmt: skip
    assert report.workload["accumulate"] == 2

    weights = _bytes(model.parameters())  # the tied embedding counts once
    assert report.categories_at_peak.parameters == weights
    assert report.categories_at_peak.gradients == weights
    assert unwrap_optimizer(trainer.optimizer) is trainer.optimizer.optimizer  # accelerate's
    state = trainer.optimizer.optimizer.state
    tensors = [t for s in state.values() for t in s.values() if torch.is_tensor(t)]
    assert report.categories_at_peak.optimizer_state == _bytes(tensors)

    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 4 and all(entry[KEY] > 10 for entry in logged)
    assert all(KEY in entry for entry in trainer.state.log_history)
    lines = (tmp_path / "vramscope.epochs.jsonl").read_text().splitlines()
    assert [(e["epoch"], e["steps"]) for e in map(json.loads, lines)] == [(0, 2), (1, 2)]


class LogRecorder(TrainerCallback):
    """Stands where the reporting integrations (W&B, TensorBoard) stand: before us."""

    def __init__(self) -> None:
        self.keys: list[set[str]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.keys.append(set(logs))


def test_attach_puts_the_callback_ahead_of_the_reporting_integrations(tmp_path):
    recorder = LogRecorder()
    callback = VramscopeCallback(html=False)
    trainer = Trainer(
        model=_tiny_gpt2(),
        args=_args(tmp_path, max_steps=2),
        train_dataset=_samples(4),
        callbacks=[recorder, callback],
    )
    assert callback.attach(trainer) is callback
    assert trainer.callback_handler.callbacks[0] is callback
    assert trainer.callback_handler.callbacks.count(callback) == 1
    trainer.train()
    assert len(recorder.keys) == 3  # two steps and the training summary
    assert all(KEY in keys for keys in recorder.keys)


class BreaksAtCall(torch.nn.Module):
    def __init__(self, calls: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.calls_left = calls

    def forward(self, input_ids, labels):
        self.calls_left -= 1
        if self.calls_left < 0:
            raise RuntimeError("the loss went bad")
        loss = torch.nn.functional.mse_loss(self.linear(input_ids.float()), labels.float())
        return {"loss": loss}


def test_finish_writes_the_partial_report_of_a_training_that_raised(tmp_path):
    callback = VramscopeCallback(html=False)
    trainer = Trainer(
        model=BreaksAtCall(calls=2),
        args=_args(tmp_path, max_steps=5),
        train_dataset=_samples(10),
        callbacks=[callback],
    )
    with pytest.raises(RuntimeError, match="the loss went bad") as raised:
        trainer.train()
    assert not (tmp_path / "vramscope.json").exists()  # the Trainer has no event for this
    callback.finish(raised.value)

    report = Report.load(tmp_path / "vramscope.json")
    assert report.exit.status == "error" and "the loss went bad" in report.exit.error
    # two whole steps; the third ended in its forward (the Session calls it eval: no backward)
    assert [s.mode for s in report.steps][:2] == ["train", "train"]
    assert sum(s.mode == "train" for s in report.steps) == 2


class JournalSeen(TrainerCallback):
    """After each step: whether the vramscope callback's journal is on disk."""

    def __init__(self, callback: VramscopeCallback) -> None:
        self.callback, self.seen = callback, []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(self.callback.journal_path.is_file())


def test_training_journals_beside_its_report_until_the_report_is_written(tmp_path):
    callback = VramscopeCallback(html=False)
    looks = JournalSeen(callback)
    trainer = Trainer(
        model=_tiny_gpt2(),
        args=_args(tmp_path, max_steps=3),
        train_dataset=_samples(6),
        callbacks=[callback, looks],
    )
    trainer.train()

    journal = tmp_path / "vramscope.journal"
    assert callback.journal_path == journal
    assert looks.seen == [True] * 3  # written as the training went
    assert not journal.exists() and (tmp_path / "vramscope.json").is_file()


def test_journal_none_writes_no_journal(tmp_path):
    callback = VramscopeCallback(html=False, journal=None)
    trainer = Trainer(
        model=_tiny_gpt2(),
        args=_args(tmp_path, max_steps=2),
        train_dataset=_samples(4),
        callbacks=[callback],
    )
    trainer.train()
    assert callback.journal_path is None and callback.report.steps
    assert list(tmp_path.glob("*.journal")) == []
