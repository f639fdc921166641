"""Gradients kept between steps: ``zero_grad(set_to_none=False)`` zeroes them in place."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 128 if small else 2048
model = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width)).to(device)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
for _ in range(3 if small else 8):
    optimizer.zero_grad(set_to_none=False)
    x = torch.randn(256, width, device=device)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
