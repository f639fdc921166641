"""Accuracy of --detail modules against MemTracker, on the same step, in one process.

For each workload: one warm step, then the same step once under MemTracker (real tensors)
and once under ``vramscope.track(detail="modules")``, with max_memory_allocated read
around each. Compared where both measure the same thing: the peak, the parameters,
buffers, gradients and optimizer state at the peak, the rest of the peak (MemTracker's
activations + temporaries + other; ours activations + temporaries + other), and per module
(depth <= 2) parameters, buffers and the peak allocated while the module ran (MemTracker's
local_peak). Target: within 2%. A workload that fails prints an error row and the run goes on.

Usage: python benchmarks/attribution_accuracy.py [--out results.json] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import vramscope
from overhead import mlp, with_precision
from vramscope.examples import build_gpt
from vramscope.sources import nvml
from vramscope.workload import StepRunner
from vramscope.zoo import hf_builder, torchvision_builder

WORKLOADS: dict[str, tuple[Callable, int]] = {
    "mlp-4096x8": (mlp, 512),
    "example-gpt": (build_gpt, 8),
    "resnet50-fp32": (torchvision_builder("resnet50@sgdm"), 32),
    "gpt2-seq512-bf16-mixed": (with_precision(hf_builder("gpt2/seq=512"), "bf16-mixed"), 4),
}
TOLERANCE = 0.02


def _err(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None:
        return None
    if theirs == 0:
        return 0.0 if ours == 0 else None
    return round((ours - theirs) / theirs, 4)


def memtracker_step(runner: StepRunner) -> dict:
    from torch.distributed._tools.mem_tracker import MemTracker

    w = runner.workload
    tracker = MemTracker()
    tracker.track_external(w.model, *([w.optimizer] if w.optimizer else []))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with tracker:
        runner()
    torch.cuda.synchronize()
    device = torch.device("cuda", torch.cuda.current_device())
    peak = tracker.get_tracker_snapshot("peak")
    snap = next((v for k, v in peak.items() if torch.device(k) == device), {})
    modules = {}
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn.split(".", 1)[1] if "." in stats.mod_fqn else ""
        local = next((v for k, v in stats.local_peak.items() if torch.device(k) == device), None)
        modules[fqn] = {
            "parameters": getattr(stats, "parameter_mem", None),
            "buffers": getattr(stats, "buffer_mem", None),
            "local_peak": local,
        }
    return {
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "peak": snap,
        "modules": modules,
    }


def vramscope_step(runner: StepRunner) -> dict:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with vramscope.track(detail="modules") as session:
        runner()
    torch.cuda.synchronize()
    expected = torch.cuda.max_memory_allocated()
    report = session.report()
    return {
        "max_memory_allocated": expected,
        "attribution": report.extra.get("attribution", {}),
        "categories": report.extra.get("attribution", {}).get("categories", {}),
        "modules": {m["name"]: m for m in report.modules},
        "notes": report.extra.get("attribution_notes", []),
    }


def compare(name: str, builder: Callable, batch: int) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(0)
    w = builder(batch, device)
    runner = StepRunner(w, device)
    runner()  # warm: optimizer state exists in both measured steps
    ours = vramscope_step(runner)
    theirs = memtracker_step(runner)
    ours_again = vramscope_step(runner)  # the same step after MemTracker: should not move
    cats = ours["categories"]
    snap = theirs["peak"]

    def mt(key: str) -> int:
        return int(snap.get(key, 0))

    rows = {
        "peak (vs max_memory_allocated)": (
            ours["attribution"].get("peak_bytes"),
            ours["max_memory_allocated"],
        ),
        "peak (vs MemTracker total)": (ours["attribution"].get("peak_bytes"), mt("Total")),
        "parameters": (cats.get("parameters"), mt("Parameter")),
        "buffers": (cats.get("buffers"), mt("Buffer")),
        "gradients": (cats.get("gradients"), mt("Gradient")),
        "optimizer_state": (cats.get("optimizer_state"), mt("Optstate")),
        "rest (act+temp+other)": (
            sum(cats.get(k, 0) for k in ("activations", "temporaries", "other")),
            mt("Activation") + mt("Temp") + mt("Other"),
        ),
    }
    categories = {
        k: {"vramscope": a, "reference": b, "error": _err(a, b)} for k, (a, b) in rows.items()
    }
    modules = {}
    for fqn, stats in theirs["modules"].items():
        row = ours["modules"].get(fqn)
        if row is None or row["depth"] > 2:
            continue
        local = max(
            row.get("forward_peak_allocated_bytes") or 0,
            row.get("backward_peak_allocated_bytes") or 0,
        )
        modules[fqn or "(root)"] = {
            "parameters": _err(row["parameters_bytes"], stats["parameters"]),
            "buffers": _err(row["buffers_bytes"], stats["buffers"]),
            "local_peak": _err(local or None, stats["local_peak"]),
        }
    errors = [abs(v["error"]) for v in categories.values() if v["error"] is not None]
    module_errors = [abs(e) for m in modules.values() for e in m.values() if e is not None]
    result = {
        "workload": name,
        "batch_size": batch,
        "categories": categories,
        "modules": modules,
        "worst_category_error": max(errors, default=None),
        "worst_module_error": max(module_errors, default=None),
        "repeat_peak_error": _err(
            ours_again["attribution"].get("peak_bytes"), ours["attribution"].get("peak_bytes")
        ),
        "notes": ours["notes"],
    }
    del runner, w
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attribution_accuracy.py needs a CUDA device")
    results = []
    for name, (builder, batch) in WORKLOADS.items():
        if args.only and name not in args.only:
            continue
        try:
            results.append(compare(name, builder, batch))
        except Exception as exc:
            results.append({"workload": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{'workload':26s} {'what':34s} {'vramscope':>14s} {'reference':>14s} {'error':>8s}")
    for r in results:
        if "error" in r:
            print(f"{r['workload']:26s} ERROR {r['error']}")
            continue
        for what, v in r["categories"].items():
            e = v["error"]
            flag = "" if e is None or abs(e) <= TOLERANCE else "  !"
            print(
                f"{r['workload']:26s} {what:34s} {v['vramscope'] or 0:14d} {v['reference'] or 0:14d} "
                f"{'' if e is None else f'{100 * e:+.2f}%':>8s}{flag}"
            )
        print(
            f"{r['workload']:26s} {'modules (depth<=2): worst error':34s} "
            f"{'':14s} {'':14s} {100 * (r['worst_module_error'] or 0):+7.2f}%"
        )
    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": props.name,
        "driver": nvml.driver_version(),
        "torch": torch.__version__,
        "vramscope": vramscope.__version__,
        "tolerance": TOLERANCE,
    }
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
