"""How long the zoo sweep's estimates take, on a fixed sample of its rows, as the sweep runs them.

Usage: python benchmarks/zoo_speed.py [--sample 20,10] [--repeats 2]
                                      [--src [LABEL=]SRC ...]
                                      [--out benchmarks/results/zoo_speed.json]

The rows are those of ``zoo_estimates_cpu.json`` up to 1 B parameters: the ``--sample``
slowest by their recorded estimate seconds and as many around their median. Each estimate
runs as ``zoo.py`` runs it: in a child forked from a process that imported the libraries
(``zoo.py``'s list) and runs torch on one thread, ``estimate(spec, batch, gpu="h200",
precision=...)`` timed from the call to the report, model build included. Given several
``--src`` folders (each a ``src`` of vramscope, named ``LABEL=`` in the results; the default is
this repository's, ``current``), every row runs once per folder in turn, the
order alternating between repeats, so that a shared machine's load falls on all of them
alike; the peaks of every run are kept, to show the folders estimate the same numbers.
Prints per row the median wall and CPU seconds per folder, and the medians over the sample;
writes the JSON and the table beside it (``.txt``), with the load average before and after.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LARGE_PARAMETERS = 1_000_000_000


def sample(rows: list[dict[str, Any]], slowest: int, median: int) -> list[dict[str, Any]]:
    timed = [
        r
        for r in rows
        if (r.get("estimate") or {}).get("seconds")
        and ((r["estimate"].get("parameters") or 0) <= LARGE_PARAMETERS)
    ]
    timed.sort(key=lambda r: r["estimate"]["seconds"])
    middle = len(timed) // 2
    around = timed[middle - median // 2 : middle - median // 2 + median]
    return timed[len(timed) - slowest :] + around


def _child(src: str, row: dict[str, Any], pipe: int) -> None:
    sys.path.insert(0, src)
    import vramscope.hf_models  # noqa: F401  (zoo.py's parent imports it)
    from vramscope.estimate.estimator import estimate

    wall, cpu = time.perf_counter(), time.process_time()
    try:
        report = estimate(row["spec"], row["batch"], gpu="h200", precision=row["precision"])
        peak = report.peak
        out: dict[str, Any] = {
            "peaks": [peak.allocated_bytes, peak.reserved_bytes, peak.device_used_bytes]
        }
    except Exception as exc:  # a failure is a result too
        out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out["seconds"] = round(time.perf_counter() - wall, 3)
    out["cpu_seconds"] = round(time.process_time() - cpu, 3)
    os.write(pipe, json.dumps(out).encode())
    os._exit(0)


def run_forked(src: str, row: dict[str, Any]) -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(src, row, write)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"error": "the child died"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", default="20,10", help="slowest,around-the-median")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--src", nargs="*", default=[f"current={ROOT / 'src'}"])
    parser.add_argument("--out", default=str(RESULTS / "zoo_speed.json"))
    args = parser.parse_args()
    slowest, median = (int(n) for n in args.sample.split(","))
    named = [s.split("=", 1) if "=" in s else [Path(s).resolve().parent.name, s] for s in args.src]
    label = {str(Path(path).resolve()): name for name, path in named}
    sources = list(label)

    os.chdir(ROOT)  # specs name files relative to the repository
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    # the libraries zoo.py imports before it forks (vramscope itself comes from each --src)
    import timm  # noqa: F401
    import torch
    import torchvision  # noqa: F401
    import transformers.generation.utils
    import transformers.masking_utils
    import transformers.modeling_layers
    import transformers.modeling_utils
    import transformers.models.auto.modeling_auto  # noqa: F401

    torch.set_num_threads(1)  # zoo.py: the CPUs shared among its two jobs
    recorded = json.loads((RESULTS / "zoo_estimates_cpu.json").read_text())["rows"]
    rows = sample(recorded, slowest, median)
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {r["id"]: {} for r in rows}
    for repeat in range(args.repeats):
        for row in rows:
            for src in sources if repeat % 2 == 0 else sources[::-1]:
                result = run_forked(src, row)
                runs[row["id"]].setdefault(label[src], []).append(result)
                print(
                    f"{repeat} {label[src][:16]:16s} {result.get('seconds', 0):7.2f} s "
                    f"{row['id'][:80]}",
                    flush=True,
                )
    load_after = [round(x, 2) for x in os.getloadavg()]

    lines = [
        f"{'row':80s} "
        + " ".join(f"{label[s][:7]:>7s} {'cpu':>7s}" for s in sources)
        + "  recorded  same peaks"
    ]
    per_source: dict[str, dict[str, list[float]]] = {s: {"wall": [], "cpu": []} for s in sources}
    table = []
    for row in rows:
        cells, peaks = [], set()
        for src in sources:
            done = [r for r in runs[row["id"]][label[src]] if "peaks" in r]
            peaks |= {json.dumps(r["peaks"]) for r in done}
            if not done:
                cells.append("  error  error")
                continue
            wall = statistics.median(r["seconds"] for r in done)
            cpu = statistics.median(r["cpu_seconds"] for r in done)
            per_source[src]["wall"].append(wall)
            per_source[src]["cpu"].append(cpu)
            cells.append(f"{wall:7.2f} {cpu:7.2f}")
        same = len(peaks) == 1
        table.append({"id": row["id"], "same_peaks": same, "runs": runs[row["id"]]})
        lines.append(
            f"{row['id'][:80]:80s} {' '.join(cells)}  {row['estimate']['seconds']:8.2f}  "
            f"{'yes' if same else 'NO'}"
        )
    summary = {}
    for src in sources:
        walls, cpus = per_source[src]["wall"], per_source[src]["cpu"]
        summary[label[src]] = {
            "median_seconds": statistics.median(walls) if walls else None,
            "max_seconds": max(walls, default=None),
            "median_cpu_seconds": statistics.median(cpus) if cpus else None,
            "median_seconds_around_median_rows": statistics.median(walls[slowest:])
            if walls[slowest:]
            else None,
        }
        mine = summary[label[src]]
        lines.append(
            f"{label[src]}: median {mine['median_seconds']:.2f} s (CPU "
            f"{mine['median_cpu_seconds']:.2f} s), longest {mine['max_seconds']:.2f} s, median "
            f"of the {median} rows around the sweep's median "
            f"{mine['median_seconds_around_median_rows']:.2f} s"
        )
    lines.append(
        f"{len(rows)} rows ({slowest} slowest and {median} around the median of the recorded "
        f"sweep, up to 1 B parameters), {args.repeats} runs each, medians; one estimate at a "
        f"time, torch on one thread; load average before {load_before}, after {load_after}"
    )
    print("\n".join(lines))
    document = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "repeats": args.repeats,
            "load_before": load_before,
            "load_after": load_after,
            "sources": [label[s] for s in sources],
        },
        "summary": summary,
        "rows": table,
    }
    out = Path(args.out)
    out.write_text(json.dumps(document, indent=1))
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.txt').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
