"""A training loop that keeps 64 MiB more every step from step 20 on, with an evaluation step
at step 30, and ends as asked (``--end normal|oom|sigterm|sigint``). It writes its own peak
of every step (``max_memory_allocated`` between two resets) to ``--peaks``, the step that was
cut short included, for the tests to hold vramscope's step entries against.

Its steps are bounded as vramscope bounds them (docs/tracking.md): a training step ends where
its optimizer step ends, and what follows (the 64 MiB kept, the next batch) is the next
step's once that begins (here, with its forward); an evaluation step ends where the next
step's forward begins; the end of the run after an optimizer step is that step's."""

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
ended: int | None = None  # the open step's peak where its optimizer step ended
started = False


def close() -> int:
    """The peak since the last reset; resets it."""
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return peak


def begin() -> None:
    """A step begins (its forward): the step before ended where its optimizer step ended, or
    here (an evaluation step)."""
    global ended, started
    if started:
        peaks.append(ended if ended is not None else close())
    else:
        close()  # what came before the first step is in no step
    started, ended = True, None


def save() -> None:
    with open(args.peaks, "w") as f:
        json.dump(peaks, f)


try:
    for step in range(10_000 if args.end == "oom" else args.steps):
        x = torch.randn(256, 1024, device=device)
        if step == 30:  # an evaluation step between training steps
            begin()
            with torch.no_grad():
                model(x)
        else:
            opt.zero_grad(set_to_none=True)
            begin()
            model(x).square().mean().backward()
            opt.step()
            ended = close()
        if step >= 20:
            kept.append(torch.empty(64 * 2**20, dtype=torch.uint8, device=device))
        if step == 45 and args.end == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        if step == 45 and args.end == "sigint":
            signal.raise_signal(signal.SIGINT)
finally:
    if ended is not None:  # the end came after an optimizer step: that step's
        peaks.append(max(ended, close()))
    elif started:  # the step that was cut short
        peaks.append(close())
    save()
