"""The gradients of mse_loss, smooth_l1_loss and huber_loss are made contiguous by their
kernels (``zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT)`` in ``Loss.cpp``, on every
device), where torch's meta functions keep a channels-last input's layout: the estimator's
emulated GPU makes them as the kernels do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from vramscope.estimate import cuda_rules

aten = torch.ops.aten
LOSSES = {
    aten.mse_loss_backward.default: (F.mse_loss, ()),
    aten.smooth_l1_loss_backward.default: (F.smooth_l1_loss, (1.0,)),
    aten.huber_loss_backward.default: (F.huber_loss, (1.0,)),
}


@pytest.mark.parametrize("op", list(LOSSES), ids=lambda op: op.__name__)
def test_a_channels_last_inputs_loss_gradient_is_contiguous_as_the_kernel_makes_it(op):
    loss, extra = LOSSES[op]
    x = torch.randn(4, 8, 16, 16).contiguous(memory_format=torch.channels_last)
    target = torch.randn_like(x)
    x.requires_grad_(True)
    (real,) = torch.autograd.grad(loss(x, target), x)  # the kernel itself, on the CPU
    assert real.is_contiguous() and not x.is_contiguous()
    plain = x.detach()
    with FakeTensorMode() as mode:
        fx, ft = mode.from_tensor(plain), mode.from_tensor(target)
        grad_out = torch.empty(())
        meta = op(grad_out, fx, ft, 1, *extra)  # torch's meta function: the input's layout
        ours = cuda_rules.KERNELS[op](mode, (grad_out, fx, ft, 1, *extra), {})
    assert meta.stride() == x.stride()
    assert ours.stride() == real.stride() and ours.shape == real.shape
    assert ours.dtype == real.dtype
