"""Model construction under an estimate: initializers keep their checks and lose their cost,
data-dependent loops end, and where each data-dependent value was read is still named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vramscope
from vramscope.errors import VramscopeError
from vramscope.estimate.estimator import estimate

WIDTH = 1024  # a 1024x1024 float32 weight: 4 MiB


class Initialised(nn.Module):
    """Every costly initializer of torch.nn.init, and torch 2.14's rejection loop."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)
        self.conv = nn.Conv2d(64, 64, 3)
        nn.init.trunc_normal_(self.a.weight, std=0.02)
        nn.init.orthogonal_(self.b.weight)
        nn.init.sparse_(self.a.weight, sparsity=0.5)
        nn.init.dirac_(self.conv.weight)
        nn.init.xavier_normal_(self.b.weight)
        nn.init.kaiming_normal_(self.a.weight, mode="fan_out", nonlinearity="relu")
        self.scale = nn.Parameter(torch.empty(4))
        nn.init.uniform_(self.scale, 2.0, 3.0)  # small: its real values are kept
        self.scale_at_build = float(self.scale.detach()[0])
        # torch 2.14's trunc_normal_, written out: redraw until no value is out of bounds
        w = torch.empty(WIDTH, WIDTH).normal_()
        draws = 0
        while True:
            draws += 1
            mask = (w < -2) | (w > 2)
            if not mask.any():
                break
            w = torch.where(mask, torch.empty_like(w).normal_(), w)
        self.draws = draws

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _build(batch_size: int, device: torch.device) -> vramscope.Workload:
    model = Initialised().to(device)
    built.append(model)
    return vramscope.Workload(
        model=model,
        optimizer=None,
        batch=lambda: (torch.randn(batch_size, WIDTH, device=device),),
        loss=lambda m, x: m(x),
    )


built: list[Initialised] = []


@pytest.fixture(scope="module")
def report():
    built.clear()
    return estimate(_build, 8, gpu="h200")


def test_initializers_leave_the_parameters_as_they_were(report):
    weights = 2 * (WIDTH * WIDTH * 4) + 64 * 64 * 9 * 4
    biases = 2 * 4096 + 512  # two 4 KiB biases and the conv's 256 B, each a 512 B block
    assert report.categories_at_peak.parameters == weights + biases + 512


def test_a_rejection_loop_on_any_ends_at_its_first_check(report):
    assert built[0].draws == 1
    notes = report.extra["estimate"]["data_dependent"]
    assert len(notes) == 1 and notes[0].startswith("Tensor.item() of any at test_estimate_init.py:")


def test_a_small_tensor_keeps_the_values_its_initializer_drew(report):
    assert 2.0 <= built[0].scale_at_build <= 3.0


def test_initializers_are_torchs_own_again_after_the_estimate(report):
    assert nn.init.trunc_normal_.__module__ == "torch.nn.init"
    assert nn.init.orthogonal_.__code__.co_filename.endswith("torch/nn/init.py")


def test_an_initializer_given_a_wrong_shape_fails_as_it_would_on_the_gpu():
    def build(batch_size: int, device: torch.device) -> vramscope.Workload:
        model = nn.Linear(4, 4).to(device)
        nn.init.xavier_uniform_(model.bias)  # 1-D: torch raises ValueError
        return vramscope.Workload(model=model, optimizer=None, batch=lambda: (), loss=None)

    with pytest.raises(VramscopeError, match="Fan in and fan out can not be computed"):
        estimate(build, 1, gpu="h200")
