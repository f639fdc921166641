"""Workloads for the tensor-parallel rows of ``distributed_accuracy.py``, with their own
tensor-parallel plan (``Workload.tensor_parallel_plan``).

``llama_blocks``: ``example:llama`` with only its layers split (query, key, value and the
MLP's input projections ``ColwiseParallel``, the output projections ``RowwiseParallel``),
the embedding, norms and head whole on every rank as plain tensors. Its collectives are
all-reduces alone, which gloo runs for CUDA tensors through pinned host copies (the default
plan's head gathers its logits with torch's functional all-gather, which gloo does not run
for CUDA tensors: measured on one GPU over gloo, those jobs die of SIGSEGV); the
optimizer steps parameter by parameter (``foreach=False``), as torch's foreach step refuses
a mix of tensors and DTensors.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from vramscope.examples import build_llama

PLAN = {
    "layers.*.self_attn.q_proj": ColwiseParallel(),
    "layers.*.self_attn.k_proj": ColwiseParallel(),
    "layers.*.self_attn.v_proj": ColwiseParallel(),
    "layers.*.self_attn.o_proj": RowwiseParallel(),
    "layers.*.mlp.gate_proj": ColwiseParallel(),
    "layers.*.mlp.up_proj": ColwiseParallel(),
    "layers.*.mlp.down_proj": RowwiseParallel(),
}


def llama_blocks(batch_size: int, device: torch.device):
    workload = build_llama(batch_size, device)
    workload.optimizer = torch.optim.AdamW(workload.model.parameters(), lr=3e-4, foreach=False)
    workload.tensor_parallel_plan = PLAN
    workload.name = "llama_blocks"
    return workload
