"""A frozen backbone and a trained head: the frozen weights have no gradient and no state."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 128 if small else 2048
backbone = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
head = nn.Linear(width, 10)
model = nn.Sequential(backbone, head).to(device)
for p in backbone.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
for _ in range(3 if small else 8):
    x = torch.randn(128, width, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"loss {loss.item():.4f}")
