"""Grouped 1-D convolutions (speech models' positional convolutions): cuDNN picks among
engines whose workspaces differ a thousandfold, with no rule of the shape, so the estimator
reads what was recorded on an H200 for the very shape (torch 2.11, cuDNN 9.19; 1,944
convolutions, ``tests/gpu/record_grouped_conv1d_sweep.py``, kept in
``tests/data/grouped_conv1d_sweep_h200.json.gz`` and shipped with the estimator)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from torch import nn

from sweep_data import layer_workload
from vramscope.estimate.estimator import estimate
from vramscope.estimate.kernels import _recorded_grouped_1d
from vramscope.workload import Workload

DATA = Path(__file__).parent / "data" / "grouped_conv1d_sweep_h200.json.gz"


def sweep() -> list[list]:
    with gzip.open(DATA, "rt") as f:
        return json.load(f)["rows"]


def test_the_shipped_table_is_the_recorded_sweep():
    rows = [r for r in sweep() if r[10] >= 0]
    assert len(rows) == 1944
    for layout, b, c, length, k, g, dtype, *_, fwd, bwd in rows[::97]:
        x = torch.empty(b, length, c, dtype=getattr(torch, dtype), device="meta")
        x = x.transpose(1, 2) if layout == "transposed" else x.transpose(1, 2).contiguous()
        w = torch.empty(c, c // g, k, dtype=x.dtype, device="meta")
        assert _recorded_grouped_1d(x, w, [1], [k // 2], [1], g) == (fwd, bwd)


def test_a_shape_outside_the_grid_or_another_convolution_is_not_read():
    x = torch.empty(4, 128, 50, device="meta")  # a length not recorded
    assert (
        _recorded_grouped_1d(x, torch.empty(128, 64, 19, device="meta"), [1], [9], [1], 2) is None
    )
    x = torch.empty(4, 128, 49, device="meta")
    w = torch.empty(128, 64, 19, device="meta")
    assert _recorded_grouped_1d(x, w, [2], [9], [1], 2) is None  # strided
    assert _recorded_grouped_1d(x, w, [1], [0], [1], 2) is None  # no padding
    depthwise = torch.empty(128, 1, 19, device="meta")
    assert _recorded_grouped_1d(x, depthwise, [1], [9], [1], 128) is None


class PositionalConv(nn.Module):
    """data2vec-audio's positional convolution: 128 channels in 2 groups, kernel 19, over a
    (batch, frames, channels) tensor handed over transposed."""

    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(128, 128, kernel, padding=kernel // 2, groups=2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.conv(hidden.transpose(1, 2)).transpose(1, 2)


def build(kernel: int):
    def builder(batch_size: int, device: torch.device) -> Workload:
        model = PositionalConv(kernel).to(device)

        def batch():
            return (torch.randn(batch_size, 49, 128, device=device),)

        return layer_workload(model, batch)

    return builder


def test_data2vec_audios_positional_convolution_takes_its_recorded_gigabyte():
    """At batch 4 over 49 frames the backward of the kernel-19 convolution took 1.04 GiB on
    the H200 (1,090,920,448 bytes: data2vec-audio was estimated 91 % short without it); the
    same layer with kernel 16 (wav2vec2's kind) took 0.3 MB."""
    big = estimate(build(19), 4, gpu="h200")
    small = estimate(build(16), 4, gpu="h200")
    assert big.peak.allocated_bytes > 1_090_920_448
    assert small.peak.allocated_bytes < 8 * 2**20
