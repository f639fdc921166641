"""DistributedDataParallel in one process (world size 1): gradient buckets beside the
gradients.

Without a synchronize after the backward, this loop's peak from step 1 on depends on the
host's timing against the GPU's: measured on an NVIDIA H200 (torch 2.11), identical plain
runs peak at 162.52 MiB or at 178.61 MiB per step (a gradient-sized block more: whether the
NCCL stream's use of a block has been seen done when the optimizer step allocates). A
process timed differently (any instrumentation, the oracle's own) may land on either. The
synchronize makes every run of it land on the same peak, so that two processes can be
compared."""

import os
import socket
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

small = "--small" in sys.argv
cuda = torch.cuda.is_available()
device = "cuda:0" if cuda else "cpu"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
if "RANK" not in os.environ:  # not under torchrun: a free port of our own, each run
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
torch.manual_seed(0)
width = 128 if small else 2048
net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
model = DDP(net, device_ids=[0] if cuda else None)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(3 if small else 8):
    x = torch.randn(128, width, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cuda:
        torch.cuda.synchronize()  # the peak independent of the host's timing (see above)
    optimizer.step()
print(f"loss {loss.item():.4f}")
dist.destroy_process_group()
