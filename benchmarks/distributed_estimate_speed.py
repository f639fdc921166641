"""How long a per-rank estimate of a 7B model takes on this CPU, by strategy and world size.

Usage: python benchmarks/distributed_estimate_speed.py
           [--out benchmarks/results/distributed_estimate_speed.json] [--quick]

Each case is ``vramscope.estimate(hf:llama-7b/seq=1024, batch 1 per GPU, parallel=...)`` in a
fresh process, as the command line runs it: the seconds from the process's start (imports of
torch and transformers included) to the report, and the process's peak resident memory. The
target (issue 15): a 64-rank FSDP estimate of a 7B model in 60 s or less on 2 cores. The
64-rank 2-D case (FSDP over 8 × tensor parallel 8, issue 33) has the same target, and so
has the 64-rank 3-D case (4 pipeline stages, 1F1B, 8 micro-batches × FSDP over 2 × tensor
parallel 8, issue 33): 4 stages traced, one each. The other cases (FSDP2 mixed precision, HSDP, ZeRO-1 and -2, DDP, 1024 ranks) are for reference.
``--quick`` runs the target case alone. Prints a table with MET / MISSED and writes the JSON
and the table beside it (``.txt``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC, BATCH = "hf:llama-7b/seq=1024", 1
TARGET_S = 60.0
# (label, precision, plan settings); the first is the target's case
CASES = [
    ("fsdp-64", "bf16-mixed", {"strategy": "fsdp", "world_size": 64}),
    (
        "fsdp-64 bf16 params",
        "32-true",
        {"strategy": "fsdp", "world_size": 64, "param_dtype": "bf16", "reduce_dtype": "fp32"},
    ),
    ("hsdp-64 (shard 8)", "bf16-mixed", {"strategy": "hsdp", "world_size": 64, "shard_size": 8}),
    ("zero2-64", "bf16-mixed", {"strategy": "zero2", "world_size": 64}),
    ("zero1-64", "bf16-mixed", {"strategy": "zero1", "world_size": 64}),
    ("ddp-64", "bf16-mixed", {"strategy": "ddp", "world_size": 64}),
    ("fsdp-1024", "bf16-mixed", {"strategy": "fsdp", "world_size": 1024}),
    # 2-D: FSDP over 8 × tensor parallel 8 (the default plan; transformers' Llama: sequence
    # parallel off); the target of issue 33, 60 s or less
    ("fsdp-8 × tp-8", "bf16-mixed", {"strategy": "fsdp", "world_size": 64, "tp": 8}),
    # 3-D: 4 pipeline stages (1F1B, 8 micro-batches) × FSDP over 2 × tensor parallel 8; the
    # target of issue 33 too, 60 s or less
    (
        "pp-4 × fsdp-2 × tp-8",
        "bf16-mixed",
        {"strategy": "fsdp", "world_size": 64, "tp": 8, "pp": 4, "microbatches": 8},
    ),
]

_CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from vramscope.distributed.sharding import ParallelPlan
from vramscope.estimate.estimator import estimate
spec, batch, precision, plan = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
r = estimate(spec, batch, gpu="h100-80gb", precision=precision, parallel=ParallelPlan(**plan))
job = r.extra["distributed"]
print(json.dumps({"seconds": time.perf_counter() - t,
                  "estimate_seconds": r.extra["estimate"]["seconds"],
                  "trace_seconds": r.extra["estimate"]["trace_seconds"],
                  "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "parameters": r.workload["parameters"],
                  "peak": {"allocated_bytes": r.peak.allocated_bytes,
                           "reserved_bytes": r.peak.reserved_bytes,
                           "device_used_bytes": r.peak.device_used_bytes},
                  "categories_at_peak": r.categories_at_peak.__dict__,
                  "traced_ranks": [x["rank"] for x in job["traced_ranks"]],
                  "fits": r.extra["verdict"]["fits"]}))
"""


def run_case(precision: str, plan: dict) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, SPEC, str(BATCH), precision, json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")},
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = round(wall, 2)
    out["seconds"] = round(out["seconds"], 2)
    return out


_LINES: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    _LINES.append(text)


def gib(value: int) -> str:
    return f"{value / 2**30:6.2f} GiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "distributed_estimate_speed.json"))
    parser.add_argument("--quick", action="store_true", help="the target case alone")
    args = parser.parse_args()

    import torch

    load = [round(x, 2) for x in os.getloadavg()]
    say(
        f"{SPEC}, batch {BATCH} per GPU, for an H100 80GB; each case a fresh process "
        f"({os.cpu_count()} CPUs, load average before {load})"
    )
    say(
        f"{'case':22s} {'seconds':>8s} {'RSS':>10s} {'parameters':>11s} {'optimizer':>11s} "
        f"{'allocated':>11s} {'reserved':>11s}"
    )
    rows = []
    for label, precision, plan in CASES[:1] if args.quick else CASES:
        result = run_case(precision, plan)
        row = {"case": label, "precision": precision, "plan": plan, **result}
        rows.append(row)
        if "error" in result:
            say(f"{label:22s} FAILED: {result['error']}")
            continue
        cats = result["categories_at_peak"]
        say(
            f"{label:22s} {result['seconds']:8.1f} {gib(result['max_rss_bytes']):>10s} "
            f"{gib(cats['parameters']):>11s} {gib(cats['optimizer_state']):>11s} "
            f"{gib(result['peak']['allocated_bytes']):>11s} "
            f"{gib(result['peak']['reserved_bytes']):>11s}"
        )
    target = rows[0]
    met = "seconds" in target and target["seconds"] <= TARGET_S
    say(
        f"target: a 64-rank FSDP estimate of a 7B model in ≤{TARGET_S:.0f} s: "
        f"{target.get('seconds', 'failed')} s, {'MET' if met else 'MISSED'}"
    )
    more = {
        "2-D estimate (FSDP × tensor parallel 8)": lambda plan: plan.get("pp", 1) == 1,
        "3-D estimate (4 stages × FSDP × tensor parallel 8)": lambda plan: plan.get("pp", 1) > 1,
    }
    for words, which in more.items():
        row = next((r for r in rows if r["plan"].get("tp", 1) > 1 and which(r["plan"])), None)
        if row is None:
            continue
        met_row = "seconds" in row and row["seconds"] <= TARGET_S
        row["target_met"] = met_row
        say(
            f"target: a 64-rank {words} of a 7B model in ≤{TARGET_S:.0f} s: "
            f"{row.get('seconds', 'failed')} s, {'MET' if met_row else 'MISSED'}"
        )
    result = {
        "cases": rows,
        "target": {"case": target["case"], "seconds": TARGET_S, "met": met},
        "load_before": load,
        "meta": {
            "date": datetime.date.today().isoformat(),
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out).with_suffix(".txt").write_text("\n".join(_LINES) + "\n")
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.txt').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
