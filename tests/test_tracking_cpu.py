"""Tracking real CPU runs: phases, steps, epochs, markers, and leaving torch as it was."""

from __future__ import annotations

import threading

import torch
from rich.console import Console
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optimizer_mod
from torch.utils.data import DataLoader, TensorDataset

import vramscope
from vramscope.examples import build_gpt
from vramscope.report import html
from vramscope.report.terminal import render
from vramscope.workload import StepRunner

CPU = torch.device("cpu")


def small_loop(epochs: int = 2, batches: int = 3, accumulate: int = 1) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()  # a parameter-free module: not a step of its own
    data = TensorDataset(
        torch.randn(batches * 4 * accumulate, 8), torch.randint(0, 2, (batches * 4 * accumulate,))
    )
    losses = []
    for _ in range(epochs):
        for i, (x, y) in enumerate(DataLoader(data, batch_size=4)):
            loss = loss_fn(model(x), y) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
    return losses


def test_phases_steps_and_epochs_are_found_without_code_changes():
    with vramscope.track() as session:
        small_loop(epochs=2, batches=3)
    report = session.report()
    train = [s for s in report.steps if s.mode == "train"]
    assert len(train) == 6
    assert [e.steps for e in report.epochs] == [3, 3]
    names = [p.name for p in train[1].phases]
    assert names == ["data", "zero_grad", "forward", "backward", "optimizer"]


def test_accumulation_micro_batches_belong_to_one_step():
    with vramscope.track() as session:
        small_loop(epochs=1, batches=2, accumulate=3)
    steps = session.report().steps
    assert [s.micro_batches for s in steps] == [3, 3]


def test_inference_forward_calls_are_steps():
    model = torch.nn.Linear(4, 4)
    with vramscope.track() as session, torch.no_grad():
        for _ in range(5):
            model(torch.randn(2, 4))
    steps = session.report().steps
    assert len(steps) == 5 and all(s.mode == "eval" for s in steps)


class _Branch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class _Fanned(torch.nn.Module):
    """A model whose forward runs its two branch models on threads of their own, as
    DataParallel runs its replicas."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList([_Branch(), _Branch()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: list[torch.Tensor | None] = [None, None]

        def run(i: int) -> None:
            out[i] = self.branches[i](x)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return out[0] + out[1]  # type: ignore[operator]


def test_models_called_inside_a_model_on_other_threads_are_not_steps():
    """The model-call depth counts the calls under way on every thread: the branch models,
    watched so their calls reach the hooks too, run on threads while the outer model's call
    is under way, and each outer call is one forward of one step."""
    model = _Fanned()
    with vramscope.track() as session, torch.no_grad():
        session.watch(model, *model.branches)
        for _ in range(12):
            model(torch.randn(2, 4))
        assert session._hooks is not None and session._hooks.depth == 0
    steps = session.report().steps
    assert sum(s.count for s in steps) == 12
    assert all(s.micro_batches == 1 for s in steps)  # one forward a step, not three


def test_explicit_markers_take_over():
    model = torch.nn.Linear(4, 4)
    with vramscope.track() as session:
        for _epoch in range(2):
            for _ in range(2):
                model(torch.randn(2, 4)).sum().backward()
                model(torch.randn(2, 4)).sum().backward()
                session.step()
            session.epoch()
    report = session.report()
    assert [s.micro_batches for s in report.steps] == [2, 2, 2, 2]
    assert [e.steps for e in report.epochs] == [2, 2]


def test_tracking_does_not_change_the_loss():
    plain = small_loop()
    with vramscope.track():
        tracked = small_loop()
    assert plain == tracked


def test_measure_gives_the_same_losses_as_an_untracked_run():
    torch.manual_seed(0)
    runner = StepRunner(build_gpt(2, CPU), CPU)
    plain = [runner() for _ in range(2)]
    torch.manual_seed(0)
    report = vramscope.measure("example:gpt", batch_size=2, steps=2, device="cpu")
    assert report.extra["losses"] == plain


def test_every_hook_is_removed_also_after_an_exception():
    backward, grad = torch.autograd.backward, torch.autograd.grad
    zero_grad = torch.optim.Optimizer.zero_grad
    try:
        with vramscope.track():
            small_loop(epochs=1, batches=1)
            raise ValueError("user error")
    except ValueError:
        pass
    assert torch.autograd.backward is backward and torch.autograd.grad is grad
    assert torch.optim.Optimizer.zero_grad is zero_grad
    assert not module_mod._global_forward_hooks and not module_mod._global_forward_pre_hooks
    assert (
        not optimizer_mod._global_optimizer_pre_hooks
        and not optimizer_mod._global_optimizer_post_hooks
    )


def test_no_reference_to_user_tensors_is_kept():
    import gc
    import weakref

    model = torch.nn.Linear(4, 4)
    with vramscope.track() as session:
        x = torch.randn(2, 4)
        model(x).sum().backward()
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None
    session.report()


def test_cpu_report_has_exact_object_categories_and_states_why_others_are_null():
    report = vramscope.measure("example:gpt", batch_size=2, steps=2, device="cpu")
    model = build_gpt(2, CPU).model
    param_bytes = sum(p.numel() * 4 for p in model.parameters())  # tied weight counted once
    cats = report.categories_at_peak
    assert cats.parameters == param_bytes
    assert cats.gradients == param_bytes
    # AdamW: exp_avg and exp_avg_sq, plus one small `step` counter tensor per parameter
    n_params = len(list(model.parameters()))
    assert 2 * param_bytes < cats.optimizer_state <= 2 * param_bytes + 8 * n_params
    assert report.peak.allocated_bytes is None
    assert "CPU" in report.unavailable["peak.allocated_bytes"]
    assert report.peak.host_rss_bytes > 0


def test_profile_decorator_keeps_the_report():
    @vramscope.profile(print_report=False)
    def train():
        small_loop(epochs=1, batches=2)
        return "done"

    assert train() == "done"
    assert len(train.last_report.steps) == 2


class _Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        time.sleep(0.01)
        return torch.full((4,), float(i))


_WORKER_BALLAST: list[bytes] = []


def _hold_memory(_worker_id: int) -> None:
    _WORKER_BALLAST.append(b"x" * (128 * 2**20))  # written pages: resident in the worker


def test_host_memory_includes_dataloader_workers():
    import psutil

    main_rss = psutil.Process().memory_info().rss
    loader = torch.utils.data.DataLoader(
        _Numbers(), batch_size=4, num_workers=2, worker_init_fn=_hold_memory
    )
    model = torch.nn.Linear(4, 1)
    with vramscope.track(interval_s=0.05) as session:
        for x in loader:
            model(x).sum().backward()
    report = session.report()
    assert report.peak.host_rss_bytes > main_rss + 2 * 100 * 2**20


def test_a_long_history_stays_bounded_and_keeps_every_peak():
    from vramscope.report.model import PhaseStats
    from vramscope.tracking.records import StepHistory, StepRecord

    history = StepHistory(capacity=64, head=8)
    peaks = [(i * 7919) % 10007 for i in range(10_000)]
    for i, peak in enumerate(peaks):
        record = StepRecord(index=i, epoch=i // 1000, start_s=float(i), start_allocated=0)
        record.forwards, record.end_s = 1, i + 1.0
        record.phases["forward"] = PhaseStats(name="forward", peak_allocated_bytes=peak, step=i)
        history.append(record)
    records = list(history)
    assert len(records) <= 64
    assert [r.count for r in records[:8]] == [1] * 8  # the first steps as they were
    assert sum(r.count for r in records) == history.total == 10_000
    assert max(r.phases["forward"].peak_allocated_bytes for r in records) == max(peaks)
    assert sum(r.phases["forward"].count for r in records) == 10_000
    expected_next = 0
    for r in records:  # contiguous, and no entry spans two epochs
        last = r.last_index if r.last_index is not None else r.index
        assert r.index == expected_next and r.index // 1000 == last // 1000
        expected_next = last + 1


def test_thousands_of_inference_steps_make_a_bounded_report():
    model = torch.nn.Linear(4, 4)
    with torch.no_grad(), vramscope.track() as session:
        for _ in range(3000):
            model(torch.randn(1, 4))
    report = session.report()
    assert sum(s.count for s in report.steps) == 3000
    assert len(report.steps) <= 2048
    assert report.extra["tracking_notes"]  # says the later steps were merged
    # the tables say which steps an entry stands for
    console = Console(record=True, width=120)
    console.print(render(report))
    text = console.export_text()
    assert f"Steps (3,000, in {len(report.steps):,} entries)" in text
    last = report.steps[-1]
    assert f"{last.index}-{last.last_index}" in text
    page = html.render(report)
    assert f"3,000 steps in {len(report.steps):,} entries" in page


def test_window_reads_host_memory_without_cuda():
    with vramscope.track() as session:
        torch.nn.Linear(4, 4)(torch.randn(2, 4))
        window = session.window()
    assert window["host_rss_bytes"] > 0
    assert window["peak_allocated_bytes"] is None  # no caching allocator on the CPU


def test_the_sampler_keeps_its_interval_without_phase_reads():
    """On the CPU no phases are read on a sample of the steps: the sampler stays at 0.1 s
    (CUDA's slower pace is a GPU test); an interval the user sets is said as set."""
    model = torch.nn.Linear(4, 4)
    with vramscope.track() as session:
        for _ in range(30):
            model(torch.randn(2, 4)).sum().backward()
    sampler = session.report().extra["sampler"]
    assert sampler["auto"] is True and sampler["paces"] == []
    assert sampler["interval_s"] == sampler["effective_interval_s"] == 0.1
    with vramscope.track(interval_s=0.05) as session:
        model(torch.randn(2, 4))
    sampler = session.report().extra["sampler"]
    assert sampler["auto"] is False and sampler["interval_s"] == 0.05


def test_a_graph_traced_by_make_fx_is_not_a_backward():
    """AOTAutograd traces its joint graph by calling torch.autograd.grad on proxies (through
    make_fx) while torch.compile compiles; that is not one of the run's backward passes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    model = torch.nn.Linear(4, 4)

    def joint(x: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(model(x).sum(), x)[0]

    with vramscope.track() as session:
        make_fx(joint)(torch.randn(2, 4, requires_grad=True))
    report = session.report()
    assert not any(p.name == "backward" for s in report.steps for p in s.phases)
