"""Small workloads for per-rank estimates, written for one GPU as a user writes them: the
tests apply DDP, FSDP2, HSDP and ZeRO to them the way vramscope does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import vramscope


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(F.gelu(self.up(x))))


class Tower(nn.Module):
    """An input layer, a ModuleList of alike blocks, a head."""

    def __init__(self, inputs: int, dim: int, hidden: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(inputs, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(blocks))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _workload(
    model: nn.Module, batch_size: int, inputs: int, classes: int, device
) -> vramscope.Workload:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch():
        x = torch.randn(batch_size, inputs, device=device)
        y = torch.randint(0, classes, (batch_size,), device=device)
        return x, y

    def loss(model, x, y):
        return F.cross_entropy(model(x), y)

    return vramscope.Workload(model=model, optimizer=opt, batch=batch, loss=loss)


def tower(batch_size: int, device: torch.device) -> vramscope.Workload:
    """Four blocks of 512 → 2048 → 512 (8.4 M parameters, 33.6 MB in float32)."""
    return _workload(Tower(256, 512, 2048, 4, 10), batch_size, 256, 10, device)


def uneven(batch_size: int, device: torch.device) -> vramscope.Workload:
    """Dimensions that divide by no world size but 1: every shard is padded."""
    return _workload(Tower(13, 30, 70, 3, 7), batch_size, 13, 7, device)


class Chain(nn.Module):
    """Three bias-free layers of 10,000, 6,000 and 6,000 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(100, 100, bias=False)
        self.b = nn.Linear(100, 60, bias=False)
        self.c = nn.Linear(60, 100, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


def chain(batch_size: int, device: torch.device) -> vramscope.Workload:
    """ZeroRedundancyOptimizer over 2 ranks gives rank 0 the 10,000 and rank 1 both 6,000s:
    rank 1 is the heaviest."""
    return _workload(Chain(), batch_size, 100, 100, device)


def _llama_workload(model: nn.Module, batch_size: int, device, plan=None) -> vramscope.Workload:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    vocab = model.embed_tokens.num_embeddings

    def batch():
        tokens = torch.randint(0, vocab, (batch_size, model.seq + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(model, idx, target):
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return vramscope.Workload(
        model=model, optimizer=opt, batch=batch, loss=loss, tensor_parallel_plan=plan
    )


def llama(batch_size: int, device: torch.device) -> vramscope.Workload:
    """example:llama's layers, small: vocabulary 512, width 64, 2 layers of 4 heads, MLP 176,
    32 tokens; every dimension divides by 2 and 4."""
    from vramscope.examples import ExampleLlama

    return _llama_workload(ExampleLlama(512, 64, 2, 4, 176, 32), batch_size, device)


def llama4(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The small llama with 4 layers: 4 pipeline stages of one block each, or 2 ranks of 2
    virtual stages (interleaved 1F1B)."""
    from vramscope.examples import ExampleLlama

    return _llama_workload(ExampleLlama(512, 64, 4, 4, 176, 32), batch_size, device)


def llama_odd_vocab(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The same with a vocabulary of 511 tokens: over 3 ranks the embedding and the head
    split 171, 171 and 169 rows, so the last rank holds less."""
    from vramscope.examples import ExampleLlama

    return _llama_workload(ExampleLlama(511, 66, 2, 3, 171, 33), batch_size, device)


def llama_own_plan(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The small llama with its own plan: only the MLPs split (whole attention, norms,
    embedding and head), the optimizer's for-loop step (plain and DTensor parameters
    mixed)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from vramscope.examples import ExampleLlama

    plan = {
        "layers.*.mlp.gate_proj": ColwiseParallel(),
        "layers.*.mlp.up_proj": ColwiseParallel(),
        "layers.*.mlp.down_proj": RowwiseParallel(),
    }
    workload = _llama_workload(ExampleLlama(512, 64, 2, 4, 176, 32), batch_size, device, plan)
    workload.optimizer = torch.optim.AdamW(workload.model.parameters(), lr=1e-3, foreach=False)
    return workload


def llama_long(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The small llama over 256 tokens: its activations outweigh its parameters, and each of
    2 or 4 context-parallel ranks holds 64 or 32 tokens (the two halves torch's
    load balancing gives it)."""
    from vramscope.examples import ExampleLlama

    return _llama_workload(ExampleLlama(512, 64, 2, 4, 176, 256), batch_size, device)


class ExpertMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)))


class MoE(nn.Module):
    """A router and a ModuleList of expert MLPs, top-k, as people write it."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(dim, hidden) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = torch.topk(F.softmax(self.router(x), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == i)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(shape)


class MoEBlock(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.moe = MoE(dim, hidden, experts, top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe(self.norm(x))


class MoENet(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, blocks: int, experts: int, top_k: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(MoEBlock(dim, hidden, experts, top_k) for _ in range(blocks))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


MOE_TOKENS = 16


def moe(batch_size: int, device: torch.device) -> vramscope.Workload:
    """A hand-written MoE language model: vocabulary 128, width 64, 2 blocks of 8 expert
    MLPs (64 → 256 → 64) with top-2 routing, 16 tokens."""
    model = MoENet(128, 64, 256, 2, 8, 2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch():
        tokens = torch.randint(0, 128, (batch_size, MOE_TOKENS + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(model, idx, target):
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return vramscope.Workload(model=model, optimizer=opt, batch=batch, loss=loss)
