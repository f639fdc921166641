"""Accuracy of the zoo sweep: the CPU estimates joined with the GPU measurements, model by model.

Usage: python benchmarks/zoo_accuracy.py [--estimates benchmarks/results/zoo_estimates_cpu.json]
           [--measured benchmarks/results/zoo_measured_h200.json]
           [--out benchmarks/results/zoo_accuracy_h200.json]
           [--reestimate ID|SPEC|failed|missed|all ...] [--jobs 2] [--timeout 600]

Per workload (rows of ``zoo.py`` and ``zoo_measure.py`` with the same id), the error of the
estimate of peak allocated, reserved and device used: (estimate − measured) / measured,
negative for an under-estimate. The summary checks the targets: allocated median |error|
≤0.5 % and p95 ≤3 %; reserved median ≤1 % and p90 ≤5 %; device used median ≤1 %; no model
under-estimated by more than 3 % allocated; device used under-estimated in at most 5 % of the
models. A model whose peak depends on values the estimate cannot know (detection's proposals,
an MoE's routing) is estimated as a range, the larger trace the estimate and the other the
alternative: it is judged apart, by whether the range holds the measurement (within 3 %), and
kept out of the error distribution above. Coverage counts the models that ran a real step, on the CPU (``zoo.py``) or on the
GPU: one that ran but did not estimate counts against it. Writes JSON and a text table.

``--reestimate`` runs the estimate again (not the real step) for chosen rows (ids or specs;
``failed``: the rows whose estimate failed; ``missed``: those off a target; ``all``), each in
a forked child as the sweep does, and stores the new estimates in the estimates file before
comparing: the way to check an estimator change on the rows it is meant to fix.
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
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import zoo  # noqa: E402
from zoo_pool import run_all  # noqa: E402

RESULTS = HERE / "results"
COLUMNS = ("allocated", "reserved", "device_used")
# column: (median |error| %, (percentile, |error| % at it))
TARGETS: dict[str, tuple[float, tuple[int, float] | None]] = {
    "allocated": (0.5, (95, 3.0)),
    "reserved": (1.0, (90, 5.0)),
    "device_used": (1.0, None),
}
ALLOCATED_UNDER_LIMIT_PCT = 3.0  # no model under-estimated by more than this
DEVICE_USED_UNDER_SHARE_PCT = 5.0  # of the models, at most this many under-estimated
COVERAGE_TARGET_PCT = 99.0


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def join(estimates: list[dict[str, Any]], measured: dict[str, dict[str, Any]]) -> list[dict]:
    """One row per workload: what ran, both peaks, the errors."""
    rows = []
    for est_row in estimates:
        real = est_row.get("real") or {}
        gpu = measured.get(est_row["id"])
        row: dict[str, Any] = {
            k: est_row.get(k) for k in ("id", "spec", "library", "family", "task", "batch")
        }
        row["precision"] = est_row.get("precision")
        row["ran_cpu"] = bool(real.get("ran"))
        row["ran_gpu"] = bool(gpu and gpu.get("ok"))
        row["counts"] = (row["ran_cpu"] or row["ran_gpu"]) and not est_row.get("cpu_only")
        row["estimated"] = zoo.estimated(est_row)
        err = zoo.error_of(est_row)
        if not row["estimated"] and err:
            row["estimate_error"] = err
        if gpu and not gpu.get("ok"):
            row["measure_error"] = gpu.get("error") or {"class": gpu.get("lost", "?")}
        if row["counts"] and _fails_alike(row):
            # the GPU raised the error the estimate predicted (bfloat16 FFTs under autocast):
            # torch cannot run this workload there, and the estimate said so
            row["fails_on_gpu_as_estimated"] = True
            row["counts"] = False
        if row["estimated"]:
            row["estimate"] = est_row["estimate"]["peak"]
            row["estimate_seconds"] = est_row["estimate"]["seconds"]
        if row["ran_gpu"]:
            row["measured"] = gpu["peak"]
            row["process_index"] = gpu.get("process_index")
        alternative = (est_row.get("estimate") or {}).get("alternative_peak")
        if row["estimated"] and alternative:
            # values the trace could not know were assumed both ways: the peak is a range
            row["assumed"] = True
            row["alternative"] = alternative
        if row["estimated"] and row["ran_gpu"]:
            row["error_pct"] = {
                col: round(100 * (row["estimate"][f"{col}_bytes"] / real_value - 1), 3)
                for col in COLUMNS
                if (real_value := row["measured"].get(f"{col}_bytes"))
                and row["estimate"].get(f"{col}_bytes") is not None
            }
            upper = row["estimate"].get("device_used_upper_bytes")
            if upper is not None and row["measured"].get("device_used_bytes"):
                real_value = row["measured"]["device_used_bytes"]
                row["error_pct"]["device_used_upper"] = round(100 * (upper / real_value - 1), 3)
            if row.get("assumed"):
                row["range_error_pct"] = _range_errors(row)
        rows.append(row)
    return rows


def _fails_alike(row: dict[str, Any]) -> bool:
    """Whether the estimate failed with the very error the GPU's run raised."""
    estimate = (row.get("estimate_error") or {}).get("class")
    measured = (row.get("measure_error") or {}).get("class")
    return bool(estimate and measured and "error" in measured.lower() and measured in estimate)


def _range_errors(row: dict[str, Any]) -> dict[str, float]:
    """Per column, how far the measurement lies outside the estimate's range (its two
    traces, one per assumption): 0 inside, negative below the lower end, positive above the
    upper end, in percent of the measurement (negative: the range under-estimates)."""
    out = {}
    for col in COLUMNS:
        real = row["measured"].get(f"{col}_bytes")
        a, b = row["estimate"].get(f"{col}_bytes"), row["alternative"].get(f"{col}_bytes")
        if not real or a is None or b is None:
            continue
        lo, hi = min(a, b), max(a, b)
        nearest = lo if real < lo else hi if real > hi else real
        out[col] = round(100 * (nearest / real - 1), 3)
    return out


def off_target(row: dict[str, Any]) -> bool:
    """Whether one model misses a per-model bound (for ``--reestimate missed``)."""
    e = row.get("error_pct") or {}
    return (
        e.get("allocated", 0) < -ALLOCATED_UNDER_LIMIT_PCT
        or abs(e.get("allocated", 0)) > TARGETS["allocated"][1][1]  # type: ignore[index]
        or abs(e.get("reserved", 0)) > TARGETS["reserved"][1][1]  # type: ignore[index]
        or e.get("device_used_upper", e.get("device_used", 0)) < 0
    )


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in rows if r["counts"]]
    # a model whose memory depends on values the estimate cannot know (detection's
    # proposals, routing) is estimated as a range: judged apart, by whether it holds the
    # measurement
    ranged = [r for r in rows if "range_error_pct" in r]
    compared = [r for r in rows if "error_pct" in r and "range_error_pct" not in r]
    out: dict[str, Any] = {
        "workloads": len(rows),
        "ran_a_real_step": len(counted),
        "estimated": sum(1 for r in counted if r["estimated"]),
        "measured_on_gpu": sum(1 for r in rows if r["ran_gpu"]),
        "fail_on_gpu_as_estimated": [r["id"] for r in rows if r.get("fails_on_gpu_as_estimated")],
        "compared": len(compared),
        "columns": {},
    }
    out["coverage_pct"] = round(100 * out["estimated"] / len(counted), 2) if counted else None
    out["coverage_target"] = f"≥{COVERAGE_TARGET_PCT:g} %"
    met = out["coverage_pct"] is not None and out["coverage_pct"] >= COVERAGE_TARGET_PCT
    per_library = {}
    for lib in sorted({r["library"] for r in rows}):
        mine = [r for r in counted if r["library"] == lib]
        ok = sum(1 for r in mine if r["estimated"])
        per_library[lib] = {
            "ran": len(mine),
            "estimated": ok,
            "coverage_pct": round(100 * ok / len(mine), 1) if mine else None,
        }
    out["libraries"] = per_library
    for col in COLUMNS:
        errs = [r["error_pct"][col] for r in compared if col in r["error_pct"]]
        if not errs:
            continue
        absolute = [abs(e) for e in errs]
        median_target, tail = TARGETS[col]
        entry: dict[str, Any] = {
            "median_abs_error_pct": round(statistics.median(absolute), 3),
            "p90_abs_error_pct": round(percentile(absolute, 90), 3),
            "p95_abs_error_pct": round(percentile(absolute, 95), 3),
            "max_abs_error_pct": round(max(absolute), 3),
            "under_estimated": sum(1 for e in errs if e < 0),
        }
        col_met = entry["median_abs_error_pct"] <= median_target
        target = f"median ≤{median_target:g} %"
        if tail is not None:
            q, bound = tail
            col_met &= percentile(absolute, q) <= bound
            target += f", p{q} ≤{bound:g} %"
        entry.update(target=target, met=col_met)
        out["columns"][col] = entry
        met &= col_met
    under = sorted(
        (r for r in compared if r["error_pct"].get("allocated", 0) < -ALLOCATED_UNDER_LIMIT_PCT),
        key=lambda r: r["error_pct"]["allocated"],
    )
    out["allocated_under_3pct"] = {
        "models": [f"{r['id']} ({r['error_pct']['allocated']:+.2f} %)" for r in under],
        "met": not under,
    }
    met &= not under
    used = [r for r in compared if "device_used" in r["error_pct"]]

    def bound(r: dict[str, Any]) -> float:
        """The figure a user takes as the limit: the upper bound, where the estimate has one."""
        return r["error_pct"].get("device_used_upper", r["error_pct"]["device_used"])

    used_under = [r for r in used if bound(r) < 0]
    share = 100 * len(used_under) / len(used) if used else 0.0
    point_under = [r for r in used if r["error_pct"]["device_used"] < 0]
    with_upper = [r for r in used if "device_used_upper" in r["error_pct"]]
    out["device_used_under"] = {
        "models": len(used_under),
        "share_pct": round(share, 2),
        "target": f"≤{DEVICE_USED_UNDER_SHARE_PCT:g} % of models",
        "met": share <= DEVICE_USED_UNDER_SHARE_PCT,
        "judged_on": f"the upper bound ({len(with_upper)} of {len(used)} models have one)",
        "point_under_models": len(point_under),
        "point_under_share_pct": round(100 * len(point_under) / len(used), 2) if used else 0.0,
        "upper_median_error_pct": (
            round(statistics.median(r["error_pct"]["device_used_upper"] for r in with_upper), 3)
            if with_upper
            else None
        ),
    }
    met &= share <= DEVICE_USED_UNDER_SHARE_PCT
    if ranged:
        inside = [r for r in ranged if abs(r["range_error_pct"].get("allocated", 0)) <= 3.0]
        below = [r for r in ranged if r["range_error_pct"].get("allocated", 0) < -3.0]
        out["data_dependent"] = {
            "models": len(ranged),
            "allocated_within_range_3pct": len(inside),
            "range_under_estimates": [
                f"{r['id']} ({r['range_error_pct']['allocated']:+.2f} %)" for r in below
            ],
            "rows": {
                r["id"]: {
                    "range_error_pct": r["range_error_pct"],
                    "upper_error_pct": r["error_pct"].get("allocated"),
                }
                for r in ranged
            },
            "met": not below,
        }
        met &= not below
    fresh = [r for r in used if r.get("process_index") == 0]
    if fresh and len(fresh) < len(used):
        out["device_used_first_in_process"] = {
            "models": len(fresh),
            "median_abs_error_pct": round(
                statistics.median(abs(r["error_pct"]["device_used"]) for r in fresh), 3
            ),
        }
    failed: dict[str, dict[str, Any]] = {}
    for r in counted:
        if r["estimated"]:
            continue
        cls = (r.get("estimate_error") or {}).get("class", "?")
        entry = failed.setdefault(cls, {"count": 0, "specs": []})
        entry["count"] += 1
        entry["specs"].append(r["spec"])
    out["estimate_errors"] = dict(sorted(failed.items(), key=lambda kv: -kv[1]["count"]))
    out["all_targets_met"] = bool(met)
    return out


def _pct(value: float | None) -> str:
    return f"{value:+8.2f}%" if value is not None else "        -"


def table(document: dict[str, Any]) -> str:
    s = document["summary"]
    meta = document["meta"]
    estimated = meta.get("estimated", {})
    parts = (estimated.get("reestimated") or {}).get("parts") or []
    when = estimated.get("date")
    days = [p["date"] for p in parts if p.get("date")]
    if days:  # the rows were estimated again: the first day and the last
        when = f"{when}, estimated again to {max(days)}"
    lines = [
        f"zoo accuracy: CPU estimates ({when}) against "
        f"{meta.get('measured', {}).get('gpu')} measurements ({meta.get('measured', {}).get('date')})",
        "",
        f"{'workload':78s} {'batch':>5s} {'precision':10s} {'meas alloc':>10s} "
        f"{'alloc':>9s} {'reserved':>9s} {'used':>9s}",
    ]
    for r in document["rows"]:
        if not r["counts"]:
            continue
        e = r.get("error_pct") or {}
        measured = (r.get("measured") or {}).get("allocated_bytes")
        shown = f"{measured / 2**30:8.3f}Gi" if measured else "         -"
        tail = ""
        if not r["estimated"]:
            tail = "  NOT ESTIMATED: " + (r.get("estimate_error") or {}).get("class", "?")
        elif not r["ran_gpu"]:
            tail = "  not measured: " + (r.get("measure_error") or {}).get("class", "?")
        lines.append(
            f"{r['spec'][:78]:78s} {r['batch']:5d} {r['precision']:10s} {shown:>10s} "
            f"{_pct(e.get('allocated'))} {_pct(e.get('reserved'))} {_pct(e.get('device_used'))}"
            f"{tail}"
        )
    lines += [
        "",
        f"coverage: {s['estimated']} of {s['ran_a_real_step']} models that ran a real step "
        f"estimate ({s['coverage_pct']} %; target {s['coverage_target']}); "
        f"{s['compared']} compared with a measurement",
    ]
    for lib, entry in s["libraries"].items():
        lines.append(
            f"  {lib:12s} {entry['estimated']:4d} of {entry['ran']:4d} ({entry['coverage_pct']} %)"
        )
    alike = s.get("fail_on_gpu_as_estimated") or []
    if alike:
        lines.append(
            f"  not counted: {len(alike)} fail on the GPU with the error the estimate gives "
            f"({', '.join(alike[:4])})"
        )
    lines += ["", f"{'column':12s} {'median':>8s} {'p90':>8s} {'p95':>8s} {'worst':>8s}  target"]
    for col, c in s["columns"].items():
        lines.append(
            f"{col:12s} {c['median_abs_error_pct']:7.2f}% {c['p90_abs_error_pct']:7.2f}% "
            f"{c['p95_abs_error_pct']:7.2f}% {c['max_abs_error_pct']:7.2f}%  {c['target']}: "
            f"{'met' if c['met'] else 'MISSED'}"
        )
    under = s["allocated_under_3pct"]
    lines.append(
        f"allocated under-estimated by more than {ALLOCATED_UNDER_LIMIT_PCT:g} %: "
        f"{len(under['models'])} ({', '.join(under['models'][:8]) or 'none'}): "
        f"{'met' if under['met'] else 'MISSED'}"
    )
    du = s["device_used_under"]
    lines.append(
        f"device used under-estimated by its upper bound: {du['models']} models "
        f"({du['share_pct']} %), target {du['target']}: {'met' if du['met'] else 'MISSED'}"
        + (
            f"; the point estimate under in {du['point_under_models']} "
            f"({du['point_under_share_pct']} %); the bound's median error "
            f"{du['upper_median_error_pct']:+.2f} %"
            if du.get("upper_median_error_pct") is not None
            else ""
        )
    )
    if s["estimate_errors"]:
        lines += ["", "not estimated, by class:"]
        for cls, entry in s["estimate_errors"].items():
            lines.append(f"  {entry['count']:4d}  {cls}  ({', '.join(entry['specs'][:3])})")
    lines.append("")
    dd = s.get("data_dependent")
    if dd:
        lines += [
            "",
            f"estimated as a range (values assumed both ways): {dd['models']} models, "
            f"{dd['allocated_within_range_3pct']} hold the measured allocated peak within 3 %; "
            f"the range under-estimates: {', '.join(dd['range_under_estimates']) or 'none'}",
        ]
    lines.append("all targets met" if s["all_targets_met"] else "SOME TARGETS MISSED")
    return "\n".join(lines) + "\n"


def reestimate(
    estimates: dict[str, Any],
    chosen: list[dict[str, Any]],
    jobs: int,
    timeout: float,
    path: Path | None = None,
) -> None:
    """The estimate of each chosen row again, in forked children; stored in ``estimates``
    (and written to ``path`` every 20 rows, so that a run cut short keeps what it did)."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    import vramscope.estimate.estimator  # noqa: F401  (imported before the children fork)

    by_id = {r["id"]: r for r in estimates["rows"]}
    lock = threading.Lock()

    def target(row: dict[str, Any], note: Any) -> dict[str, Any]:
        return {"estimate": zoo.estimate_row(row)}

    def on_result(row: dict[str, Any], result: dict[str, Any]) -> None:
        with lock:
            entry = by_id[row["id"]]
            if "estimate" in result:
                entry["estimate"] = result["estimate"]
                entry.pop("lost", None)
            else:
                entry["estimate"] = {
                    "ok": False,
                    "error": {
                        "type": "Timeout",
                        "message": result.get("lost", "?"),
                        "class": f"Timeout: {result.get('lost', '?')}",
                    },
                }
            est = entry["estimate"]
            state = "ok" if est.get("ok") else est["error"]["class"]
            print(f"re-estimated {row['id'][:80]:80s} {est.get('seconds', 0):6.1f}s {state}")
            done.append(row["id"])
            if path is not None and len(done) % 20 == 0:
                zoo.write_json(path, estimates)

    done: list[str] = []
    # the longest first (as their last estimate took): the jobs end together
    chosen = sorted(chosen, key=lambda r: -((r.get("estimate") or {}).get("seconds") or 0))
    run_all(target, chosen, on_result, jobs=jobs, timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    parser.add_argument("--estimates", default=str(RESULTS / "zoo_estimates_cpu.json"))
    parser.add_argument("--measured", default=str(RESULTS / "zoo_measured_h200.json"))
    parser.add_argument("--out", default=str(RESULTS / "zoo_accuracy_h200.json"))
    parser.add_argument("--reestimate", nargs="*", default=[])
    parser.add_argument(
        "--why", help="with --reestimate: what changed, kept in the estimates' record"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    os.chdir(ROOT)
    estimates_path = Path(args.estimates)
    estimates = json.loads(estimates_path.read_text())
    measured_doc = json.loads(Path(args.measured).read_text())
    measured = {r["id"]: r for r in measured_doc["rows"]}
    if args.reestimate:
        import zoo_hf

        zoo_hf.write_config_files()
        rows = join(estimates["rows"], measured)
        wanted = set(args.reestimate)
        chosen_ids = {
            r["id"]
            for r in rows
            if "all" in wanted
            or r["id"] in wanted
            or r["spec"] in wanted
            or ("failed" in wanted and r["counts"] and not r["estimated"])
            or ("missed" in wanted and off_target(r))
        }
        chosen = [r for r in estimates["rows"] if r["id"] in chosen_ids]
        print(f"re-estimating {len(chosen)} workloads", flush=True)
        started = time.perf_counter()
        # each re-estimate is one more part of the record of how the rows were estimated
        record = estimates.setdefault("meta", {}).setdefault("reestimated", {})
        parts = record.setdefault("parts", [])
        note = {
            "workloads": len(chosen),
            "which": args.why or ", ".join(sorted(chosen_ids)),
            "date": datetime.date.today().isoformat(),
            "seconds": None,  # (None: the run was cut short)
            "cpus": os.cpu_count(),
            "jobs": args.jobs,
            "machine": f"a {os.cpu_count()}-core {platform.machine()} CPU",
            "libraries": zoo.library_versions(),
        }
        parts.append(note)
        record["date"] = note["date"]
        reestimate(estimates, chosen, args.jobs, args.timeout, estimates_path)
        note["seconds"] = round(time.perf_counter() - started, 1)
        zoo.finish(estimates_path, estimates)

    rows = join(estimates["rows"], measured)
    document = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "estimated": estimates.get("meta", {}),
            "measured": measured_doc.get("meta", {}),
        },
        "summary": summarize(rows),
        "rows": rows,
    }
    out = Path(args.out)
    zoo.write_json(out, document)
    text = table(document)
    out.with_suffix(".txt").write_text(text)
    print(text.split("\ncoverage:", 1)[-1])
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
