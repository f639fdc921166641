"""The PyTorch tutorials' way: the model and optimizer at the top level of the script."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 128 if small else 2048
batches = 2 if small else 12

data = TensorDataset(torch.randn(batches * 64, width), torch.randint(0, 10, (batches * 64,)))
loader = DataLoader(data, batch_size=64)
model = nn.Sequential(
    nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
).to(device)
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(2):
    for X, y in loader:
        X, y = X.to(device), y.to(device)
        pred = model(X)
        loss = loss_fn(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"epoch {epoch}: loss {loss.item():.4f}")
