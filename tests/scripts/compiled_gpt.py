"""A small GPT trained the way today's scripts do it: compiled, evaluated under no_grad first.

Prints one JSON line at the end: the losses, and dynamo's counters (frames compiled, graphs,
graph breaks), so a run under vramscope can be compared with a plain run.

--compile model   model = torch.compile(model)             (the default)
--compile method  model.compile()
--compile step    the whole training step is a compiled function
--compile none    eager
--track           the loop runs inside vramscope.track() started after compiling and warming
"""

import argparse
import json
import math

import torch
from torch import nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--compile", choices=["model", "method", "step", "none"], default="model")
parser.add_argument("--backend", default="aot_eager")
parser.add_argument("--mode", default=None, help="torch.compile mode (inductor)")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--track", action="store_true")
parser.add_argument("--detail", default="default")
parser.add_argument("--json", default=None, help="with --track: write the report here")
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
VOCAB, WIDTH, HEADS, LAYERS, SEQ = 96, 32, 4, 1, 16


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(0.0)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2 does

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


model = GPT().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
options = {"backend": args.backend}
if args.mode:
    options["mode"] = args.mode
if args.compile == "model":
    model = torch.compile(model, **options)
elif args.compile == "method":
    model.compile(**options)
generator = torch.Generator().manual_seed(1)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, VOCAB, (8, SEQ), generator=generator).to(device)
    return x, torch.roll(x, -1, dims=1)


@torch.no_grad()
def evaluate() -> float:
    model.eval()
    x, y = batch()
    loss = model(x, y).item()
    model.train()
    return loss


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = model(x, y) / args.accumulate
    loss.backward()
    return loss


if args.compile == "step":
    train_step = torch.compile(train_step, **options)

losses = [evaluate()]  # the first call of the compiled model comes under no_grad
session = None
if args.track:
    import vramscope

    session = vramscope.track(detail=args.detail).__enter__()
for _ in range(args.steps):
    total = 0.0
    for _ in range(args.accumulate):
        total += train_step(*batch()).item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(total)
losses.append(evaluate())
if session is not None:
    session.__exit__(None, None, None)
    if args.json:
        session.report().save(args.json)

from torch._dynamo.utils import counters  # noqa: E402

result = {
    "losses": [round(v, 6) if math.isfinite(v) else None for v in losses],
    "frames": dict(counters["frames"]),
    "graphs": counters["stats"].get("unique_graphs", 0),
    "graph_breaks": sum(counters["graph_break"].values()),
}
if device.type == "cuda":
    result["max_allocated"] = torch.cuda.max_memory_allocated()
    result["max_reserved"] = torch.cuda.max_memory_reserved()
print("RESULT " + json.dumps(result, sort_keys=True))
