"""Accuracy of `vramscope estimate` against measurements on an H200, case by case.

Usage: python benchmarks/accuracy.py [--measured benchmarks/results/accuracy_measured_h200.json]
                                     [--out benchmarks/results/accuracy_h200.json] [--only NAME ...]

Every case of ``suite.py`` is estimated here, on this machine's CPU (no GPU needed), for the
H200 profile, and compared with the measured peaks that ``measure_suite.py`` recorded on an
H200 (``vramscope measure CASE --steps 3``). Prints, per case, the error of allocated,
reserved and device used (estimate / measured - 1) and the estimate's time; then the median
and 90th percentile of |error| per column against the targets, and how many workloads have
reserved under-predicted by more than 5 %. A target that is missed is printed as MISSED.

Cases run one after the other in this process (so imports are paid once; the first case's
time includes the one-off set-up of the CUDA emulation); the time column is each estimate's
wall time. torchvision and timm cases need those packages (and a torch they work with).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from suite import ROOT, SUITE, Case  # noqa: E402

COLUMNS = ("allocated", "reserved", "device_used")
TARGETS = {  # column: (median, p90) of |error| in %
    "allocated": (1.0, 3.0),
    "reserved": (2.0, 5.0),
    "device_used": (2.0, None),
}
RESERVED_UNDER_LIMIT_PCT = 5.0
RESERVED_UNDER_MAX_CASES = 1


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def without_paths(text: str) -> str:
    """Text with this machine's directories left out: the repository's root and the
    environment's prefix (results files are committed)."""
    for prefix, name in (
        (str(ROOT) + os.sep, ""),
        (sys.prefix, "<env>"),
        (sys.base_prefix, "<python>"),
    ):
        text = text.replace(prefix, name)
    return text


def estimate_case(case: Case, gpu: str) -> dict:
    from vramscope.estimate.estimator import estimate

    start = time.perf_counter()
    report = estimate(
        case.spec,
        case.batch_size,
        gpu=gpu,
        precision=case.precision,
        accumulate=case.accumulate,
        allocator_config=case.allocator_config or "",
    )
    seconds = time.perf_counter() - start
    return {
        "peak": {
            "allocated_bytes": report.peak.allocated_bytes,
            "reserved_bytes": report.peak.reserved_bytes,
            "device_used_bytes": report.peak.device_used_bytes,
            "step": report.peak.step,
            "phase": report.peak.phase,
        },
        "context_and_libraries_bytes": report.startup.context_and_libraries_bytes,
        "categories_at_peak": vars(report.categories_at_peak),
        "steps": [
            {
                "index": s.index,
                "peak_allocated_bytes": s.peak_allocated_bytes,
                "peak_reserved_bytes": s.peak_reserved_bytes,
            }
            for s in report.steps
        ],
        "sdpa_kernels": report.extra["estimate"]["sdpa_kernels"],
        "simulated_steps": report.extra["estimate"]["simulated_steps"],
        "data_dependent": report.extra["estimate"]["data_dependent"],
        "seconds": round(seconds, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", default=str(HERE / "results" / "accuracy_measured_h200.json"))
    parser.add_argument("--out", default=str(HERE / "results" / "accuracy_h200.json"))
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()

    out = Path(args.out).resolve()
    measured_doc = json.loads(Path(args.measured).read_text())
    os.chdir(ROOT)  # specs name files relative to the repository
    measured = {c["name"]: c for c in measured_doc["cases"]}
    cases = [c for c in SUITE if not args.only or c.name in args.only]

    import torch

    rows: list[dict] = []
    header = (
        f"{'case':32s} {'alloc err':>9s} {'resv err':>9s} {'used err':>9s}  "
        f"{'est alloc':>10s} {'est resv':>10s} {'time':>6s}"
    )
    print(header, flush=True)
    for case in cases:
        row: dict = {"name": case.name, "spec": case.spec}
        truth = measured.get(case.name)
        if truth is None or "peak" not in truth:
            row["error"] = "no measurement" + (f": {truth.get('error')}" if truth else "")
            rows.append(row)
            print(f"{case.name:32s} skipped: {row['error']}", flush=True)
            continue
        try:
            row["estimate"] = estimate_case(case, args.gpu)
        except Exception as exc:  # one failing case must not stop the suite
            first = (str(exc).splitlines() or [""])[0]
            row["error"] = without_paths(f"{type(exc).__name__}: {first}")[:300]
            row["traceback"] = without_paths(traceback.format_exc(limit=4))
            rows.append(row)
            print(f"{case.name:32s} FAILED: {row['error']}", flush=True)
            continue
        est, real = row["estimate"]["peak"], truth["peak"]
        row["measured"] = {
            "allocated_bytes": real["allocated_bytes"],
            "reserved_bytes": real["reserved_bytes"],
            "device_used_bytes": real["device_used_bytes"],
            "step": real.get("step"),
            "phase": real.get("phase"),
            "context_and_libraries_bytes": truth.get("startup", {}).get(
                "context_and_libraries_bytes"
            ),
        }
        row["error_pct"] = {
            col: round(100 * (est[f"{col}_bytes"] / real[f"{col}_bytes"] - 1), 3)
            for col in COLUMNS
            if real.get(f"{col}_bytes")
        }
        rows.append(row)
        e = row["error_pct"]
        print(
            f"{case.name:32s} {e.get('allocated', float('nan')):+8.2f}% "
            f"{e.get('reserved', float('nan')):+8.2f}% {e.get('device_used', float('nan')):+8.2f}%  "
            f"{est['allocated_bytes'] / 2**30:8.3f}Gi {est['reserved_bytes'] / 2**30:8.3f}Gi "
            f"{row['estimate']['seconds']:5.1f}s",
            flush=True,
        )

    done = [r for r in rows if "error_pct" in r]
    summary: dict = {"cases": len(cases), "estimated": len(done), "columns": {}}
    print()
    print(f"{'column':12s} {'median |err|':>13s} {'p90 |err|':>10s}  target")
    all_met = True
    for col in COLUMNS:
        errs = [abs(r["error_pct"][col]) for r in done if col in r["error_pct"]]
        if not errs:
            continue
        med, p90 = statistics.median(errs), percentile(errs, 90)
        t_med, t_p90 = TARGETS[col]
        met = med <= t_med and (t_p90 is None or p90 <= t_p90)
        all_met &= met
        target = f"median ≤{t_med}%" + (f", p90 ≤{t_p90}%" if t_p90 else "")
        summary["columns"][col] = {
            "median_abs_error_pct": round(med, 3),
            "p90_abs_error_pct": round(p90, 3),
            "max_abs_error_pct": round(max(errs), 3),
            "target": target,
            "met": met,
        }
        print(f"{col:12s} {med:12.2f}% {p90:9.2f}%  {target}: {'met' if met else 'MISSED'}")
    under = [
        r["name"] for r in done if r["error_pct"].get("reserved", 0) < -RESERVED_UNDER_LIMIT_PCT
    ]
    under_met = len(under) <= RESERVED_UNDER_MAX_CASES
    all_met &= under_met
    summary["reserved_under_5pct"] = {"cases": under, "met": under_met}
    print(
        f"reserved under-predicted by >{RESERVED_UNDER_LIMIT_PCT:.0f}%: {len(under)} "
        f"({', '.join(under) or 'none'}); target ≤{RESERVED_UNDER_MAX_CASES}: "
        f"{'met' if under_met else 'MISSED'}"
    )
    times = [r["estimate"]["seconds"] for r in done]
    if times:
        summary["seconds"] = {
            "median": round(statistics.median(times), 2),
            "max": round(max(times), 2),
            "first_case_includes_setup": True,
        }
        print(f"estimate time: median {statistics.median(times):.1f} s, max {max(times):.1f} s")
    failed = [r["name"] for r in rows if "error" in r]
    if failed:
        all_met = False
        print(f"not estimated: {', '.join(failed)}")
    summary["all_targets_met"] = all_met
    print("all targets met" if all_met else "SOME TARGETS MISSED (see above)")

    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu_profile": args.gpu,
        "measured": measured_doc.get("meta"),
        "estimated_on": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    with_versions = {}
    for name in ("transformers", "peft", "timm", "torchvision"):
        try:
            with_versions[name] = __import__(name).__version__
        except Exception:
            with_versions[name] = None
    meta["estimated_on"].update(with_versions)
    measured_libs = (measured_doc.get("meta") or {}).get("libraries")
    if measured_libs is None:
        print("the measurements do not record their transformers/peft/timm versions")
    else:
        differ = {
            k: [measured_libs.get(k), v]
            for k, v in with_versions.items()
            if measured_libs.get(k) and v and measured_libs.get(k) != v
        }
        meta["library_versions_differ"] = differ
        for name, (real, here) in differ.items():
            print(f"{name}: measured with {real}, estimated with {here}")
    # cases measured again with other libraries than the rest carry their own versions
    estimated = {r["name"] for r in rows}
    for case_name, truth in measured.items():
        libs = truth.get("libraries")
        if not libs or case_name not in estimated:
            continue
        same = {k: v for k, v in with_versions.items() if libs.get(k) and v and libs[k] == v}
        if same:
            versions = ", ".join(f"{k} {v}" for k, v in sorted(same.items()))
            print(f"{case_name}: measured and estimated with {versions}")
    out.write_text(json.dumps({"meta": meta, "summary": summary, "cases": rows}, indent=1))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
