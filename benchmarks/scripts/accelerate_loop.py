"""An Accelerate training loop, as its examples write one: model, optimizer and data loader
through ``Accelerator.prepare``, ``accelerator.backward`` and ``accelerator.accumulate``
(two micro-batches an optimizer step: the prepared optimizer skips the others)."""

import sys

import torch
from accelerate import Accelerator
from torch import nn

small = "--small" in sys.argv
accelerator = Accelerator(cpu=not torch.cuda.is_available(), gradient_accumulation_steps=2)
torch.manual_seed(0)
width = 128 if small else 2048
model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(512, width), torch.randint(0, 10, (512,)))
loader = torch.utils.data.DataLoader(data, batch_size=64)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, (x, y) in enumerate(loader):
    with accelerator.accumulate(model):
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    if small and step == 5:
        break
print(f"loss {loss.item():.4f}")
