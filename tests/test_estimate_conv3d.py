"""3-D convolutions through cuDNN: the workspaces of the forward and of the data gradient
against the allocations recorded on an H200 (``tests/data/conv3d_trace_h200_fp16``,
``benchmarks/zoo_layers.py:conv3d_fp16`` at batch 8 in float16 mixed precision, recorded by
``tests/gpu/record_conv_workspaces.py``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from vramscope.estimate.profiles import get_profile
from vramscope.estimate.trace import trace_workload
from vramscope.workload import resolve

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "data" / "conv3d_trace_h200_fp16.json.gz"
ALLOC = 0


def _rounded(n: int) -> int:
    return -(-n // 512) * 512


def recorded_workspaces() -> dict[str, list[int]]:
    """Per op of the first step: what each convolution allocated beyond its outputs."""
    data = json.loads(gzip.decompress(RECORDED.read_bytes()))
    ops = {op[0]: op for op in data["ops"]}
    sizes: dict[int, list[int]] = {}
    for action, _addr, size, _stream, op in data["trace"]:
        if action == ALLOC and op in ops and ops[op][1].startswith("convolution"):
            sizes.setdefault(op, []).append(size)
    first_step = sorted(sizes)[:8]  # 4 convolutions forward, 4 backward
    workspaces: dict[str, list[int]] = {"forward": [], "data": []}
    for op in first_step:
        name, allocations = ops[op][1], sizes[op]
        if name == "convolution":
            workspaces["forward"].append(_rounded(allocations[1]))
        elif allocations[0] == ops[op][3][1]["bytes"]:  # the input's gradient, its workspace
            workspaces["data"].append(_rounded(allocations[1]))
    return workspaces


def test_3d_convolutions_transpose_input_output_and_weight_as_recorded():
    trace = trace_workload(
        resolve(str(ROOT / "benchmarks" / "zoo_layers.py") + ":conv3d_fp16"),
        8,
        get_profile("h200"),
        precision="16-mixed",
        steps=1,
    )
    blocks = list(trace.blocks.values())
    forward = [_rounded(b.size) for b in blocks if b.op == "cuDNN convolution workspace"]
    data = [
        _rounded(b.size) for b in blocks if b.op == "cuDNN convolution backward (data) workspace"
    ]
    recorded = recorded_workspaces()
    assert len(forward) == len(recorded["forward"]) == 4
    assert len(data) == len(recorded["data"]) == 3  # the first layer has no input gradient
    pairs = zip(sorted(forward + data), sorted(recorded["forward"] + recorded["data"]), strict=True)
    # within one allocator block of 512 bytes (cuDNN asks 16 or 147 bytes beyond the operands)
    assert all(abs(ours - theirs) <= 512 for ours, theirs in pairs), (forward, data, recorded)
