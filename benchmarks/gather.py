"""What gathering adds at the end of a torchrun job: rank 0's time from the end of its script
to the job's report, for 2 and 4 ranks, through each channel.

Every rank trains a small DDP model on the CPU (gloo) for a number of steps and meets the
others at a barrier, so the ranks end together; then each makes its report, publishes it
and rank 0 gathers them. The report says how long that took (``distributed.gather.seconds``,
the waiting for the other ranks' reports included, ``waited_s`` of it). Channels: the store
of the process group the script left initialised, torchrun's own store (the script destroyed
its group), and files only (``--gather-via files``). The target is at most 1 s.

Usage: python benchmarks/gather.py [--ranks 2 4] [--repeat 2] [--steps 200] [--out r.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[1] / "src"
SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    steps, keep_group = int(sys.argv[1]), sys.argv[2] == "keep"
    dist.init_process_group("gloo")
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    if not keep_group:
        dist.destroy_process_group()
    """
)
CHANNELS = {
    "process group store": (["--gather-via", "auto"], "keep"),
    "torchrun store": (["--gather-via", "auto"], "destroy"),
    "files": (["--gather-via", "files"], "destroy"),
}


def job(ranks: int, channel: str, steps: int, folder: Path) -> dict:
    options, group = CHANNELS[channel]
    script = folder / "train.py"
    script.write_text(SCRIPT)
    out = folder / f"job-{ranks}-{channel.replace(' ', '-')}.json"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=f"{SRC}{os.pathsep}" + os.environ.get("PYTHONPATH", ""),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        "vramscope",
        "run",
        "-q",
        *options,
        "--json",
        str(out),
        str(script),
        str(steps),
        group,
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise SystemExit(f"job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(out.read_text())
    gathered = data["distributed"]["gather"]
    assert gathered["missing"] == [] and channel in gathered["via"], gathered
    sizes = [p.stat().st_size for p in out.with_suffix(".ranks").iterdir()]
    return {
        "ranks": ranks,
        "channel": channel,
        "seconds": gathered["seconds"],
        "waited_s": gathered["waited_s"],
        "rank_report_kib": round(max(sizes) / 1024, 1),
        "steps": len(data["steps"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            for channel in CHANNELS:
                for _ in range(args.repeat):
                    row = job(ranks, channel, args.steps, Path(tmp))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    worst = max(r["seconds"] for r in rows)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    print(
        f"\ngathering: at most {worst:.3f} s over {len(rows)} jobs (target 1 s); median "
        f"{sorted(r['seconds'] for r in rows)[len(rows) // 2]:.3f} s  ({machine})"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "date": datetime.date.today().isoformat(),
                    "machine": machine,
                    "python": platform.python_version(),
                    "steps": args.steps,
                    "jobs": rows,
                    "max_seconds": worst,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
