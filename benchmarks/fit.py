"""How right is `fit`: the true largest batch (real runs) vs the estimate and `--verify`.

For each workload and budget: vramscope's estimate-only answer (margin 0), `--verify` (its
answer and how many real trials it used), and the truth: every batch size from 3 below the
smaller answer to 1 above the larger one run for real (each a fresh process capped with
set_per_process_memory_fraction, a few side by side). Near a cap memory is not monotone in
the batch size (the example CNN under 2 GiB runs 217, runs out at 218-219, runs 220-224), so
the true largest batch is the first one of the scan that runs while the next runs out (a
smaller last batch of an epoch has to fit too); the largest that runs is reported beside it.
Also compare's estimated savings against measured ones for a few strategies.

Usage (on a GPU): python benchmarks/fit.py --out results.json [--jobs 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vramscope.fit.compare import compare
from vramscope.fit.search import fit
from vramscope.fit.trial import run_trial

GiB = 2**30
# (name, spec, precision, budgets in GiB)
CASES = [
    ("cnn-fp32", "example:cnn", "32-true", (2, 6)),
    ("gpt2-seq1024-bf16", "hf:gpt2/seq=1024", "bf16-mixed", (12, 24)),
    ("gpt2-seq1024-ckpt-bf16", "hf:gpt2/seq=1024/ckpt", "bf16-mixed", (6, 12)),
    ("resnet18-sgd-fp32", "torchvision:resnet18@sgd", "32-true", (4, 10)),
]


def one_fit(spec: str, precision: str, gib: int) -> dict:
    """Estimate-only answer, ``--verify`` (real trials from the estimate), and the truth: every
    batch size around both answers run for real, each a fresh capped process."""
    budget = gib * GiB
    t0 = time.perf_counter()
    report = fit(
        spec, budget=budget, margin=0, precision=precision, max_batch_size=2048, verify=True
    )
    section = report.extra["fit"]
    verify = section["verify"]
    row = {
        "estimate": section["max_batch_size"],
        "estimate_largest_running": section.get("largest_running"),
        "estimates": section["estimates"],
        "verify": verify.get("max_batch_size"),
        "verify_trials": verify.get("real_trials"),
        "trials": verify.get("trials"),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if verify.get("error"):
        row["error"] = verify["error"]
    statuses = {t["batch_size"]: t["status"] for t in verify.get("trials", [])}
    answers = [b for b in (row["estimate"], row["verify"], row["estimate_largest_running"]) if b]
    lo, hi = max(1, min(answers) - 3), max(answers) + 1
    todo = [b for b in range(lo, hi + 1) if b not in statuses]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, 24 // gib))) as pool:
        results = pool.map(
            lambda b: run_trial(spec, b, precision=precision, budget_bytes=budget), todo
        )
        statuses.update({r.batch_size: r.status for r in results})
    row["scan"] = {str(b): statuses[b] for b in range(lo, hi + 1)}
    row["scan_trials"] = len(todo)
    # the truth: from the bottom of the scan, the first batch that runs while the next one runs
    # out (a smaller last batch of an epoch has to fit too); and the largest one that runs
    edges = [b for b in range(lo, hi) if statuses[b] == "fits" and statuses[b + 1] == "oom"]
    row["true"] = edges[0] if edges and statuses[lo] == "fits" else None
    row["true_largest_running"] = edges[-1] if edges else None
    if row["true"]:
        row["estimate_error_pct"] = round(100 * (row["estimate"] - row["true"]) / row["true"], 2)
        row["verify_exact"] = row["verify"] in edges
    return row


def estimates_only(truth_path: str, out: str | None) -> None:
    """No GPU: the estimate-only answers again (H200 profile, margin 0), beside the true
    largest batches of a committed GPU run (``truth_path``, this script's ``--out``)."""
    from vramscope.fit.search import Estimator, make_target, search_batches
    from vramscope.fit.strategies import get_strategy

    truth = json.loads(Path(truth_path).read_text())
    rows = []
    for r in truth["fit"]:
        t0 = time.perf_counter()
        target = make_target(None, r["budget_gib"] * GiB, 0)
        est = Estimator(r["spec"], target, get_strategy("baseline"), r["precision"], None, None)
        found = search_batches(est, 2048, without_margin=False)
        row = {
            "workload": r["workload"],
            "budget_gib": r["budget_gib"],
            "true": r.get("true"),
            "estimate_before": r.get("estimate"),
            "estimate": found.best,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'workload':26s} {'budget':>7s} {'true':>6s} {'before':>7s} {'estimate':>9s}  off by")
    for r in rows:
        off = r["estimate"] - r["true"] if r["true"] and r["estimate"] else None
        print(
            f"{r['workload']:26s} {r['budget_gib']:5d}G {r['true']!s:>6s} "
            f"{r['estimate_before']!s:>7s} {r['estimate']!s:>9s}  {off:+d}"
        )
    import torch

    within = sum(1 for r in rows if r["true"] and abs(r["estimate"] - r["true"]) <= 1)
    print(f"\nwithin one batch of the truth: {within} of {len(rows)}")
    if out:
        meta = {
            "date": datetime.date.today().isoformat(),
            "estimated_on": "cpu",
            "torch": torch.__version__,
            "truth": Path(truth_path).name,
            "truth_meta": truth.get("meta"),
        }
        Path(out).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))


def one_compare(spec: str, batch: int) -> list[dict]:
    strategies = ["bf16-mixed", "checkpointing", "sgd", "accumulate-x2"]
    est = compare([spec], batch_size=batch, strategies=strategies, measured=False)
    meas = compare([spec], batch_size=batch, strategies=strategies, measured=True)
    e_rows = {r["name"]: r for r in est.extra["fit"]["strategies"]}
    out = []
    for r in meas.extra["fit"]["strategies"]:
        e = e_rows.get(r["name"], {})
        es = e.get("saving_pct", {}).get("reserved_bytes")
        ms = r.get("saving_pct", {}).get("reserved_bytes")
        out.append(
            {
                "spec": spec,
                "batch_size": batch,
                "strategy": r["name"],
                "estimated_saving_pct": es,
                "measured_saving_pct": ms,
                "difference_pp": round(es - ms, 2) if es is not None and ms is not None else None,
                "step_time_s": r.get("step_time_s"),
                "skipped": r.get("skipped") or e.get("skipped"),
            }
        )
    return out


def _child(kind: str, args: list[str]) -> None:
    try:
        if kind == "fit":
            result: object = one_fit(args[0], args[1], int(args[2]))
        else:
            result = one_compare(args[0], int(args[1]))
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print("RESULT " + json.dumps(result), flush=True)


def _spawn(kind: str, *args: str) -> object:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (proc.stderr.strip().splitlines() or ["no result"])[-1][:300]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--only", nargs="*", help="workload names of CASES to run")
    parser.add_argument(
        "--estimates-only",
        metavar="TRUTH_JSON",
        help="no GPU: the estimate-only answers again, beside a committed run's true answers",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.estimates_only:
        estimates_only(args.estimates_only, args.out)
        return
    if args.child:
        _child(args.child[0], args.child[1:])
        return
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name, spec, precision, budgets in CASES:
            if args.only and name not in args.only:
                continue
            for gib in budgets:
                jobs.append(
                    (
                        {"workload": name, "spec": spec, "precision": precision, "budget_gib": gib},
                        pool.submit(_spawn, "fit", spec, precision, str(gib)),
                    )
                )
        compares = (
            []
            if args.skip_compare
            else [
                pool.submit(_spawn, "compare", spec, str(batch))
                for spec, batch in (("example:cnn", 128), ("hf:gpt2/seq=1024", 8))
            ]
        )
        rows = []
        for base, future in jobs:
            row = {**base, **future.result()}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "trials"}), flush=True)
        savings = []
        for future in compares:
            result = future.result()
            savings.extend(result if isinstance(result, list) else [result])
    import torch

    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    print(
        f"\n{'workload':26s} {'budget':>7s} {'true':>6s} {'estimate':>9s} {'err':>7s} "
        f"{'verify':>7s} {'trials':>6s}  scanned (r: runs, x: out of memory)"
    )
    for r in rows:
        if "error" in r or r.get("true") is None:
            print(
                f"{r['workload']:26s} {r['budget_gib']:5d}G ERROR {r.get('error')} {r.get('estimate')} {r.get('verify')}"
            )
            continue
        scan = r.get("scan") or {}
        marks = "".join("r" if v == "fits" else "x" for v in scan.values())
        print(
            f"{r['workload']:26s} {r['budget_gib']:5d}G {r['true']:6d} {r['estimate']:9d} "
            f"{r['estimate_error_pct']:6.1f}% {r['verify']!s:>7s} {r['verify_trials']!s:>6s}  "
            f"{min(scan, key=int) if scan else ''}: {marks}"
        )
    diffs = [abs(s["difference_pp"]) for s in savings if s.get("difference_pp") is not None]
    if diffs:
        print(
            f"\ncompare: estimated vs measured saving, worst {max(diffs):.1f} pp over {len(diffs)} strategies"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"meta": meta, "fit": rows, "compare_savings": savings}, indent=1)
        )


if __name__ == "__main__":
    main()
