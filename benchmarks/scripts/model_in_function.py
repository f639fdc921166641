"""The model, optimizer and loop inside ``main()``."""

import sys

import torch
from torch import nn


def main() -> None:
    small = "--small" in sys.argv
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    width = 128 if small else 2048
    model = nn.Sequential(
        nn.Linear(width, width),
        nn.GELU(),
        nn.Linear(width, width),
        nn.GELU(),
        nn.Linear(width, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3 if small else 8):
        x = torch.randn(64, width, device=device)
        y = torch.randint(0, 10, (64,), device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
