"""Parameters, gradients and optimizer state behind the wrappers, on a CUDA device.

The CPU cases of ``tests/test_categories.py`` again with the model, the batches and the
optimizer state on ``cuda:0``: DataParallel, DistributedDataParallel, FSDP1 (flat and
original parameters), FSDP2, a compiled model, accelerate's ``prepare`` in bf16 and a
LightningModule trained in ``bf16-mixed``. Each must give the objects' own bytes within 0.1 %.

Run with: python -m pytest -q -m gpu tests/gpu/test_categories_gpu.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import vramscope

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_categories import expected, measured, within  # noqa: E402

CUDA = torch.device("cuda", 0)
WIDTH = 1024


def mlp() -> nn.Module:
    """Every tensor a multiple of 512 bytes: the allocator's blocks are the objects' bytes."""
    return nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.ReLU(), nn.Linear(2 * WIDTH, WIDTH))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    for _ in range(steps):
        model(torch.randn(8, WIDTH, device=CUDA)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.fixture
def process_group(tmp_path):
    import torch.distributed as dist

    store = tmp_path / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    torch.cuda.set_device(CUDA)
    yield
    dist.destroy_process_group()


def _data_parallel() -> nn.Module:
    return nn.DataParallel(mlp().to(CUDA))


def _ddp() -> nn.Module:
    return nn.parallel.DistributedDataParallel(mlp().to(CUDA), device_ids=[0])


def _fsdp1(use_orig_params: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(mlp(), device_id=CUDA, use_orig_params=use_orig_params)

    return build


def _fsdp2() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = mlp().to(CUDA)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _compiled() -> nn.Module:
    model = torch.compile(mlp().to(CUDA))
    model(torch.randn(8, WIDTH, device=CUDA)).sum().backward()  # compiled before tracking
    model.zero_grad(set_to_none=True)
    return model


WRAPPERS = {
    "data-parallel": (_data_parallel, False),
    "ddp": (_ddp, True),
    "fsdp1-flat": (_fsdp1(False), True),
    "fsdp1-orig-params": (_fsdp1(True), True),
    "fsdp2": (_fsdp2, True),
    "compiled": (_compiled, False),
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrapped_model_categories_are_the_objects_bytes(name, request):
    build, needs_group = WRAPPERS[name]
    if needs_group:
        request.getfixturevalue("process_group")
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with vramscope.track() as session:
        train(model, opt)
    report = session.report()
    assert report.device["type"] == "cuda"
    assert report.peak.allocated_bytes > 0
    want = expected([model], [opt])
    assert want["parameters"] == sum(p.numel() for p in mlp().parameters()) * 4
    if report.peak.phase == "backward":
        # inside a backward a layer's gradients exist once its backward ran (FSDP2's once
        # its reduce-scatter returned): the last layers' at the peak, exactly
        done = [*gradients_of_the_last_layers(model), want["gradients"]]
        assert report.categories_at_peak.gradients in done, (report.peak, done)
        want["gradients"] = report.categories_at_peak.gradients
    within_at_peak(report, want)


def gradients_of_the_last_layers(model: nn.Module) -> list[int]:
    """The gradients' bytes once the backward has run through the last 0, 1, 2, ... of the
    model's Linear layers (each storage one allocator block)."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    sizes = [
        sum(-(-_local(p).untyped_storage().nbytes() // 512) * 512 for p in layer.parameters())
        for layer in reversed(layers)
    ]
    return [sum(sizes[:n]) for n in range(len(sizes) + 1)]


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def within_at_peak(report, want: dict[str, int]) -> None:
    """The categories against the objects' bytes, saying where the peak was if they differ."""
    try:
        within(measured(report), want)
    except AssertionError as error:
        steps = [
            (s.index, [(p.name, p.peak_allocated_bytes) for p in s.phases]) for s in report.steps
        ]
        raise AssertionError(
            f"{error}; {report.categories_note}; peak {report.peak.allocated_bytes}; "
            f"categories {report.categories_at_peak}; steps {steps[:4]}"
        ) from None


def test_accelerate_bf16_prepared_model_and_optimizer():
    accelerate = pytest.importorskip("accelerate")
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accelerator = accelerate.Accelerator(mixed_precision="bf16")
    model, opt = accelerator.prepare(model, opt)
    with vramscope.track() as session:
        for _ in range(3):
            accelerator.backward(model(torch.randn(8, WIDTH, device=CUDA)).square().mean())
            opt.step()
            opt.zero_grad(set_to_none=True)
    within_at_peak(session.report(), expected([model], [opt.optimizer]))


def test_lightning_bf16_mixed_categories(tmp_path):
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(64, WIDTH))
    module = Module()
    trainer = lightning.Trainer(
        accelerator="gpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with vramscope.track() as session:
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    opt = trainer.optimizers[0]
    within_at_peak(session.report(), expected([module], [opt]))
