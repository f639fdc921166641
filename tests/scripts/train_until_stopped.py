"""A training loop that runs until it is stopped, as a preempted job does.

Prints ``training`` once the first step is done, so a test can send its signal then.
``--hang-in-cleanup``: its ``finally`` never returns (a cleanup stuck on a lock or a file
system), so only a second signal ends it. ``--own-handler``: the script handles SIGTERM
itself, saving a checkpoint and exiting 0.
"""

import argparse
import signal
import sys
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--hang-in-cleanup", action="store_true")
parser.add_argument("--own-handler", action="store_true")
args = parser.parse_args()

if args.own_handler:

    def checkpoint_and_exit(signum, frame):
        print("checkpoint saved", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, checkpoint_and_exit)

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
step = 0
try:
    while True:
        try:  # a script's own error handling must not swallow the stop
            x = torch.randn(32, 64, device=device)
            y = torch.randint(0, 10, (32,), device=device)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        except Exception as exc:
            print(f"step failed: {exc}", flush=True)
        step += 1
        if step == 1:
            print("training", flush=True)
finally:
    if args.hang_in_cleanup:
        print("cleaning up", flush=True)
        time.sleep(600)
