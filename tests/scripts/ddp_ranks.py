"""A small DDP training script on the CPU (gloo), as a user writes it, with ways for one
rank to differ: hold more memory, fail, be killed, or hang until the job's report exists."""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--heavy-rank", type=int, default=-1, help="this rank keeps 160 MiB more")
parser.add_argument("--fail-rank", type=int, default=-1, help="this rank exits with code 3")
parser.add_argument("--kill-rank", type=int, default=-1, help="this rank is killed (SIGKILL)")
parser.add_argument("--hang-rank", type=int, default=-1, help="this rank waits for --hang-until")
parser.add_argument("--hang-until", help="a file whose existence ends the hang")
parser.add_argument("--keep-group", action="store_true", help="leave the process group alive")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
kept = None
if rank == args.heavy_rank:
    kept = torch.ones(160 * 1024 * 1024 // 4)  # touched: 160 MiB resident (over 10 % of a
    # process that loaded a CUDA build of torch, about 0.5 GiB before it)
    time.sleep(0.3)  # held while the host memory is sampled (every 0.1 s)
for step in range(args.steps):
    x, y = torch.randn(16, 64), torch.randint(0, 8, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if rank == args.fail_rank and step == 1:
        print(f"rank {rank} gives up", flush=True)
        sys.exit(3)
    if rank == args.kill_rank and step == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
if not args.keep_group:
    dist.barrier()
    dist.destroy_process_group()
if rank == args.hang_rank:
    while not os.path.exists(args.hang_until):
        time.sleep(0.05)
