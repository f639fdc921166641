"""The plumbing alone of the context-parallel rank job on a machine without a GPU
(``distributed_accuracy.py --allow-cpu``): nothing measured, never used on a GPU.

torch's ring attention (``context_parallel``) has handlers for the GPU's attention kernels
only (flash, memory-efficient, cuDNN); the CPU's ``_scaled_dot_product_flash_attention_for_cpu``
has none, and the job dies there. ``install()`` gives ``aten._scaled_dot_product_efficient_
attention`` and its backward CPU kernels written out (the output, and the log-sum-exp the
ring merges), and makes ``F.scaled_dot_product_attention`` call it, so that the ring runs
on the CPU as it does on the GPU: its handler, its all-gathers of the keys and values and
its exchanges of their gradients (through the staging with ``VRAMSCOPE_STAGE_CPU=1``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_LIBRARIES: list[Any] = []


def _scores(query: torch.Tensor, key: torch.Tensor, is_causal: bool, scale: float | None):
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = (query @ key.transpose(-2, -1)).float() * scale
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores, scale


def efficient_attention(
    query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None
):
    scores, _ = _scores(query, key, is_causal, scale)
    lse = scores.logsumexp(dim=-1)
    out = ((scores - lse.unsqueeze(-1)).exp() @ value.float()).to(query.dtype)
    empty = torch.empty((), dtype=torch.int64)
    return out, lse, empty, empty


def efficient_attention_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    dropout_p,
    grad_input_mask,
    is_causal=False,
    *,
    scale=None,
):
    scores, scale = _scores(query, key, is_causal, scale)
    p = (scores - logsumexp.unsqueeze(-1)).exp()
    grad = grad_out.float()
    grad_value = p.transpose(-2, -1) @ grad
    grad_p = grad @ value.float().transpose(-2, -1)
    delta = (grad * out.float()).sum(dim=-1, keepdim=True)
    grad_scores = p * (grad_p - delta) * scale
    grad_query = grad_scores @ key.float()
    grad_key = grad_scores.transpose(-2, -1) @ query.float()
    dtype = query.dtype
    return grad_query.to(dtype), grad_key.to(dtype), grad_value.to(dtype), torch.zeros(())


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw
):
    """Named as the function it stands for: context_parallel replaces it by its name."""
    assert attn_mask is None and not dropout_p
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, True, 0.0, is_causal, scale=scale
    )
    return out[0]


def install() -> None:
    """CPU kernels for memory-efficient attention, and ``F.scaled_dot_product_attention``
    calling it (before ``context_parallel`` wraps it)."""
    if _LIBRARIES:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("_scaled_dot_product_efficient_attention", efficient_attention, "CPU")
    library.impl(
        "_scaled_dot_product_efficient_attention_backward", efficient_attention_backward, "CPU"
    )
    _LIBRARIES.append(library)
    F.scaled_dot_product_attention = scaled_dot_product_attention
