"""First layers' weight gradients (an image's channels into a patch embedding or a stem): cuDNN's
engines pad the input's channels and keep split-K partial sums of the weight in numbers no
rule of the shape gives, so on the H200 the estimator reads what was recorded for the very
shape (torch 2.11, cuDNN 9.19; 4,027 shapes of ``tests/gpu/record_conv_workspace_sweep.py``'s
seeded draw and grid of patch embeddings and stems, kept in ``tests/data`` and shipped with
the estimator as the table ``tests/gpu/first_layer_table.py`` builds)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from sweep_data import layer_workload
from vramscope.estimate.estimator import estimate
from vramscope.estimate.kernels import _recorded_first_layer_wgrad, _recorded_table
from vramscope.workload import Workload

sys.path.insert(0, str(Path(__file__).parent / "gpu"))

from first_layer_table import table

# recorded: 16x3x160x160 float32 into 64 channels by 16x16 patches (timm's test_vit): the
# input padded to 4 channels and 77 float32 copies of the padded weight, among others
WGRAD = 27_262_720


def test_the_shipped_table_is_built_from_the_kept_sweep():
    shipped = _recorded_table("first_layer_wgrad_h200")
    assert table()["rows"] == shipped
    assert len(shipped) == 4027
    assert shipped["16,3,160,160,64,3,16,16,16,16,0,0,1,1,1,float32"] == WGRAD
    # the same layer at other batches: no rule of the batch (57 to 121 weight copies)
    assert shipped["64,3,160,160,64,3,16,16,16,16,0,0,1,1,1,float32"] == 59_572_480


def test_only_a_recorded_first_layer_is_read():
    x = torch.empty(16, 3, 160, 160, device="meta")
    w = torch.empty(64, 3, 16, 16, device="meta")
    assert _recorded_first_layer_wgrad(x, w, [16, 16], [0, 0], [1, 1], 1) == WGRAD
    assert _recorded_first_layer_wgrad(x, w, [8, 8], [0, 0], [1, 1], 1) is None
    assert _recorded_first_layer_wgrad(x[:15], w, [16, 16], [0, 0], [1, 1], 1) is None
    channels_last = x.contiguous(memory_format=torch.channels_last)
    assert _recorded_first_layer_wgrad(channels_last, w, [16, 16], [0, 0], [1, 1], 1) is None


class Patches(nn.Module):
    """A ViT's patch embedding and a linear head over its tokens."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, width, 16, stride=16)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(x).flatten(2).transpose(1, 2)).mean(1)


def build(width: int):
    def builder(batch_size: int, device: torch.device) -> Workload:
        model = Patches(width).to(device)

        def batch():
            return (torch.randn(batch_size, 3, 160, 160, device=device),)

        return layer_workload(model, batch)

    return builder


def test_a_recorded_patch_embedding_takes_its_recorded_workspace():
    """16 images of 160x160 into 64 channels: 27 MB recorded (beside the two cuBLAS
    workspaces of 32 MiB an H200 keeps), more than the rules give a wider unrecorded layer."""
    recorded = estimate(build(64), 16, gpu="h200").peak.allocated_bytes
    assert recorded > WGRAD + 2 * 32 * 2**20
    assert estimate(build(80), 16, gpu="h200").peak.allocated_bytes < recorded
