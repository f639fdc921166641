"""Record, on a real GPU, what a grouped 1-D convolution allocates beyond its tensors, in its
forward and its backward, for inputs laid out as speech models hand them over (a transposed
``(batch, time, channels)`` view: channels-last for 1-D) and contiguous: the data behind the
estimator's cuDNN workspaces of positional convolutions (wav2vec2, HuBERT, data2vec-audio).

Usage (on a machine with a CUDA GPU): python tests/gpu/record_grouped_conv1d_sweep.py OUT.json.gz

Each row: ``[layout, batch, channels, length, kernel, groups, dtype, x_bytes, w_bytes,
out_bytes, fwd_extra, bwd_extra]``: ``fwd_extra`` the forward's highest allocated above the
input, weight and output; ``bwd_extra`` the backward's highest above what it holds then (input,
weight, output's gradient, and the input's and weight's gradients), in bytes; -1 when the
convolution failed.
"""

from __future__ import annotations

import gzip
import itertools
import json
import sys

import torch


def one(layout: str, b: int, c: int, length: int, k: int, g: int, dtype: torch.dtype) -> list:
    dev = torch.device("cuda")
    conv = torch.nn.Conv1d(c, c, k, padding=k // 2, groups=g).to(dev, dtype)
    if layout == "transposed":
        x = torch.randn(b, length, c, device=dev, dtype=dtype).transpose(1, 2)
    else:
        x = torch.randn(b, c, length, device=dev, dtype=dtype)
    x.requires_grad_(True)
    torch.cuda.synchronize()
    w_bytes = sum(p.numel() * p.element_size() for p in conv.parameters())
    x_bytes = x.numel() * x.element_size()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        out = conv(x)
        torch.cuda.synchronize()
        out_bytes = out.numel() * out.element_size()
        fwd_extra = torch.cuda.max_memory_allocated() - base - out_bytes
        grad = torch.randn_like(out)
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out.backward(grad)
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated()
        bwd_extra = torch.cuda.max_memory_allocated() - max(held, after)
    except RuntimeError:
        out_bytes, fwd_extra, bwd_extra = -1, -1, -1
    row = [layout, b, c, length, k, g, str(dtype).split(".")[-1], x_bytes, w_bytes]
    return [*row, out_bytes, fwd_extra, bwd_extra]


def main() -> int:
    out_path = sys.argv[1]
    torch.backends.cudnn.benchmark = False
    rows = []
    grid = itertools.product(
        ("transposed", "contiguous"),
        (1, 4, 8),
        (128, 256, 768),
        (49, 200, 800),
        (15, 16, 19, 31, 64, 128),
        (2, 4, 16),
        (torch.float32, torch.bfloat16),
    )
    for layout, b, c, length, k, g, dtype in grid:
        rows.append(one(layout, b, c, length, k, g, dtype))
        torch.cuda.empty_cache()
    meta = {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(),
        "columns": [
            "layout",
            "batch",
            "channels",
            "length",
            "kernel",
            "groups",
            "dtype",
            "x_bytes",
            "w_bytes",
            "out_bytes",
            "fwd_extra",
            "bwd_extra",
        ],
    }
    with gzip.open(out_path, "wt") as f:
        json.dump({"meta": meta, "rows": rows}, f)
    print(f"{len(rows)} rows -> {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
