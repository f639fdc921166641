"""The built-in example workloads, pure torch: ``example:cnn``, ``example:gpt`` and
``example:llama``.

Small enough to run on a laptop CPU in seconds, shaped like the real thing (a residual
conv net with BatchNorm; a GPT with causal scaled-dot-product attention and tied
embeddings; a Llama with RMSNorm, separate query/key/value projections and a gated MLP,
written so that tensor parallel can split its heads) so that every part of a report has
something to show.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vramscope.contract import Workload


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(out)))


class ExampleCNN(nn.Module):
    """A small ResNet: stem, three stages of residual blocks, pooling, classifier."""

    def __init__(self, num_classes: int = 100, width: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        stages = []
        channels = width
        for i in range(3):
            if i:
                stages.append(nn.Conv2d(channels, channels * 2, 3, stride=2, padding=1, bias=False))
                channels *= 2
            stages.extend(ResidualBlock(channels) for _ in range(blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_cnn(batch_size: int, device: torch.device) -> Workload:
    """``example:cnn``: ExampleCNN on 64×64 images, SGD with momentum."""
    model = ExampleCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator(device="cpu").manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, 64, 64, generator=generator).to(device)
        y = torch.randint(0, 100, (batch_size,), generator=generator).to(device)
        return x, y

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    return Workload(model=model, optimizer=opt, batch=batch, loss=loss, name="example:cnn")


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ExampleGPT(nn.Module):
    """A GPT-2-shaped language model (pre-norm blocks, tied input/output embeddings)."""

    def __init__(
        self, vocab: int = 8192, dim: int = 256, layers: int = 4, heads: int = 4, seq: int = 256
    ) -> None:
        super().__init__()
        self.seq = seq
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied, as in GPT-2
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self.gradient_checkpointing = True

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))


def _language_model(model: nn.Module, device: torch.device, batch_size: int, name: str) -> Workload:
    """A causal language model on random tokens (vocabulary 8192, ``model.seq`` long), AdamW."""
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator(device="cpu").manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, 8192, (batch_size, model.seq + 1), generator=generator).to(device)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(model: nn.Module, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return Workload(model=model, optimizer=opt, batch=batch, loss=loss, name=name)


def build_gpt(batch_size: int, device: torch.device) -> Workload:
    """``example:gpt``: ExampleGPT on random tokens, AdamW."""
    return _language_model(ExampleGPT(), device, batch_size, "example:gpt")


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallel each rank projects its share of them
        q, k, v = (
            proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class LlamaMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(dim)
        self.self_attn = LlamaAttention(dim, heads)
        self.post_attention_layernorm = nn.RMSNorm(dim)
        self.mlp = LlamaMLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class ExampleLlama(nn.Module):
    """A Llama-shaped language model (pre-norm RMSNorm layers, SwiGLU MLP, untied head)."""

    def __init__(
        self,
        vocab: int = 8192,
        dim: int = 512,
        layers: int = 4,
        heads: int = 8,
        hidden: int = 1408,
        seq: int = 256,
    ) -> None:
        super().__init__()
        self.seq = seq
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaLayer(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def build_llama(batch_size: int, device: torch.device) -> Workload:
    """``example:llama``: ExampleLlama on random tokens, AdamW."""
    return _language_model(ExampleLlama(), device, batch_size, "example:llama")


BUILDERS = {"cnn": build_cnn, "gpt": build_gpt, "llama": build_llama}
# Batch sizes the demo uses: small on a CPU, a real load on a GPU.
DEMO_BATCH = {"cnn": {"cpu": 16, "cuda": 256}, "gpt": {"cpu": 4, "cuda": 32}}
