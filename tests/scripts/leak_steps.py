"""A training loop that keeps 64 MiB more every step from step 20 on, with an evaluation step
at step 30, and ends as asked (``--end normal|oom|sigterm|sigint``). It writes its own peak
of every step (``max_memory_allocated`` between two resets) to ``--peaks``, the step that was
cut short included, for the tests to hold vramscope's step entries against."""

import argparse
import json
import os
import signal

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--end", default="normal", choices=("normal", "oom", "sigterm", "sigint"))
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--peaks", required=True)
args = parser.parse_args()

device = torch.device("cuda")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if args.end == "oom":  # room for about 40 leaking steps
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated() + 3 * 2**30) / total)
peaks: list[int] = []
kept = []


def save() -> None:
    with open(args.peaks, "w") as f:
        json.dump(peaks, f)


try:
    for step in range(10_000 if args.end == "oom" else args.steps):
        torch.cuda.reset_peak_memory_stats()
        x = torch.randn(256, 1024, device=device)
        if step == 30:  # an evaluation step between training steps
            with torch.no_grad():
                model(x)
        else:
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
        if step >= 20:
            kept.append(torch.empty(64 * 2**20, dtype=torch.uint8, device=device))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated())
        if step == 45 and args.end == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        if step == 45 and args.end == "sigint":
            signal.raise_signal(signal.SIGINT)
finally:
    if len(peaks) <= step:  # the step that was cut short
        peaks.append(torch.cuda.max_memory_allocated())
    save()
