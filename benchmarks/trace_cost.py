"""What a step pays for `--detail modules` on short steps, taken apart (needs a CUDA GPU).

For the short-step workloads of ``overhead_methods.py`` (a 10.7 M GPT: training at batch 64, batch-1
inference, the compiled training), in one process, blocks of 30 steps interleaved (the
order rotated per round), each step timed to a synchronize:

- ``base``: no tracking;
- ``default``: ``vramscope.track()``;
- ``modules``: ``track(detail="modules")`` on its schedule; its steps after the 10th are
  split into those with markers and those without (``modules-split``);
- ``modules-first3``: markers in the first 3 steps only (``module_steps`` huge);
- ``hist``: no vramscope, only ``torch.cuda.memory._record_memory_history(context=None)``,
  the allocator's trace that ``--detail modules`` records.

Each variant's median step after the 10th, against ``base``'s; plus the trace entries (allocs
and frees) per step. Usage: ``python benchmarks/trace_cost.py OUT.json``.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vramscope
from overhead import char_gpt, timed_steps
from overhead_parts import history_only
from vramscope.tracking.marking import expand
from vramscope.workload import StepRunner

VARIANTS = ["base", "default", "modules", "modules-first3", "hist"]
WORKLOADS: list[tuple[str, Callable, int]] = [
    ("chargpt-b64-bf16", char_gpt(), 64),
    ("chargpt-infer-b1-64tok", char_gpt(seq=64, training=False), 1),
    ("chargpt-b64-bf16-compiled", char_gpt(compiled=True), 64),
]
SETTLED = 10  # steps of each block not compared (a session's first steps and calibration)


def context(variant: str) -> Any:
    if variant == "default":
        return vramscope.track(name="bench")
    if variant == "modules":
        return vramscope.track(name="bench", detail="modules")
    if variant == "modules-first3":
        return vramscope.track(name="bench", detail="modules", module_steps=10**6)
    return history_only()


def block(runner: StepRunner, variant: str, steps: int = 30) -> tuple[list[float], set[int]]:
    """Step times of one block, and (``modules``) the steps that carried markers."""
    if variant == "base":
        return timed_steps(runner, steps, warmup=0), set()
    with context(variant) as session:
        times = timed_steps(runner, steps, warmup=0)
    if not variant.startswith("modules"):
        return times, set()
    schedule = session.report().extra.get("attribution", {}).get("module_steps") or {}
    return times, expand(schedule.get("marked_steps", []))


def measure(builder: Callable, batch: int, rounds: int = 6) -> dict[str, Any]:
    runner = StepRunner(builder(batch, torch.device("cuda")), torch.device("cuda"))
    for _ in range(5):
        runner()
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    marked, unmarked = [], []
    for r in range(rounds):
        for variant in VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]:
            times, marks = block(runner, variant)
            per[variant] += times[SETTLED:]
            if variant == "modules":
                for i, t in enumerate(times[SETTLED:], start=SETTLED):
                    (marked if i in marks else unmarked).append(t)
    base = statistics.median(per["base"])
    out: dict[str, Any] = {
        v: {
            "settled_median_ms": round(1000 * statistics.median(per[v]), 3),
            "vs_base_pct": round(100 * (statistics.median(per[v]) / base - 1), 2),
        }
        for v in VARIANTS
    }
    out["modules-split"] = {
        "marked_n": len(marked),
        "unmarked_n": len(unmarked),
        "marked_ms": round(1000 * statistics.median(marked), 3) if marked else None,
        "unmarked_ms": round(1000 * statistics.median(unmarked), 3) if unmarked else None,
    }
    with history_only():
        for _ in range(3):
            runner()
        torch.cuda.synchronize()
        entries = len(torch.cuda.memory._snapshot()["device_traces"][0])
    out["trace_entries_per_step"] = entries / 3
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("trace_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2
    results = {}
    for name, builder, batch in WORKLOADS:
        results[name] = measure(builder, batch)
        print(name, json.dumps(results[name]), flush=True)
        torch.cuda.empty_cache()  # a benchmark: each workload starts from nothing
    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
