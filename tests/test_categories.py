"""Parameters, gradients and optimizer state behind the wrappers people use, from real runs.

Each case trains a few steps on the CPU under tracking and compares the report's categories
with the bytes of the objects themselves (each storage once): a model wrapped in
DataParallel, DDP, FSDP1 or FSDP2, Lightning Fabric, two models and two optimizers, a shared and a frozen parameter,
an optimizer made after the first forward, and objects gone before tracking stops.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator

import pytest
import torch
from torch import nn

import vramscope
from vramscope.report.model import Report


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _unique_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = _local(t).untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
    return sum(seen.values())


def _state_tensors(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[torch.Tensor]:
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value


def expected(models: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, int]:
    params = [p for m in models for p in m.parameters()]
    return {
        "parameters": _unique_bytes(params),
        "gradients": _unique_bytes(p for p in params if p.requires_grad),
        "optimizer_state": _unique_bytes(_state_tensors(optimizers)),
    }


def measured(report: Report) -> dict[str, int]:
    c = report.categories_at_peak
    return {
        "parameters": c.parameters,
        "gradients": c.gradients,
        "optimizer_state": c.optimizer_state,
    }


def within(got: dict[str, int], want: dict[str, int], share: float = 0.001) -> None:
    for key, value in want.items():
        assert abs(got[key] - value) <= share * value, (key, got, want)


def train(model: nn.Module, optimizers: list[torch.optim.Optimizer], steps: int = 3) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 32)).square().mean()
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))


def test_data_parallel_counts_the_wrapped_model():
    model = nn.DataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with vramscope.track() as session:
        train(model, [opt])
    within(measured(session.report()), expected([model], [opt]))


def test_two_models_and_two_optimizers():
    generator, critic = mlp(), nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with vramscope.track() as session:
        for _ in range(3):
            fake = generator(torch.randn(8, 32))
            critic(fake.detach()).mean().backward()
            opt_c.step()
            opt_c.zero_grad(set_to_none=True)
            (-critic(fake).mean()).backward()
            opt_g.step()
            opt_g.zero_grad(set_to_none=True)
            opt_c.zero_grad(set_to_none=True)
    within(measured(session.report()), expected([generator, critic], [opt_g, opt_c]))


class SharedAndFrozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.embed.weight.requires_grad_(False)  # frozen: a parameter, with no gradient
        shared = nn.Linear(32, 32)
        self.a = nn.Sequential(shared, nn.ReLU())
        self.b = nn.Sequential(shared, nn.Tanh())  # the same Linear under two names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.embed(x)))


def test_shared_parameter_counted_once_and_frozen_one_counted_as_a_parameter():
    model = SharedAndFrozen()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with vramscope.track() as session:
        for _ in range(3):
            model(torch.randint(0, 100, (8, 4))).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    want = expected([model], [opt])
    assert want["parameters"] == (100 * 32 + 32 * 32 + 32) * 4
    assert want["gradients"] == (32 * 32 + 32) * 4
    within(measured(session.report()), want)


def test_optimizer_created_after_the_first_forward():
    model = mlp()
    with vramscope.track() as session:
        model(torch.randn(8, 32)).square().mean().backward()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        opt.step()
        opt.zero_grad(set_to_none=True)
        train(model, [opt], steps=2)
    within(measured(session.report()), expected([model], [opt]))


def test_closure_step_whose_state_moves_away_before_tracking_stops():
    """Lightning's way: forward and backward run in a closure inside ``optimizer.step``, and
    its teardown moves the optimizer state off the device before tracking ends."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def closure() -> torch.Tensor:
        loss = model(torch.randn(8, 32)).square().mean()
        loss.backward()
        return loss

    with vramscope.track() as session:
        for _ in range(3):
            opt.step(closure)
            opt.zero_grad(set_to_none=True)
        want = expected([model], [opt])
        opt.state.clear()
    assert want["optimizer_state"] > 0
    within(measured(session.report()), want)


class CountingCensus:
    """Counts the session's counts of the objects' bytes (the real function, called through)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from vramscope.tracking import categories

        self.calls = 0
        real = categories.full_gradient_bytes

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(categories, "full_gradient_bytes", counted)


def test_an_optimizer_without_state_is_not_counted_every_step(monkeypatch):
    """Plain SGD never has state: counting every parameter after each of its steps cost a
    tiny CPU model 40% of its step. The first 8 steps are counted, then the 16th, 32nd, ..."""
    census = CountingCensus(monkeypatch)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with vramscope.track() as session:
        train(model, [opt], steps=100)
        during = census.calls
    assert during <= 1 + 8 + 3  # the model found, 8 steps, then steps 16, 32 and 64
    within(measured(session.report()), expected([model], [opt]))


class SkipsFirstSteps(torch.optim.SGD):
    """An optimizer whose first steps are skipped (as GradScaler skips a step on inf)."""

    def __init__(self, params, skip: int) -> None:
        super().__init__(params, lr=0.1, momentum=0.9)
        self.skip = skip

    def step(self, closure=None):  # type: ignore[override]
        if self.skip:
            self.skip -= 1
            return None
        return super().step(closure)


def test_state_made_after_skipped_steps_is_counted_while_it_lives():
    model = mlp()
    opt = SkipsFirstSteps(model.parameters(), skip=11)
    with vramscope.track() as session:
        train(model, [opt], steps=20)  # state from step 12; counted at the 16th
        want = expected([model], [opt])
        opt.state.clear()  # gone before tracking ends: the count at step 16 keeps it
    assert want["optimizer_state"] > 0
    within(measured(session.report()), want)


def test_objects_gone_before_tracking_stops_keep_their_bytes():
    model = nn.DataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with vramscope.track() as session:
        train(model, [opt])
        want = expected([model], [opt])
        del model, opt
        gc.collect()
    within(measured(session.report()), want)


@pytest.fixture
def process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def train_tracked(model: nn.Module) -> tuple[Report, dict[str, int]]:
    """Three AdamW steps of a wrapped ``mlp()`` under tracking: the report, and the bytes
    its objects hold by the end."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with vramscope.track() as session:
        train(model, [opt])
    return session.report(), expected([model], [opt])


MLP_BYTES = sum(p.numel() for p in mlp().parameters()) * 4


def test_distributed_data_parallel(process_group):
    report, want = train_tracked(nn.parallel.DistributedDataParallel(mlp()))
    within(measured(report), want)


def test_fsdp2_fully_shard_counts_the_local_shards(process_group):
    fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    report, want = train_tracked(model)
    assert want["parameters"] == MLP_BYTES
    within(measured(report), want)


@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig-params"])
def test_fsdp1_counts_the_flat_parameter_once(process_group, use_orig_params):
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = FullyShardedDataParallel(
        mlp(), device_id=torch.device("cpu"), use_orig_params=use_orig_params
    )
    report, want = train_tracked(model)
    assert want["parameters"] == MLP_BYTES
    within(measured(report), want)


def test_accelerate_prepared_model_and_optimizer():
    accelerate = pytest.importorskip("accelerate")
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accelerator = accelerate.Accelerator(cpu=True)
    model, opt = accelerator.prepare(model, opt)
    with vramscope.track() as session:
        for _ in range(3):
            accelerator.backward(model(torch.randn(8, 32)).square().mean())
            opt.step()
            opt.zero_grad(set_to_none=True)
    within(measured(session.report()), expected([model], [opt.optimizer]))


SCRIPT = """
import json
import torch
from torch import nn


def main():
    model = nn.DataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        model(torch.randn(8, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print("EXPECTED " + json.dumps({"parameters": params, "gradients": params,
                                     "optimizer_state": params}))


if __name__ == "__main__":
    main()  # the model and optimizer are gone when the script ends
"""


def test_run_script_whose_model_dies_with_main_keeps_categories(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "--json", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("EXPECTED "))
    within(measured(Report.load(out)), json.loads(line[len("EXPECTED ") :]))


def test_views_of_one_storage_count_each_view_for_the_full_gradients():
    from vramscope.tracking.categories import full_gradient_bytes

    flat = torch.zeros(64 * 32 + 64)
    model = nn.Linear(32, 64)
    model.weight = nn.Parameter(flat[: 64 * 32].view(64, 32))  # FSDP1's original parameters
    model.bias = nn.Parameter(flat[64 * 32 :])
    assert full_gradient_bytes([model], "cpu") == (64 * 32 + 64) * 4
    assert full_gradient_bytes([mlp()], "cpu") == sum(p.numel() for p in mlp().parameters()) * 4


def test_lightning_fabric_wrapped_model_and_optimizer():
    lightning = pytest.importorskip("lightning")
    fabric = lightning.Fabric(accelerator="cpu", devices=1)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = fabric.setup(model, opt)  # _FabricModule and _FabricOptimizer
    with vramscope.track() as session:
        for _ in range(3):
            fabric.backward(model(torch.randn(8, 32)).square().mean())
            opt.step()
            opt.zero_grad(set_to_none=True)
    within(measured(session.report()), expected([model], [opt.optimizer]))
