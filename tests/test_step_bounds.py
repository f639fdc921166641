"""Where a step begins and ends, on the CPU.

A training step ends where its last optimizer step ends; what the script does after it
(zeroing the gradients, keeping a metric, making the next batch) belongs to the next step,
the one that consumes that batch, once that step begins (a zero_grad, a forward, a fetch).
Two optimizer steps one after the other end one step; a GAN's optimizers, each after its own
backward, end a step each. The independent oracle (benchmarks/peak_oracle.py) bounds its
steps the same way, and ``tests/gpu/test_tracking_gpu.py`` holds every step entry's peak to
it on a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

import vramscope

MIB = 2**20


def batch() -> torch.Tensor:
    return torch.randn(MIB // 4 // 64, 64)  # 1 MiB of float32


def tensors_at_peak(report: vramscope.Report, nbytes: int) -> list[dict]:
    return [t for t in report.extra["peak_tensors"] if t["bytes"] == nbytes]


def test_a_batch_made_after_the_optimizer_step_belongs_to_the_step_that_consumes_it():
    """The run's peak is where the next batch is made while the one before still lives: that
    is the next step's, in its first phase (zero_grad), not the optimizer phase before it."""
    torch.manual_seed(0)
    model = nn.Linear(64, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with vramscope.track(detail="modules") as session:
        for _ in range(3):
            x = batch()
            opt.zero_grad()
            model(x[:2]).sum().backward()
            opt.step()
    report = session.report()
    attribution = report.extra["attribution"]
    assert (attribution["peak_step"], attribution["peak_phase"]) == (1, "zero_grad")
    batches = tensors_at_peak(report, MIB)
    assert len(batches) == 2
    made = {(t["step"], t["phase"]) for t in batches}
    assert (1, "zero_grad") in made  # the second batch
    assert [s.index for s in report.steps] == [0, 1, 2]


def test_what_is_kept_after_the_optimizer_step_is_the_next_steps():
    """A tensor kept after ``optimizer.step()`` (a metric, a leak) is made in the next step,
    which begins where the optimizer step ended, even before its gradients are zeroed."""
    torch.manual_seed(0)
    model = nn.Linear(64, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    with vramscope.track(detail="modules") as session:
        for _ in range(3):
            model(batch()[:2]).sum().backward()
            opt.step()
            kept.append(torch.zeros(MIB // 4))
            opt.zero_grad()
    report = session.report()
    assert report.extra["attribution"]["peak_step"] == 2  # the last batch's forward
    kept_at_peak = [t for t in tensors_at_peak(report, MIB) if t["shape"] == [MIB // 4]]
    made = sorted((t["step"], t["phase"]) for t in kept_at_peak)
    assert made == [(1, "zero_grad"), (2, "zero_grad")]  # each in the step after its update
    assert [s.index for s in report.steps] == [0, 1, 2]


def test_two_optimizer_steps_one_after_the_other_end_one_step():
    torch.manual_seed(0)
    body, head = nn.Linear(64, 64), nn.Linear(64, 4)
    model = nn.Sequential(body, head)
    opts = [torch.optim.SGD(body.parameters(), lr=0.1), torch.optim.Adam(head.parameters())]
    with vramscope.track() as session:
        for _ in range(3):
            model(batch()[:2]).sum().backward()
            for opt in opts:
                opt.step()
            for opt in opts:
                opt.zero_grad()
    steps = session.report().steps
    assert [s.index for s in steps] == [0, 1, 2]
    for s in steps:
        counts = {p.name: p.count for p in s.phases}
        assert counts["optimizer"] == 2 and counts["forward"] == counts["backward"] == 1


def test_a_gan_ends_a_step_at_each_optimizer_after_its_own_backward():
    torch.manual_seed(0)
    net_g, net_d = nn.Linear(8, 64), nn.Linear(64, 1)
    opt_g, opt_d = torch.optim.Adam(net_g.parameters()), torch.optim.Adam(net_d.parameters())
    with vramscope.track() as session:
        for _ in range(2):
            net_d.zero_grad()
            fake = net_g(torch.randn(4, 8))
            (net_d(torch.randn(4, 64)).mean() - net_d(fake.detach()).mean()).backward()
            opt_d.step()
            net_g.zero_grad()
            (-net_d(fake).mean()).backward()
            opt_g.step()
    steps = session.report().steps
    assert [s.index for s in steps] == [0, 1, 2, 3]
    assert all(s.mode == "train" for s in steps)


def test_a_closure_runs_inside_its_optimizer_step():
    torch.manual_seed(0)
    model = nn.Linear(64, 4)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    x = batch()[:8]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    with vramscope.track() as session:
        for _ in range(3):
            opt.step(closure)
    steps = session.report().steps
    assert [s.index for s in steps] == [0, 1, 2]
    for s in steps:  # each optimizer step with the closure's forwards and backwards in it
        counts = {p.name: p.count for p in s.phases}
        assert counts["optimizer"] == 1 and counts["forward"] == counts["backward"] >= 2


def sgd_by_hand(clear: str, device: str = "cpu") -> vramscope.Session:
    """Five steps of SGD written by hand, the gradients cleared as ``clear`` says."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 1)).to(device)
    with vramscope.track() as session:
        for _ in range(5):
            if clear == "zero_grad":
                model.zero_grad()
            x, y = torch.randn(16, 12, device=device), torch.randn(16, 1, device=device)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    if clear == "none":
                        p.grad = None
    return session


def test_parameters_updated_by_hand_end_a_step_at_each_update():
    """No optimizer in the run (``p -= lr * p.grad``): a forward after the gradients were
    cleared (``p.grad = None``), or the gradients zeroed after a backward
    (``model.zero_grad()``), begins the next step: five steps of one micro-batch, not one
    step of five (gradient accumulation keeps its gradients and has an optimizer step)."""
    for clear in ("none", "zero_grad"):
        steps = sgd_by_hand(clear).report().steps
        assert [(s.index, s.micro_batches) for s in steps] == [(i, 1) for i in range(5)], clear
