"""A model compiled with torch.compile (``--backend NAME``; inductor by default)."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "inductor"
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 128 if small else 2048
model = nn.Sequential(
    nn.Linear(width, 2 * width),
    nn.GELU(),
    nn.Linear(2 * width, width),
    nn.LayerNorm(width),
    nn.Linear(width, 10),
).to(device)
compiled = torch.compile(model, backend=backend)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3 if small else 8):
    x = torch.randn(256, width, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    loss = nn.functional.cross_entropy(compiled(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(f"loss {loss.item():.4f}")
