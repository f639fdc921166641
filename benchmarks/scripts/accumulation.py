"""Gradient accumulation: four micro-batches per optimizer step, gradients set to None."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 128 if small else 2048
model = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
accumulate = 4
for _ in range(3 if small else 6):
    for _micro in range(accumulate):
        x = torch.randn(128, width, device=device)
        y = torch.randint(0, 10, (128,), device=device)
        loss = nn.functional.cross_entropy(model(x), y) / accumulate
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(f"loss {loss.item():.4f}")
