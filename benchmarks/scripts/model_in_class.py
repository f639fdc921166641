"""A trainer class that owns the model and optimizer; a batch-norm model (buffers)."""

import sys

import torch
from torch import nn


class Trainer:
    def __init__(self, small: bool) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.width = 128 if small else 2048
        self.model = nn.Sequential(
            nn.Linear(self.width, self.width),
            nn.BatchNorm1d(self.width),
            nn.ReLU(),
            nn.Linear(self.width, 10),
        ).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def train_step(self) -> float:
        x = torch.randn(64, self.width, device=self.device)
        y = torch.randint(0, 10, (64,), device=self.device)
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def fit(self, steps: int) -> None:
        for _ in range(steps):
            loss = self.train_step()
        print(f"loss {loss:.4f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    small = "--small" in sys.argv
    Trainer(small).fit(3 if small else 8)
