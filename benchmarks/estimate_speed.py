"""How long `vramscope estimate` takes on this CPU, and the host memory of a 7B estimate.

Usage: python benchmarks/estimate_speed.py [--out benchmarks/results/estimate_speed.json]
                                           [--quick]

Three measurements:
* in one process, after a warm-up estimate (imports and the one-off CUDA-emulation set-up
  paid), the wall time of one estimate per model up to 1.1 B parameters -- targets: each
  ≤30 s, their median ≤5 s (ConvNeXt-T and ViT-B/16 are the models whose construction,
  under torch 2.14's rejection-sampling ``trunc_normal_``, used to take minutes);
* the same for one model in a fresh process, as the command line runs it (``cold``: imports
  of torch, transformers and torch._dynamo included), for reference;
* ``hf:llama-7b`` from its config in a fresh process: wall time and the process's peak
  resident memory (``ru_maxrss``) -- targets ≤30 s and ≤2 GB (nothing proportional to the
  7 billion parameters may be allocated).
Prints a table with MET / MISSED per target and writes the JSON, and the table beside it
(``.txt``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

# (label, spec, batch size, precision, parameters in millions, needs)
MODELS = [
    ("example-gpt", "example:gpt", 16, "32-true", 5, None),
    ("resnet50", "torchvision:resnet50@sgdm", 64, "32-true", 26, "torchvision"),
    ("convnext_tiny", "torchvision:convnext_tiny", 64, "bf16-mixed", 29, "torchvision"),
    ("vit_b_16", "torchvision:vit_b_16", 64, "bf16-mixed", 86, "torchvision"),
    ("lstm-2x512", "tests/layer_workloads.py:lstm", 32, "32-true", 4, None),
    ("bert-base", "hf:bert-base/seq=512", 16, "32-true", 110, "transformers"),
    ("gpt2", "hf:gpt2/seq=1024", 16, "bf16-mixed", 124, "transformers"),
    ("opt-350m", "hf:opt-350m/seq=1024", 8, "bf16-mixed", 331, "transformers"),
    ("gpt2-medium", "hf:gpt2-medium/seq=1024", 8, "bf16-mixed", 355, "transformers"),
    ("llama-1b", "hf:llama-1b/seq=1024", 4, "bf16-mixed", 1100, "transformers"),
    ("llama-1b-true", "hf:llama-1b/seq=1024", 4, "bf16-true", 1100, "transformers"),
]
SEVEN_B = ("llama-7b", "hf:llama-7b/seq=1024", 1, "bf16-mixed")
TARGET_S, TARGET_MEDIAN_S, TARGET_7B_S, TARGET_7B_RSS = 30.0, 5.0, 30.0, 2 * 1024**3

_CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from vramscope.estimate.estimator import estimate
spec, batch, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = estimate(spec, batch, gpu="h200", precision=precision)
print(json.dumps({"seconds": time.perf_counter() - t,
                  "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "allocated_bytes": r.peak.allocated_bytes,
                  "parameters": r.workload["parameters"],
                  "trace_seconds": r.extra["estimate"]["trace_seconds"]}))
"""


def available(module: str | None) -> bool:
    if module is None:
        return True
    try:
        __import__(module)
    except Exception:
        return False
    return True


def in_fresh_process(spec: str, batch: int, precision: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, spec, str(batch), precision],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")},
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    wall = json.loads(proc.stdout.strip().splitlines()[-1])
    return wall


_LINES: list[str] = []


def say(text: str) -> None:
    """Print a line of the table and keep it for the ``.txt``."""
    print(text, flush=True)
    _LINES.append(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "estimate_speed.json"))
    parser.add_argument("--quick", action="store_true", help="skip the 7B run")
    args = parser.parse_args()

    import torch

    from vramscope.estimate.estimator import estimate

    load = [round(x, 2) for x in os.getloadavg()]  # the machine is shared: say how busy
    start = time.perf_counter()
    estimate("example:gpt", 2)  # warm-up: imports, symbol lookup, first fake-tensor caches
    warmup = time.perf_counter() - start
    rows = []
    say(f"{'model':16s} {'params':>8s} {'seconds':>8s}  target ≤{TARGET_S:.0f} s")
    for label, spec, batch, precision, _millions, needs in MODELS:
        if not available(needs):
            rows.append({"model": label, "skipped": f"needs {needs}"})
            say(f"{label:16s} skipped (needs {needs})")
            continue
        if needs == "transformers" and not any(r.get("warm_library") for r in rows):
            estimate("hf:gpt2/seq=64", 1)  # transformers' lazy imports, once
            rows.append({"model": "(transformers warm-up)", "warm_library": True})
        t = time.perf_counter()
        report = estimate(spec, batch, gpu="h200", precision=precision)
        seconds = time.perf_counter() - t
        met = seconds <= TARGET_S
        rows.append(
            {
                "model": label,
                "spec": spec,
                "batch_size": batch,
                "precision": precision,
                "parameters": report.workload["parameters"],
                "seconds": round(seconds, 2),
                "trace_seconds": report.extra["estimate"]["trace_seconds"],
                "build_seconds": report.extra["estimate"]["build_seconds"],
                "step_seconds": report.extra["estimate"]["step_seconds"],
                "met": met,
            }
        )
        say(
            f"{label:16s} {report.workload['parameters'] / 1e6:7.0f}M {seconds:8.2f}  "
            f"{'MET' if met else 'MISSED'}"
        )
    result: dict = {"warmup_seconds": round(warmup, 2), "models": rows, "load_before": load}
    if available("transformers"):
        cold = in_fresh_process("hf:gpt2/seq=1024", 16, "bf16-mixed")
        result["cold_gpt2"] = cold
        if "seconds" in cold:
            say(f"cold process, hf:gpt2 (imports included): {cold['seconds']:.1f} s")
        if not args.quick:
            label, spec, batch, precision = SEVEN_B
            seven = in_fresh_process(spec, batch, precision)
            seven["met_time"] = seven.get("seconds", 1e9) <= TARGET_7B_S
            seven["met_rss"] = seven.get("max_rss_bytes", 1e18) <= TARGET_7B_RSS
            result["llama_7b"] = seven
            if "seconds" in seven:
                say(
                    f"{label} ({seven['parameters'] / 1e9:.1f} B parameters), fresh process: "
                    f"{seven['seconds']:.1f} s (≤{TARGET_7B_S:.0f} s: "
                    f"{'MET' if seven['met_time'] else 'MISSED'}), peak RSS "
                    f"{seven['max_rss_bytes'] / 2**30:.2f} GiB (≤2 GiB: "
                    f"{'MET' if seven['met_rss'] else 'MISSED'})"
                )
            else:
                say(f"{label}: FAILED {seven.get('error')}")
    timed = [r for r in rows if "seconds" in r]
    result["summary"] = {
        "max_seconds_up_to_1b": max((r["seconds"] for r in timed), default=None),
        "median_seconds_up_to_1b": statistics.median(r["seconds"] for r in timed)
        if timed
        else None,
        "all_met": all(r["met"] for r in timed)
        and (not timed or statistics.median(r["seconds"] for r in timed) <= TARGET_MEDIAN_S)
        and result.get("llama_7b", {}).get("met_time", True)
        and result.get("llama_7b", {}).get("met_rss", True),
    }
    if timed:
        median = result["summary"]["median_seconds_up_to_1b"]
        say(
            f"median {median:.2f} s (≤{TARGET_MEDIAN_S:.0f} s: "
            f"{'MET' if median <= TARGET_MEDIAN_S else 'MISSED'}); load average before: "
            f"{result['load_before']}"
        )
    say("all targets met" if result["summary"]["all_met"] else "SOME TARGETS MISSED")
    result["meta"] = {
        "date": datetime.date.today().isoformat(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).with_suffix(".txt").write_text("\n".join(_LINES) + "\n")
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.txt').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
