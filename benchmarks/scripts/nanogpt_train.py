"""A nanoGPT-shaped character-level training script with its own iteration timer.

The model is the character-level Shakespeare configuration of nanoGPT (6 layers, 6 heads,
width 384, context 256, 65 symbols, dropout 0.2, no biases, tied embeddings), written here
from its description; the loop is the shape of nanoGPT's ``train.py``: batches cut from a
token array in host memory, copied to the device from pinned memory while the step runs,
bf16 autocast, fused AdamW with and without weight decay by parameter shape, a warm-up and
cosine learning rate, gradient clipping, gradients set to None. Each iteration prints
``iter N: loss L, time T ms`` (the time from the previous iteration's end to this one's,
as nanoGPT's log does; the loss is read every iteration, which waits for the device).

Usage: python benchmarks/scripts/nanogpt_train.py [--iters 300] [--batch-size 64]
       [--compile] [--small] [--infer]

The model and the step are importable (``benchmarks/overhead.py`` times the same step).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.2
    bias: bool = False


SMALL = GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.0)


class LayerNorm(nn.Module):
    """Layer normalization whose bias can be left out (torch's LayerNorm always has one
    before torch 2.1)."""

    def __init__(self, width: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class SelfAttention(nn.Module):
    """Causal multi-head attention through scaled_dot_product_attention."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.out = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.out_drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True
        )
        return self.out_drop(self.out(y.transpose(1, 2).contiguous().view(batch, length, width)))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(self.act(self.up(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm1 = LayerNorm(cfg.n_embd, cfg.bias)
        self.attn = SelfAttention(cfg)
        self.norm2 = LayerNorm(cfg.n_embd, cfg.bias)
        self.ff = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.positions = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = LayerNorm(cfg.n_embd, cfg.bias)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.tokens.weight = self.head.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # residual projections scaled by depth
            if name.endswith(("attn.out.weight", "ff.down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tokens(idx) + self.positions(pos))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        if targets is None:  # generation: only the last position's logits
            return self.head(x[:, [-1], :]), None
        logits = self.head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_optimizer(model: nn.Module, device_type: str, lr: float = 1e-3) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), fused=device_type == "cuda")


class Batches:
    """Random windows of a token array in host memory, on the device (pinned, non-blocking)."""

    def __init__(self, cfg: GPTConfig, batch_size: int, device: torch.device, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.data = rng.integers(0, cfg.vocab_size, 1_000_000, dtype=np.uint16)
        self.block, self.batch_size, self.device = cfg.block_size, batch_size, device
        self.rng = rng

    def __call__(self, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        block = length or self.block
        ix = self.rng.integers(0, len(self.data) - block - 1, self.batch_size)
        x = torch.stack([torch.from_numpy(self.data[i : i + block].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(self.data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix]
        )
        if self.device.type == "cuda":
            return (
                x.pin_memory().to(self.device, non_blocking=True),
                y.pin_memory().to(self.device, non_blocking=True),
            )
        return x.to(self.device), y.to(self.device)


def learning_rate(it: int, warmup: int = 100, decay: int = 5000, top: float = 1e-3) -> float:
    if it < warmup:
        return top * (it + 1) / (warmup + 1)
    if it > decay:
        return top / 10
    ratio = (it - warmup) / (decay - warmup)
    return top / 10 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (top - top / 10)


class TrainStep:
    """One iteration of the loop: forward on the batch fetched before, the next batch fetched
    while the device works, backward, clipping, the optimizer step, gradients set to None.
    ``infer``: a forward of the batch under ``torch.no_grad()`` in eval mode instead."""

    def __init__(
        self,
        cfg: GPTConfig,
        batch_size: int,
        device: torch.device,
        compile: bool = False,
        infer: bool = False,
        infer_length: int | None = None,
    ) -> None:
        torch.manual_seed(0)
        self.device = device
        self.model = GPT(cfg).to(device)
        self.optimizer = None if infer else make_optimizer(self.model, device.type)
        self.infer = infer
        self.infer_length = infer_length
        if infer:
            self.model.eval()
        self.call = torch.compile(self.model) if compile else self.model
        self.batches = Batches(cfg, batch_size, device)
        self.ctx = (
            torch.autocast(device_type="cuda", dtype=torch.bfloat16)
            if device.type == "cuda"
            else contextlib.nullcontext()
        )
        # nanoGPT keeps a GradScaler, disabled unless float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=False)
        self.iteration = 0
        self.x, self.y = self.batches(infer_length)
        self.loss: torch.Tensor | None = None

    def __call__(self) -> None:
        if self.infer:
            with torch.no_grad(), self.ctx:
                self.loss = self.call(self.x)[0]
            self.x, self.y = self.batches(self.infer_length)
            return
        assert self.optimizer is not None
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.iteration)
        with self.ctx:
            _, loss = self.call(self.x, self.y)
        self.x, self.y = self.batches()  # the next batch, while the device works
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss = loss
        self.iteration += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--infer", action="store_true", help="batch inference of 64 tokens")
    parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke runs)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    cfg = SMALL if args.small else GPTConfig()
    step = TrainStep(
        cfg,
        args.batch_size,
        device,
        compile=args.compile,
        infer=args.infer,
        infer_length=min(64, cfg.block_size) if args.infer else None,
    )
    t0 = time.perf_counter()
    for it in range(args.iters):
        step()
        loss = step.loss.float().mean().item()  # waits for the device, as nanoGPT's log does
        t1 = time.perf_counter()
        print(f"iter {it}: loss {loss:.4f}, time {(t1 - t0) * 1000:.2f}ms", flush=True)
        t0 = t1


if __name__ == "__main__":
    main()
