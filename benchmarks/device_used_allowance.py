"""Where the zoo's device-used estimates fall short, and the allowance that bounds them.

Usage: python benchmarks/device_used_allowance.py
           [--accuracy benchmarks/results/zoo_accuracy_h200.json]
           [--estimates benchmarks/results/zoo_estimates_cpu.json]
           [--measured benchmarks/results/zoo_measured_h200.json]
           [--out benchmarks/results/device_used_allowance_h200.json]
           [--fixture tests/data/zoo_device_used_h200.json]

Device used = reserved + the memory outside the allocator (the CUDA context, loaded kernels,
library handles). For every compared model it splits the estimate's error into the two, and
checks the allowance of :mod:`vramscope.estimate.allowance` with a split: the models are
halved by a hash of their id; the allowance's figures are derived on one half (the 95th
percentile of the lazily loaded kernels beyond the calibrated context, and of the reserved
shortfall of training steps with cuDNN convolutions, by precision) and judged on the other:
how many models each half under-estimates, and the median error, without and with the
allowance. ``--fixture`` writes the few numbers per model the CPU tests read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from vramscope.estimate.allowance import CUDNN_CONV_TRAINING_PCT  # noqa: E402
from vramscope.estimate.profiles import get_profile  # noqa: E402

RESULTS = HERE / "results"
MiB = 1 << 20
QUANTILE = 95  # the share of models the bound should hold for


def half_of(workload_id: str) -> int:
    """0: the half the allowance is derived on; 1: the half it is judged on."""
    return int(hashlib.md5(workload_id.encode()).hexdigest(), 16) % 2


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def conv_precision(libraries: list[str]) -> str | None:
    """The precision a training step's cuDNN convolutions ran in (float32 over half when
    both did), None when its backward ran none."""
    found = [lib.split(":", 1)[1] for lib in libraries if lib.startswith("cudnn_conv_backward:")]
    return "float32" if "float32" in found else (found[0] if found else None)


LANGUAGE_TASKS = {"causal-lm", "masked-lm", "seq2seq-lm", "generate"}


def _older_conv(row: dict[str, Any], context: int) -> str | None:
    h200 = get_profile("h200")
    with_cudnn_backward = {
        h200.context_bytes(training=True, cudnn=True, cudnn_backward=True, cublas_threads=n)
        - h200.lazy_kernels_bytes
        for n in (0, 1, 2)
    }
    if context not in with_cudnn_backward:
        return None
    if row["library"] == "hf" and row["task"] in LANGUAGE_TASKS:
        return None
    return "float32" if row["precision"] == "32-true" else "half"


def rows_of(accuracy: dict, estimates: dict, measured: dict) -> list[dict[str, Any]]:
    """One entry per compared model (not estimated as a range): the numbers the split needs."""
    est = {r["id"]: r["estimate"] for r in estimates["rows"] if r.get("estimate")}
    meas = {r["id"]: r for r in measured["rows"]}
    lazy = get_profile("h200").lazy_kernels_bytes
    out = []
    for r in accuracy["rows"]:
        if "error_pct" not in r or "range_error_pct" in r or "device_used" not in r["error_pct"]:
            continue
        e, m = est[r["id"]], meas[r["id"]]
        if e["peak"].get("device_used_upper_bytes") is not None:
            allowance = 0  # the context is the point's; the allowances are the bound's
            conv = conv_precision(e["libraries"])
        elif "libraries" in e:
            allowance = sum((e.get("device_used_allowance") or {}).values()) + lazy
            conv = conv_precision(e["libraries"])
        else:
            # estimated before the libraries were recorded (and without the allowance):
            # a training step with cuDNN convolutions is one whose context has cuDNN's
            # backward kernels, in a workload that is not a language model
            allowance = 0
            conv = _older_conv(r, e["context_and_libraries_bytes"])
        out.append(
            {
                "id": r["id"],
                "precision": r["precision"],
                "conv": conv,
                "estimated_reserved": r["estimate"]["reserved_bytes"],
                "measured_reserved": r["measured"]["reserved_bytes"],
                "measured_device_used": r["measured"]["device_used_bytes"],
                # the context the estimate models, without its allowances
                "estimated_context": e["context_and_libraries_bytes"] - allowance,
                "measured_context": m["context_and_libraries_bytes"],
            }
        )
    return out


def derive(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The allowance's figures from these rows: lazily loaded kernels (MiB, rounded up to
    the 2 MiB page) and the reserved share per precision of cuDNN convolutions (per cent)."""
    beyond = [(r["measured_context"] - r["estimated_context"]) / MiB for r in rows]
    pages = 2 * math.ceil(percentile(beyond, QUANTILE) / 2 - 1e-9)
    shares = {}
    for precision in CUDNN_CONV_TRAINING_PCT:
        short = [
            100 * max(0, r["measured_reserved"] - r["estimated_reserved"]) / r["estimated_reserved"]
            for r in rows
            if r["conv"] == precision
        ]
        shares[precision] = {"models": len(short), "pct": round(percentile(short, QUANTILE), 2)}
    return {"lazy_kernels_mib": pages, "cudnn_conv_training": shares}


def device_used(r: dict[str, Any], lazy_mib: float, shares: dict[str, float]) -> int:
    """The estimate of device used with the given allowance (0 and {}: none)."""
    pct = shares.get(r["conv"], 0.0) if r["conv"] else 0.0
    return (
        r["estimated_reserved"]
        + r["estimated_context"]
        + int(lazy_mib * MiB)
        + int(r["estimated_reserved"] * pct / 100)
    )


def judge(rows: list[dict[str, Any]], lazy_mib: float, shares: dict[str, float]) -> dict:
    errors = [
        100 * (device_used(r, lazy_mib, shares) / r["measured_device_used"] - 1) for r in rows
    ]
    absolute = [abs(e) for e in errors]
    under = sum(1 for e in errors if e < 0)
    return {
        "models": len(rows),
        "under_estimated": under,
        "under_share_pct": round(100 * under / len(rows), 2) if rows else None,
        "median_abs_error_pct": round(statistics.median(absolute), 3) if rows else None,
        "p90_abs_error_pct": round(percentile(absolute, 90), 2),
    }


def breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each device-used under-estimate (without any allowance) split into its reserved and
    its context part."""
    out = {"reserved_only": 0, "context_only": 0, "both": 0, "models": 0}
    for r in rows:
        if device_used(r, 0, {}) >= r["measured_device_used"]:
            continue
        out["models"] += 1
        reserved = r["estimated_reserved"] < r["measured_reserved"]
        context = r["estimated_context"] < r["measured_context"]
        out[
            "both" if reserved and context else "reserved_only" if reserved else "context_only"
        ] += 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accuracy", default=str(RESULTS / "zoo_accuracy_h200.json"))
    parser.add_argument("--estimates", default=str(RESULTS / "zoo_estimates_cpu.json"))
    parser.add_argument("--measured", default=str(RESULTS / "zoo_measured_h200.json"))
    parser.add_argument("--out", default=str(RESULTS / "device_used_allowance_h200.json"))
    parser.add_argument("--fixture", default=None)
    args = parser.parse_args()
    rows = rows_of(
        *(json.loads(Path(p).read_text()) for p in (args.accuracy, args.estimates, args.measured))
    )
    halves = [[r for r in rows if half_of(r["id"]) == h] for h in (0, 1)]
    derived = derive(halves[0])
    lazy = derived["lazy_kernels_mib"]
    shares = {p: v["pct"] for p, v in derived["cudnn_conv_training"].items()}
    shipped_lazy = get_profile("h200").lazy_kernels_bytes / MiB
    document = {
        "quantile": QUANTILE,
        "derived_on_half_0": derived,
        "shipped": {
            "lazy_kernels_mib": shipped_lazy,
            "cudnn_conv_training_pct": CUDNN_CONV_TRAINING_PCT,
        },
        "under_estimates_without_allowance": breakdown(rows),
        "judged": {
            f"half_{h}": {
                "without_allowance": judge(part, 0, {}),
                "derived_allowance": judge(part, lazy, shares),
                "shipped_allowance": judge(part, shipped_lazy, CUDNN_CONV_TRAINING_PCT),
            }
            for h, part in enumerate(halves)
        },
    }
    out = Path(args.out)
    out.write_text(json.dumps(document, indent=1) + "\n")
    lines = [
        f"device used: {len(rows)} models compared, halved by a hash of their id "
        f"({len(halves[0])} derive, {len(halves[1])} judge)",
        f"derived on half 0 (p{QUANTILE}): lazily loaded kernels {lazy} MiB; cuDNN "
        "convolutions in training "
        + ", ".join(
            f"{p} {v['pct']} % of reserved ({v['models']} models)"
            for p, v in derived["cudnn_conv_training"].items()
        ),
        f"shipped: {shipped_lazy:g} MiB; "
        + ", ".join(f"{p} {v:g} %" for p, v in CUDNN_CONV_TRAINING_PCT.items()),
        "",
        f"{'half':6s} {'allowance':10s} {'models':>6s} {'under':>6s} {'share':>7s} "
        f"{'median':>7s} {'p90':>7s}",
    ]
    for name, judged in document["judged"].items():
        for kind, j in judged.items():
            lines.append(
                f"{name:6s} {kind.split('_')[0]:10s} {j['models']:6d} {j['under_estimated']:6d} "
                f"{j['under_share_pct']:6.2f}% {j['median_abs_error_pct']:6.3f}% "
                f"{j['p90_abs_error_pct']:6.2f}%"
            )
    b = document["under_estimates_without_allowance"]
    lines += [
        "",
        f"without the allowance {b['models']} models under-estimate device used: reserved "
        f"short only {b['reserved_only']}, context short only {b['context_only']}, both "
        f"{b['both']}",
    ]
    text = "\n".join(lines) + "\n"
    out.with_suffix(".txt").write_text(text)
    print(text)
    if args.fixture:
        Path(args.fixture).write_text(json.dumps({"rows": rows}, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
