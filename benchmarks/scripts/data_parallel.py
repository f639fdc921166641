"""A model wrapped in nn.DataParallel (one device)."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 128 if small else 2048
net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
model = nn.DataParallel(net, device_ids=[0] if device == "cuda" else None)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(3 if small else 8):
    x = torch.randn(128, width, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
