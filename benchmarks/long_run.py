"""vramscope's own host memory over a long run: does it stay flat at 100,000 steps?

A tiny model trains on the CPU for N steps under ``vramscope.track()``, a DataLoader giving
epochs of 1,000 steps (steps, phases and epochs all found by the hooks). tracemalloc counts
the Python memory allocated by vramscope's own files, read at checkpoints; the process's RSS
is read beside it, and the same loop runs untracked first for the RSS baseline. At the end
the report is made and its JSON size printed.

Usage: python benchmarks/long_run.py [--steps 100000] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vramscope

OWN = str(Path(vramscope.__file__).resolve().parent)
MIB = 2**20


def own_bytes() -> int:
    """Python memory allocated by vramscope's own code and still held."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, OWN + "/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def loop(steps: int, checkpoints: list[int], on_checkpoint) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(1000, 8), torch.randn(1000, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    done = 0
    while done < steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done in checkpoints:
                on_checkpoint(done)
            if done >= steps:
                break


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoints = [c for c in (1_000, 5_000, 10_000, 25_000, 50_000, 100_000) if c <= args.steps]
    checkpoints.append(args.steps) if args.steps not in checkpoints else None
    process = psutil.Process()

    baseline: dict[int, int] = {}
    start = time.perf_counter()
    loop(args.steps, checkpoints, lambda n: baseline.__setitem__(n, process.memory_info().rss))
    untracked_s = time.perf_counter() - start

    rows: list[dict] = []
    tracemalloc.start()
    start = time.perf_counter()
    with vramscope.track(name="long-run") as session:

        def checkpoint(n: int) -> None:
            gc.collect()
            rows.append(
                {
                    "steps": n,
                    "vramscope_python_mib": round(own_bytes() / MIB, 3),
                    "rss_mib": round(process.memory_info().rss / MIB, 1),
                    "untracked_rss_mib": round(baseline.get(n, 0) / MIB, 1),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)

        loop(args.steps, checkpoints, checkpoint)
    tracked_s = time.perf_counter() - start
    report = session.report()
    held_after_report = own_bytes()
    tracemalloc.stop()
    size = len(report.to_json())
    result = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "vramscope": vramscope.__version__,
        },
        "steps": args.steps,
        "checkpoints": rows,
        "report_steps_entries": len(report.steps),
        "report_steps_counted": sum(s.count for s in report.steps),
        "report_epochs": len(report.epochs),
        "report_json_bytes": size,
        "vramscope_python_after_report_mib": round(held_after_report / MIB, 3),
        "untracked_seconds": round(untracked_s, 1),
        "tracked_seconds_with_tracemalloc": round(tracked_s, 1),
    }
    first, last = rows[0], rows[-1]
    growth = last["vramscope_python_mib"] - first["vramscope_python_mib"]
    print(
        f"\nvramscope's own Python memory: {first['vramscope_python_mib']:.2f} MiB at "
        f"{first['steps']:,} steps, {last['vramscope_python_mib']:.2f} MiB at {last['steps']:,} "
        f"(+{growth:.2f} MiB); RSS {first['rss_mib']:.0f} -> {last['rss_mib']:.0f} MiB "
        f"(untracked {first['untracked_rss_mib']:.0f} -> {last['untracked_rss_mib']:.0f})"
    )
    print(
        f"report: {result['report_steps_entries']} step entries for "
        f"{result['report_steps_counted']:,} steps, {result['report_epochs']} epochs, "
        f"{size / MIB:.1f} MiB of JSON  ({result['meta']['machine']}, torch {torch.__version__})"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
