"""A tiny training run tracked by one of vramscope's entry points (the Lightning callback, the
Hugging Face Trainer callback, ``vramscope.measure``, ``@vramscope.profile``, the pytest
plugin's fixture, the ``%%vramscope`` cell magic) that SIGKILLs itself after a given step
(or ends with ``os._exit(3)``: ``--die exit``), printing (flushed) what it did: its pid and
parameter bytes first, then after each step has ended (for vramscope too) the step, the
time and the process's RSS; "dying TIME" just before it dies. Each step keeps 1 MiB, so
the RSS only grows.

    python killed_with_integration.py {lightning,hf,measure,profile,pytest,ipython} FOLDER
        [--at N] [--die {kill,exit}]

Each entry point journals where it does by default: the callbacks beside their report in
FOLDER (the trainer's log or output directory), the others in the private directory.
"""

import argparse
import os
import signal
import sys
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("entry", choices=["lightning", "hf", "measure", "profile", "pytest", "ipython"])
parser.add_argument("folder", help="the trainer's log or output directory")
parser.add_argument("--at", type=int, default=24, help="the step after which it dies")
parser.add_argument("--pause-s", type=float, default=0.08, help="sleep at each step")
parser.add_argument("--die", choices=["kill", "exit"], default="kill", help="SIGKILL or os._exit")
args = parser.parse_args()

PAGE = os.sysconf("SC_PAGE_SIZE")
kept: list[torch.Tensor] = []


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def started(model: nn.Module) -> None:
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    print(f"pid {os.getpid()} parameters {sum(storages.values())}", flush=True)


def step_ended(step: int) -> None:
    """Step ``step`` ended (vramscope marked it): say so, and die after step ``--at``."""
    print(f"done {step} {time.time():.6f} {rss()} 0", flush=True)
    if step == args.at:
        print(f"dying {time.time():.6f}", flush=True)
        if args.die == "exit":
            os._exit(3)  # what a launcher or native code does: no clean-up, no report
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer sends
    kept.append(torch.ones(2**20, dtype=torch.uint8))
    time.sleep(args.pause_s)


def samples(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 32, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def with_lightning() -> None:
    import lightning.pytorch as L
    from torch.utils.data import DataLoader, TensorDataset

    from vramscope.integrations.lightning import VramscopeCallback

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx):  # after the callbacks'
            step_ended(self.trainer.global_step - 1)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    model = Classifier()
    started(model)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=10 * args.at,
        default_root_dir=args.folder,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[VramscopeCallback(html=False)],
    )
    trainer.fit(model, DataLoader(TensorDataset(*samples(8 * args.at)), batch_size=4))


def with_transformers() -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from vramscope.integrations.transformers import VramscopeCallback

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def forward(self, x, labels):
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    class Steps(TrainerCallback):  # after vramscope's: the step has ended for it too
        def on_step_end(self, args, state, control, **kwargs):
            step_ended(state.global_step - 1)

    model = Classifier()
    started(model)
    x, y = samples(8 * args.at)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=args.folder,
            use_cpu=True,
            report_to=[],
            per_device_train_batch_size=4,
            max_steps=10 * args.at,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        ),
        train_dataset=[{"x": x[i], "labels": y[i]} for i in range(len(x))],
        callbacks=[VramscopeCallback(html=False), Steps()],
    )
    trainer.train()


def with_measure() -> None:
    import vramscope

    def build(batch_size: int, device: torch.device) -> vramscope.Workload:
        model = net().to(device)
        started(model)
        x, y = samples(batch_size)
        calls = []

        def batch():  # a step begins: the one before it has ended, for vramscope too
            if calls:
                step_ended(len(calls) - 1)
            calls.append(None)
            return x, y

        def loss(model, x, y):
            return nn.functional.cross_entropy(model(x), y)

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)

    vramscope.measure(build, batch_size=4, steps=10 * args.at, device="cpu")


def by_hand() -> None:
    """A training loop of one's own, its steps found by vramscope's hooks: step N ends (and
    is in the journal) once step N + 1's forward has run."""
    model = net()
    started(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = samples(4)
    for step in range(10 * args.at):
        loss = nn.functional.cross_entropy(model(x), y)
        if step:
            step_ended(step - 1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def with_profile() -> None:
    import vramscope

    vramscope.profile(by_hand)()


def with_pytest() -> None:
    import pytest

    test = os.path.join(args.folder, "test_by_hand.py")
    with open(test, "w") as f:
        f.write("import __main__\n\ndef test_training(vramscope):\n    __main__.by_hand()\n")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the plugin once, by -p
    plugin = "vramscope.integrations.pytest_plugin"
    pytest.main([test, "-p", plugin, "-qq", "-s", "-p", "no:cacheprovider", "-p", "no:randomly"])


def with_ipython() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "vramscope")
    shell.user_ns["by_hand"] = by_hand  # (the shell's __main__ is its own)
    shell.run_cell("%%vramscope\nby_hand()\n")


{
    "lightning": with_lightning,
    "hf": with_transformers,
    "measure": with_measure,
    "profile": with_profile,
    "pytest": with_pytest,
    "ipython": with_ipython,
}[args.entry]()
sys.exit(0)  # (it should have died)
