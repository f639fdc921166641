"""Record, on a real GPU, which batch sizes of the example CNN run under a memory cap: the
data behind ``tests/test_fit_edges.py``.

Usage (on a machine with a CUDA GPU):

    python tests/gpu/record_fit_edges.py OUTDIR [--jobs 8]

Each batch size runs as ``fit --verify`` runs a trial: a fresh process, capped with
``set_per_process_memory_fraction``, three steps (``vramscope.fit.trial``), eight at a
time. ``OUTDIR/fit_edges_h200.json`` lists, per budget and batch size, whether it ran or
ran out of memory and its peaks; for a few batch sizes the trial also writes the allocator's
trace (``OUTDIR/alloc_trace_h200_cnn_<GiB>g_b<batch>.json.gz``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from vramscope.fit.trial import run_trial  # noqa: E402

GiB = 2**30
# budget in GiB -> batch sizes around the largest that runs (from the fit benchmark)
RANGES = {2: range(208, 227), 6: range(667, 696)}
TRACED = {(2, 217), (2, 218), (6, 693), (6, 694)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    import torch

    jobs = [(gib, b) for gib, batches in RANGES.items() for b in batches]

    def one(job: tuple[int, int]) -> dict:
        gib, b = job
        history = None
        if job in TRACED:
            history = args.outdir / f"alloc_trace_h200_cnn_{gib}g_b{b}.json.gz"
        r = run_trial(
            "example:cnn", b, precision="32-true", budget_bytes=gib * GiB, history=history
        )
        return {
            "budget_gib": gib,
            "batch_size": b,
            "status": r.status,
            "allocated_bytes": r.peak.get("allocated_bytes"),
            "reserved_bytes": r.peak.get("reserved_bytes"),
            "error": (r.error or "")[:200] or None,
        }

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    for row in rows:
        print(row["budget_gib"], row["batch_size"], row["status"], row["allocated_bytes"])
    payload = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(),
            "spec": "example:cnn",
            "precision": "32-true",
            "steps": 3,
        },
        "trials": rows,
    }
    (args.outdir / "fit_edges_h200.json").write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
