"""A small training run that dies the way it is told to, printing (flushed) what it did: its
pid and parameter bytes first, then after each optimizer step the step, the time, its RSS and
(on CUDA) the bytes allocated; "dying TIME" just before it dies."""

import argparse
import ctypes
import os
import re
import resource
import sys
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument(
    "--die",
    choices=[
        "never",
        "segfault",
        "exit",
        "memory",
        "hang",
        "hang-holding-the-gil",
        "cuda-error",
        "cuda-oom-then-killed",
    ],
    default="never",
)
parser.add_argument("--at", type=int, default=5, help="the step after which it dies")
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--leak-mib", type=int, default=1, help="memory kept at each step")
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def dying() -> None:
    print(f"dying {time.time():.6f}", flush=True)


def die() -> None:
    if args.die == "segfault":
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no core file of it
        dying()
        ctypes.string_at(0)
    elif args.die == "exit":
        dying()
        os._exit(5)
    elif args.die == "memory":
        with open("/proc/self/statm") as f:
            limit = int(f.read().split()[0]) * PAGE + 512 * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        dying()
        while True:  # until the limit: torch's allocator raises, or Python's MemoryError
            kept.append(torch.ones(16 * 2**20, dtype=torch.uint8, device=device))
    elif args.die == "hang":  # a step that never ends (a signal still reaches Python)
        print("hanging", flush=True)
        time.sleep(3600)
    elif args.die == "hang-holding-the-gil":  # native code that never lets Python run
        # a moment with the interpreter lock free first: the timeline samples the last
        # step's memory, written twice a second (nothing is sampled once the hang holds it)
        time.sleep(0.8)
        print("hanging", flush=True)
        re.match(r"(a+)+$", "a" * 64 + "b")
    elif args.die == "cuda-error":  # an index out of range: a device-side assert
        dying()
        torch.zeros(4, device=device)[torch.tensor([10], device=device)]
        torch.cuda.synchronize()
    elif args.die == "cuda-oom-then-killed":  # a real OOM, caught; then the launcher kills it
        try:
            while True:
                kept.append(torch.empty(8 * 2**30, dtype=torch.uint8, device=device))
        except torch.cuda.OutOfMemoryError:
            print(f"oom {torch.cuda.max_memory_allocated()}", flush=True)
        time.sleep(1.5)  # holding it a moment: the timeline samples it, written twice a second
        dying()
        os.kill(os.getpid(), 9)


torch.manual_seed(0)
device = torch.device(args.device)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
parameters = sum(p.numel() * p.element_size() for p in model.parameters())
print(f"pid {os.getpid()} parameters {parameters}", flush=True)
kept = []
for step in range(args.steps):
    x, y = torch.randn(32, 64, device=device), torch.randint(0, 10, (32,), device=device)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if step == args.at and args.die.startswith("hang"):
        die()
    opt.step()
    kept.append(torch.ones(args.leak_mib * 2**20, dtype=torch.uint8, device=device))
    allocated = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    print(f"done {step} {time.time():.6f} {rss()} {allocated}", flush=True)
    if step == args.at:
        die()
    time.sleep(0.02)
sys.exit(0)
