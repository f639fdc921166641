"""A mixture-of-experts workload for the expert-parallel row of ``distributed_accuracy.py``.

``moe_grouped``: ``example:llama``'s attention layers with each MLP a mixture of 8 experts
(SwiGLU, 512 → 1024 → 512) and top-2 routing; the experts held grouped, as transformers'
``MixtralExperts`` holds them (one module whose parameters are stacked along the experts,
called with the tokens, each token's top-k experts and their weights), which is the form
``vramscope.distributed.expert_parallel`` exchanges as a real job does: every rank sends
its tokens × top-k rows and receives as many (routing even), so the ranks' all-to-alls
match. Vocabulary 8192, 4 layers, 256 tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vramscope import Workload
from vramscope.examples import LlamaAttention

VOCAB, DIM, LAYERS, HEADS, HIDDEN, EXPERTS, TOP_K, SEQ = 8192, 512, 4, 8, 1024, 8, 2, 256


class GroupedExperts(nn.Module):
    """Experts stacked along dimension 0, called as transformers' ``MixtralExperts``."""

    def __init__(self, experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * hidden, dim) * dim**-0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, dim, hidden) * hidden**-0.5)

    def forward(
        self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        for expert in range(self.num_experts):
            token, slot = torch.where(top_k_index == expert)
            if token.numel() == 0:
                continue
            gate, up = F.linear(hidden[token], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert])
            out.index_add_(0, token, y * top_k_weights[token, slot, None].to(y.dtype))
        return out


class MoE(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = GroupedExperts(experts, dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = torch.topk(F.softmax(self.router(x), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(x, chosen, weights).reshape(shape)


class MoELayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(DIM)
        self.self_attn = LlamaAttention(DIM, HEADS)
        self.post_attention_layernorm = nn.RMSNorm(DIM)
        self.moe = MoE(DIM, HIDDEN, EXPERTS, TOP_K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.moe(self.post_attention_layernorm(x))


class MoELlama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seq = SEQ
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(MoELayer() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def moe_grouped(batch_size: int, device: torch.device) -> Workload:
    model = MoELlama().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator(device="cpu").manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=generator).to(device)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(model: nn.Module, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return Workload(model=model, optimizer=opt, batch=batch, loss=loss, name="moe_grouped")
