"""Depthwise 7x7 convolutions over channels-last inputs (ConvNeXt's and MambaOut's token
mixers): cuDNN's backward picks among engines whose workspaces differ by orders of magnitude,
with no rule of the shape, so on the H200 the estimator reads what was recorded for the very
shape (torch 2.11, cuDNN 9.19; 856 layers, ``tests/gpu/record_depthwise_sweep.py``, kept in
``tests/data/depthwise_sweep_h200*.json.gz`` and shipped with the estimator as the table
``tests/gpu/fit_depthwise_sweep.py --table`` builds)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import torch
from torch import nn

from sweep_data import layer_workload
from vramscope.estimate.estimator import estimate
from vramscope.estimate.kernels import _recorded_depthwise_2d, _recorded_table
from vramscope.workload import Workload

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(Path(__file__).parent / "gpu"))

from fit_depthwise_sweep import SWEEPS, table  # noqa: E402

# recorded: 16x24x40x40 float32, the weight gradient's workspace
WGRAD = 39_008_919


def test_the_shipped_table_is_built_from_the_kept_sweeps():
    shipped = _recorded_table("depthwise_conv2d_h200")
    assert table([DATA / name for name in SWEEPS])["rows"] == shipped
    assert len(shipped) == 856
    assert {key.split(",")[-1] for key in shipped} == {"float32", "bfloat16"}
    assert shipped["channels_last,16,24,40,40,7,float32"][1] == WGRAD
    with gzip.open(DATA / SWEEPS[0], "rt") as f:
        assert json.load(f)["meta"]["gpu"] == "NVIDIA H200"


def operands(b: int, c: int, size: int, channels_last: bool = True):
    x = torch.empty(b, c, size, size, device="meta")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, torch.empty(c, 1, 7, 7, device="meta")


def test_only_a_recorded_channels_last_shape_is_read():
    x, w = operands(16, 24, 40)
    assert _recorded_depthwise_2d(x, w, [1, 1], [3, 3], [1, 1], 24) == (0, WGRAD)
    assert _recorded_depthwise_2d(x, w, [2, 2], [3, 3], [1, 1], 24) is None  # strided
    assert _recorded_depthwise_2d(x, w, [1, 1], [0, 0], [1, 1], 24) is None  # no padding
    assert _recorded_depthwise_2d(*operands(16, 24, 40, False), [1, 1], [3, 3], [1, 1], 24) is None
    assert _recorded_depthwise_2d(*operands(16, 24, 41), [1, 1], [3, 3], [1, 1], 24) is None
    # a slice of a channels-last tensor's channels (MambaOut's): cuDNN gets a dense copy
    sliced = torch.empty(16, 40, 40, 96, device="meta").permute(0, 3, 1, 2)[:, 8:32]
    assert _recorded_depthwise_2d(sliced, w, [1, 1], [3, 3], [1, 1], 24) == (0, WGRAD)


class Mixer(nn.Module):
    """ConvNeXt's token mixer: a 7x7 depthwise convolution with a bias."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def build(channels: int, size: int, channels_last: bool = True):
    def builder(batch_size: int, device: torch.device) -> Workload:
        model = Mixer(channels).to(device)

        def batch():
            x = torch.randn(batch_size, channels, size, size, device=device)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return (x.requires_grad_(),)

        return layer_workload(model, batch)

    return builder


def test_a_recorded_layer_takes_its_recorded_weight_gradient_workspace():
    """16x24x40x40 in float32: 2.5 MB of input, 39 MB of cuDNN workspace recorded."""
    recorded = estimate(build(24, 40), 16, gpu="h200").peak.allocated_bytes
    assert recorded > WGRAD
    # one more pixel a side, or the channels-first layout: not recorded, nothing read
    assert estimate(build(24, 41), 16, gpu="h200").peak.allocated_bytes < WGRAD
    assert estimate(build(24, 40, False), 16, gpu="h200").peak.allocated_bytes < WGRAD
    # another GPU's profile does not read the H200's table
    assert estimate(build(24, 40), 16, gpu="a100").peak.allocated_bytes < WGRAD
