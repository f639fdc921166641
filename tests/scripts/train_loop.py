"""A plain training script, as a user writes it: DataLoader, epochs, a loss printed per epoch."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batches", type=int, default=4)
parser.add_argument("--fail-at", type=int, default=-1, help="raise in this step")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--leak", action="store_true", help="keep every loss with its graph")
parser.add_argument("--oom", action="store_true", help="allocate far more than the device has")
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        h = self.body(x)
        if args.oom:
            h = h + torch.empty(1 << 46, device=x.device, dtype=torch.uint8).sum()
        return self.head(h)


model = Net().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(args.batches * 32, 64), torch.randint(0, 10, (args.batches * 32,)))
loader = DataLoader(data, batch_size=32, shuffle=False)
kept = []
step = 0
for epoch in range(args.epochs):
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if args.leak:
            kept.append(torch.randn(512, 1024, device=device))  # 2 MiB kept per step
        if step == args.fail_at:
            raise RuntimeError("failing on purpose")
        total += loss.item()
        step += 1
    print(f"epoch {epoch} loss {total / args.batches:.6f}")
raise SystemExit(args.exit_code)
