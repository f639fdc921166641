"""Rows of the workspace sweeps recorded on an H200 (torch 2.11, cuDNN 9.19) and kept in
``tests/data``: ``conv_workspace_sweep_h200.json.gz`` (``tests/gpu/record_conv_workspace_sweep.py``)
and ``workspace_sweep_2_h200.json.gz`` (``tests/gpu/record_workspace_sweep_2.py``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import torch

from vramscope.workload import Workload

DATA = Path(__file__).parent / "data"
# the sweeps' dtype names
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def write_table(out: Path, document: dict) -> None:
    """A recorded table the estimator ships (``src/vramscope/estimate/recorded``): compact
    JSON, gzipped with no timestamp, so that the same recordings give the same bytes."""
    text = json.dumps(document, separators=(",", ":")).encode()
    out.write_bytes(gzip.compress(text, mtime=0))
    print(f"{out}: {len(document['rows'])} rows")


def depthwise_rule(row: dict, gpu: str = "h200") -> int:
    """What ``_depthwise_channels_last_backward_bytes`` gives a recorded depthwise row."""
    from vramscope.estimate.kernels import _depthwise_channels_last_backward_bytes
    from vramscope.estimate.profiles import get_profile

    dtype = DTYPES[row["dtype"]]
    x = torch.empty(row["x"], dtype=dtype, device="meta")
    w = torch.empty(row["w"], dtype=dtype, device="meta")
    if row["cl"]:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    return _depthwise_channels_last_backward_bytes(x, w, row["groups"], get_profile(gpu))


def recorded(file: str, kind: str) -> list[dict]:
    """The rows of one kind in a sweep's file, after checking where it was recorded."""
    document = json.loads(gzip.decompress((DATA / file).read_bytes()))
    assert document["gpu"] == "NVIDIA H200" and document["cudnn"] == 91900
    return [row for row in document["rows"] if row.get("kind") == kind]


def layer_workload(model: torch.nn.Module, batch: Callable[[], tuple]) -> Workload:
    """The workload the recorded tables' tests estimate a layer in: its output's mean square
    as the loss, SGD."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return Workload(
        model=model, optimizer=optimizer, batch=batch, loss=lambda m, *x: m(*x).square().mean()
    )
