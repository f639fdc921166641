"""What the run's journal costs a step, on the CPU: the time in its code, the step time with
and without it side by side, the bytes it writes, and how large it gets on a long run.

A small model trains under ``vramscope.track()`` in blocks of steps, alternating a block
with the journal and one without (``journal=None``), each block a fresh session; a block's
median step time is set against the blocks on either side of it, so that the machine's drift
cancels. Inside the journal blocks, the time spent in the journal's own code is added up:
the step table's observer on the training thread (encoding the stored step and writing it:
one ``write``, no ``fsync``, for the steps stored since the last write: a step stored less
than ``STEP_WRITE_GAP_S`` after it waits for the next) and the sampler thread's flushes. Then one long run with the
default limits (a compaction at 4 MiB) gives the bytes a step, the largest file and the
slowest compaction, and the time to make the report from the journal.

Every step reads here (a CPU run has no allocator to read, so no step is folded): this is
the most the journal costs. On CUDA, steps short enough to matter are mostly folded into the
step read before them and write nothing (``phase_reads.py``).

Usage: python benchmarks/journal_cost.py [--rounds 12] [--steps 200] [--long 30000] [--out f.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vramscope
from vramscope.journal import writer
from vramscope.journal.reader import read_journal
from vramscope.journal.rebuild import report_from_journal

WARMUP = 20  # a session's first steps (its one-time work) are run but not timed


class Timed:
    """Adds up the time spent inside a JournalWriter's methods, per thread role."""

    def __init__(self) -> None:
        self.observer_s = 0.0
        self.observer_calls = 0
        self.flush_s = 0.0
        self.flush_calls = 0
        self.step_flush_s = 0.0  # the sampler's writes of steps that waited (and the flush)
        self.step_flush_calls = 0
        self.compactions: list[float] = []
        self._originals = {}

    def __enter__(self) -> Timed:
        cls = writer.JournalWriter
        for name in ("on_steps", "flush", "_compact", "_flush_steps"):
            self._originals[name] = getattr(cls, name)
        timed = self

        def on_steps(self: writer.JournalWriter) -> None:
            start = time.perf_counter()
            timed._originals["on_steps"](self)
            timed.observer_s += time.perf_counter() - start
            timed.observer_calls += 1

        def flush(self: writer.JournalWriter) -> None:
            start = time.perf_counter()
            timed._originals["flush"](self)
            timed.flush_s += time.perf_counter() - start
            timed.flush_calls += 1

        def flush_steps(self: writer.JournalWriter) -> None:
            start = time.perf_counter()
            timed._originals["_flush_steps"](self)
            timed.step_flush_s += time.perf_counter() - start
            timed.step_flush_calls += 1

        def compact(self: writer.JournalWriter) -> None:
            start = time.perf_counter()
            timed._originals["_compact"](self)
            timed.compactions.append(time.perf_counter() - start)

        cls.on_steps, cls.flush, cls._compact = on_steps, flush, compact  # type: ignore[method-assign]
        cls._flush_steps = flush_steps  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(writer.JournalWriter, name, original)


class Loop:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.x, self.y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step(self) -> None:
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.model(self.x), self.y).backward()
        self.opt.step()


def block(loop: Loop, steps: int, journal: Path | None) -> list[float]:
    """Step times (seconds) of one tracked block after its warm-up."""
    times = []
    with vramscope.track(journal=journal):
        for i in range(WARMUP + steps):
            start = time.perf_counter()
            loop.step()
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
    return times


def side_by_side(rounds: int, steps: int, folder: Path) -> dict:
    loop = Loop()
    medians: list[tuple[str, float]] = []
    with Timed() as timed:
        for r in range(rounds):
            for kind in ("without", "with") if r % 2 else ("with", "without"):
                path = folder / f"r{r}.journal" if kind == "with" else None
                medians.append((kind, statistics.median(block(loop, steps, path))))
                if path is not None:
                    path.unlink()
    ratios = []  # each journal block against the mean of its neighbours without
    for i, (kind, median) in enumerate(medians):
        if kind != "with":
            continue
        around = [m for k, m in medians[max(0, i - 1) : i + 2] if k == "without"]
        ratios.append(median / statistics.fmean(around) - 1)
    step_s = statistics.median(m for k, m in medians if k == "without")
    per_step = timed.observer_s / max(1, timed.observer_calls)
    ratios.sort()
    return {
        "rounds": rounds,
        "steps_per_block": steps,
        "step_us_without": round(step_s * 1e6, 1),
        "step_us_with": round(statistics.median(m for k, m in medians if k == "with") * 1e6, 1),
        "overhead_pct": round(100 * statistics.median(ratios), 2),
        "overhead_p10_p90_pct": [
            round(100 * ratios[len(ratios) // 10], 2),
            round(100 * ratios[(9 * len(ratios)) // 10], 2),
        ],
        "journal_us_per_step_training_thread": round(per_step * 1e6, 2),
        "journal_share_of_step_pct": round(100 * per_step / step_s, 2),
        "sampler_flush_us": round(1e6 * timed.flush_s / max(1, timed.flush_calls), 1),
        "sampler_flushes": timed.flush_calls,
        # of those, the flushes that also wrote steps which waited (STEP_WRITE_GAP_S)
        "sampler_step_flush_us": round(
            1e6 * timed.step_flush_s / max(1, timed.step_flush_calls), 1
        ),
        "sampler_step_flushes": timed.step_flush_calls,
        "step_write_gap_s": writer.STEP_WRITE_GAP_S,
    }


def long_run(steps: int, folder: Path) -> dict:
    loop = Loop()
    path = folder / "long.journal"
    largest = 0
    with Timed() as timed, vramscope.track(journal=path) as session:
        start = time.perf_counter()
        for i in range(steps):
            loop.step()
            if i % 100 == 0:
                largest = max(largest, path.stat().st_size)
        seconds = time.perf_counter() - start
    del session
    size = path.stat().st_size
    start = time.perf_counter()
    report = report_from_journal(read_journal(path))
    made_s = time.perf_counter() - start
    lines = path.read_bytes().count(b"\n")
    step_line = next(
        line for line in path.read_bytes().split(b"\n") if line.startswith(b'{"k":"step"')
    )
    return {
        "steps": steps,
        "seconds": round(seconds, 1),
        "step_line_bytes": len(step_line) + 1,
        "final_bytes": size,
        "largest_bytes": max(largest, size),
        "lines": lines,
        "compactions": len(timed.compactions),
        "slowest_compaction_ms": round(1e3 * max(timed.compactions, default=0.0), 1),
        "report_from_journal_s": round(made_s, 3),
        "report_steps_counted": sum(s.count for s in report.steps),
        "report_step_entries": len(report.steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--long", type=int, default=30_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cost = side_by_side(args.rounds, args.steps, folder)
        print(json.dumps(cost), flush=True)
        long = long_run(args.long, folder)
        print(json.dumps(long), flush=True)
    result = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs",
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "torch": torch.__version__,
            "vramscope": vramscope.__version__,
            "compact_at_bytes": writer.COMPACT_AT_BYTES,
        },
        "side_by_side": cost,
        "long_run": long,
    }
    print(
        f"\njournal: {cost['journal_us_per_step_training_thread']:.1f} µs a stored step on the "
        f"training thread ({cost['journal_share_of_step_pct']:.2f} % of a "
        f"{cost['step_us_without'] / 1e3:.2f} ms CPU step); side by side "
        f"{cost['overhead_pct']:+.2f} % (p10..p90 {cost['overhead_p10_p90_pct'][0]:+.2f}.."
        f"{cost['overhead_p10_p90_pct'][1]:+.2f} %, {cost['rounds']} rounds); a sampler flush "
        f"{cost['sampler_flush_us']:.0f} µs twice a second"
    )
    print(
        f"long run: {long['steps']:,} steps, {long['step_line_bytes']} bytes a step, largest "
        f"file {long['largest_bytes'] / 2**20:.2f} MiB, {long['compactions']} compactions "
        f"(slowest {long['slowest_compaction_ms']:.0f} ms), report from it in "
        f"{long['report_from_journal_s']:.2f} s ({long['report_steps_counted']:,} steps in "
        f"{long['report_step_entries']:,} entries)  ({result['meta']['machine']}, torch "
        f"{torch.__version__})"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
