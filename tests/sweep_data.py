"""Rows of the workspace sweeps recorded on an H200 (torch 2.11, cuDNN 9.19) and kept in
``tests/data``: ``conv_workspace_sweep_h200.json.gz`` (``tests/gpu/record_conv_workspace_sweep.py``)
and ``workspace_sweep_2_h200.json.gz`` (``tests/gpu/record_workspace_sweep_2.py``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch

DATA = Path(__file__).parent / "data"
# the sweeps' dtype names
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def recorded(file: str, kind: str) -> list[dict]:
    """The rows of one kind in a sweep's file, after checking where it was recorded."""
    document = json.loads(gzip.decompress((DATA / file).read_bytes()))
    assert document["gpu"] == "NVIDIA H200" and document["cudnn"] == 91900
    return [row for row in document["rows"] if row.get("kind") == kind]
