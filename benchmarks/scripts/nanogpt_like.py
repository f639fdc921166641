"""A nanoGPT-style loop: a small GPT, batches sampled from a token tensor, the next batch
fetched during the step, AdamW, gradient clipping, gradients set to None."""

import math
import sys

import torch
from torch import nn
from torch.nn import functional as F

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
n_layer, n_head, n_embd, block, vocab, batch = (
    (2, 2, 64, 32, 256, 4) if small else (6, 6, 384, 256, 4096, 32)
)
ctx = (
    torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    if device == "cuda"
    else torch.autocast(device_type="cpu", enabled=False)
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # tied

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


data = torch.randint(0, vocab, (100_000,))


def get_batch():
    ix = torch.randint(len(data) - block, (batch,))
    x = torch.stack([data[i : i + block] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
    return x.to(device), y.to(device)


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=device == "cuda")
X, Y = get_batch()
for it in range(3 if small else 10):
    lr = 6e-4 * 0.5 * (1 + math.cos(math.pi * it / 10))
    for group in optimizer.param_groups:
        group["lr"] = lr
    with ctx:
        loss = model(X, Y)
    X, Y = get_batch()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(f"loss {loss.item():.4f}")
