"""Record, on a real GPU, the workspace cuDNN takes for ResNet-18's convolution shapes across
batch sizes: the data to model how its engine choice changes with the batch (see
``tests/test_fit_edge_resnet18.py``: at batch 466-470 three of these shapes took other
workspaces than at batch 128).

Usage (on a machine with a CUDA GPU): python tests/gpu/record_conv_batch_sweep.py OUT.json

For each batch size and shape, one float32 forward and one backward (input and weight
gradients) run with ``cudnn.benchmark`` off, as ``vramscope measure`` runs them, each under
the allocator's history; ``OUT.json`` holds per case the sizes the allocator was asked for
(``alloc``) and refused (``oom``), in order.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

# (in channels, out channels, kernel, stride, input height = width) of ResNet-18 at 224x224
SHAPES = [
    (3, 64, 7, 2, 224),
    (64, 64, 3, 1, 56),
    (64, 128, 3, 2, 56),
    (128, 128, 3, 1, 28),
    (64, 128, 1, 2, 56),
    (128, 256, 3, 2, 28),
    (256, 256, 3, 1, 14),
    (128, 256, 1, 2, 28),
    (256, 512, 3, 2, 14),
    (512, 512, 3, 1, 7),
    (256, 512, 1, 2, 14),
]
BATCHES = [32, 64, 128, 192, 256, 320, 384, 416, 448, 464, 468, 469, 470, 512]


def requests(run) -> list[list]:
    """``[action, size]`` of every allocation request while ``run()`` runs."""
    memory = torch.cuda.memory
    memory._record_memory_history(context=None, max_entries=100_000)
    try:
        run()
        torch.cuda.synchronize()
        trace = memory._snapshot()["device_traces"][0]
    finally:
        memory._record_memory_history(enabled=None)
    return [[e["action"], e["size"]] for e in trace if e["action"] in ("alloc", "oom")]


def record_case(batch: int, cin: int, cout: int, k: int, stride: int, h: int) -> dict:
    x = torch.randn(batch, cin, h, h, device="cuda", requires_grad=True)
    w = torch.randn(cout, cin, k, k, device="cuda", requires_grad=True)
    out: list[torch.Tensor] = []
    forward = requests(lambda: out.append(F.conv2d(x, w, None, stride, k // 2)))
    grad = torch.randn_like(out[0])
    backward = requests(lambda: torch.autograd.grad(out[0], (x, w), grad))
    return {"batch": batch, "conv": [cin, cout, k, stride, h], "fwd": forward, "bwd": backward}


def main() -> int:
    torch.backends.cudnn.benchmark = False
    cases = []
    for batch in BATCHES:
        for shape in SHAPES:
            cases.append(record_case(batch, *shape))
            torch.cuda.empty_cache()  # a recording script: each case starts from nothing
    meta = {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump({"meta": meta, "cases": cases}, f)
    print(f"recorded {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
