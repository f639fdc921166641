"""A leak: every step keeps its logits (with their graph) in a list, so memory grows each step
until the device runs out (on CUDA the script caps itself at ``--cap-gib``; on the CPU it
stops at step 12 with a MemoryError)."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
cap_gib = float(sys.argv[sys.argv.index("--cap-gib") + 1]) if "--cap-gib" in sys.argv else 40.0
if device == "cuda":
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total))
torch.manual_seed(0)
width, batch, vocab = (64, 16, 256) if small else (1024, 1024, 256 * 1024)  # 1 GiB of logits
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, vocab)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
history = []
for step in range(10_000):
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, vocab, (batch,), device=device)
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    history.append(logits)  # kept for "metrics": the leak
    if device == "cpu" and step == 11:
        raise MemoryError("out of memory (the CPU run stops here)")
