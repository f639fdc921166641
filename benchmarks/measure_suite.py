"""Measure every case of the accuracy suite on this machine's GPU, each in a fresh process.

Usage: python benchmarks/measure_suite.py OUT.json [--jobs 4] [--only NAME ...]
Each case runs ``python -m vramscope measure CASE --steps 3 --json ...`` in its own process
(a clean allocator and CUDA context), so cases can run side by side on one large GPU;
per-process numbers (allocator counters, NVML process memory) are unaffected.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import ROOT, SUITE, Case


def measure_case(case: Case, tmp: Path) -> dict:
    out = tmp / f"{case.name}.json"
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramscope",
            "measure",
            *case.cli_args(),
            "--steps",
            "3",
            "-q",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,  # specs name files relative to the repository
        timeout=900,
    )
    row: dict = {
        "name": case.name,
        "spec": case.spec,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if proc.returncode != 0 or not out.exists():
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:400]
        return row
    report = json.loads(out.read_text())
    row.update(
        peak=report["peak"],
        categories_at_peak=report["categories_at_peak"],
        phases=[
            {k: p[k] for k in ("name", "peak_allocated_bytes", "peak_reserved_bytes")}
            for p in report["phases"]
        ],
        steps=[
            {k: s[k] for k in ("index", "peak_allocated_bytes", "peak_reserved_bytes")}
            for s in report["steps"]
        ],
        startup=report["startup"],
        device=report["device"],
        workload=report["workload"],
    )
    return row


def library_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "accelerate", "timm", "torchvision"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    cases = [c for c in SUITE if not args.only or c.name in args.only]
    with (
        tempfile.TemporaryDirectory() as tmp,
        concurrent.futures.ThreadPoolExecutor(args.jobs) as pool,
    ):
        futures = {pool.submit(measure_case, c, Path(tmp)): i for i, c in enumerate(cases)}
        done: dict[int, dict] = {}
        for future in concurrent.futures.as_completed(futures):
            # each row as it ends, one JSON line: a run cut short keeps what it measured
            done[futures[future]] = row = future.result()
            print("ROW " + json.dumps(row), flush=True)
        rows = [done[i] for i in range(len(cases))]
    for row in rows:
        peak = row.get("peak", {})
        print(
            f"{row['name']:32s} {row['seconds']:6.1f}s  "
            + (
                f"alloc {(peak.get('allocated_bytes') or 0) / 2**30:7.3f} GiB  reserved {(peak.get('reserved_bytes') or 0) / 2**30:7.3f} GiB  "
                f"used {(peak.get('device_used_bytes') or 0) / 2**30:7.3f} GiB"
                if "error" not in row
                else f"ERROR {row['error']}"
            ),
            flush=True,
        )
    meta = {"date": datetime.date.today().isoformat(), "jobs": args.jobs}
    # the libraries whose code the cases run: an estimate runs its own copy of them, so a
    # comparison holds only where the versions agree (attention implementations change)
    meta["libraries"] = library_versions()
    if rows and "device" in rows[0]:
        meta.update(
            gpu=rows[0]["device"].get("name"),
            driver=rows[0]["device"].get("driver_version"),
            torch=rows[0]["device"].get("torch_version"),
        )
    Path(args.out).write_text(json.dumps({"meta": meta, "cases": rows}, indent=1))


if __name__ == "__main__":
    main()
