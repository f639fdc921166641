"""Every number an estimate gives, for a set of workloads: to show that a change kept them.

Usage: python benchmarks/estimate_fingerprint.py --out before.json [--quick]
       python benchmarks/estimate_fingerprint.py --compare before.json after.json

For each case, the estimate's report (every key but timings) and a digest of its trace: the
allocation events in order, what is known of each block (size, step, phase, kind, module,
op, when it was freed), the phase marks, the workspace fall-backs. Two runs of the same code
give the same file; a refactoring that changes no behaviour gives the same file too.
``--compare`` prints the cases that differ, and the first differing keys of each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

# (name, spec, batch size, options for estimate())
CASES: list[tuple[str, str, int, dict[str, Any]]] = [
    ("cnn", "example:cnn", 64, {}),
    ("cnn-bf16", "example:cnn", 64, {"precision": "bf16-mixed"}),
    ("cnn-acc2", "example:cnn", 32, {"accumulate": 2}),
    ("cnn-expandable", "example:cnn", 64, {"allocator_config": "expandable_segments:True"}),
    ("cnn-split", "example:cnn", 128, {"allocator_config": "max_split_size_mb:64"}),
    ("cnn-capped", "example:cnn", 217, {"memory": "2GiB", "reserved_limit": 2 << 30}),
    ("cnn-t4", "example:cnn", 64, {"gpu": "t4"}),
    ("gpt", "example:gpt", 16, {}),
    ("gpt-16mixed", "example:gpt", 16, {"precision": "16-mixed"}),
    ("gpt-bf16true", "example:gpt", 16, {"precision": "bf16-true"}),
    ("gpt-roundup", "example:gpt", 16, {"allocator_config": "roundup_power2_divisions:4"}),
    ("gpt-a100", "example:gpt", 16, {"gpu": "a100-40gb", "precision": "bf16-mixed"}),
    ("gpt-v100", "example:gpt", 8, {"gpu": "v100-32gb", "precision": "16-mixed"}),
    (
        "gpt-gc",
        "example:gpt",
        32,
        {"allocator_config": "garbage_collection_threshold:0.6", "reserved_limit": 3 << 30},
    ),
    ("hf-gpt2", "hf:gpt2/seq=256", 4, {"precision": "bf16-mixed"}),
    ("hf-gpt2-ckpt", "hf:gpt2/seq=256/ckpt", 4, {}),
    ("hf-bert-infer", "hf:bert-base@infer/seq=128", 8, {}),
    ("hf-opt-acc", "hf:opt-125m/seq=256", 2, {"accumulate": 2, "precision": "16-mixed"}),
    ("hf-llama-1b-true", "hf:llama-1b/seq=256", 1, {"precision": "bf16-true"}),
    # benchmarks/estimate_speed.py's cases
    ("speed-bert-base", "hf:bert-base/seq=512", 16, {}),
    ("speed-gpt2", "hf:gpt2/seq=1024", 16, {"precision": "bf16-mixed"}),
    ("speed-opt-350m", "hf:opt-350m/seq=1024", 8, {"precision": "bf16-mixed"}),
    ("speed-gpt2-medium", "hf:gpt2-medium/seq=1024", 8, {"precision": "bf16-mixed"}),
    ("speed-llama-1b", "hf:llama-1b/seq=1024", 4, {"precision": "bf16-mixed"}),
    ("speed-llama-1b-true", "hf:llama-1b/seq=1024", 4, {"precision": "bf16-true"}),
    ("speed-llama-7b", "hf:llama-7b/seq=1024", 1, {"precision": "bf16-mixed"}),
]
QUICK = {"cnn", "cnn-bf16", "cnn-expandable", "gpt", "gpt-16mixed", "hf-gpt2", "hf-bert-infer"}
TIMINGS = {"seconds", "trace_seconds", "build_seconds", "step_seconds", "created_at"}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _events_in_order(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The events, each run of frees sorted: the order in which one Python statement drops
    several tensors (a tuple's items, a collected cycle) varies between processes, and a run
    of frees leaves the allocator in the same state in any order."""
    out: list[tuple[Any, ...]] = []
    run: list[tuple[Any, ...]] = []
    for event in events:
        if event[0] == "free":
            run.append(event)
            continue
        out += sorted(run)
        run = []
        out.append(event)
    return out + sorted(run)


def _trace_digest(trace: Any) -> str:
    h = hashlib.sha256()
    h.update(repr(_events_in_order(trace.events)).encode())
    h.update(repr(trace.marks).encode())
    h.update(repr(trace.step_starts).encode())
    h.update(repr(sorted(trace.fallbacks.items(), key=repr)).encode())
    for bid in sorted(trace.blocks):
        b = trace.blocks[bid]
        h.update(
            repr(
                (bid, b.size, b.step, b.phase, b.micro, b.kind, b.module, b.op, b.freed_phase,
                 b.freed_step)
            ).encode()
        )  # fmt: skip
    return h.hexdigest()


def run(names: set[str] | None) -> dict[str, Any]:
    from vramscope.estimate import estimator

    captured: list[Any] = []
    original = estimator.trace_workload

    def capture(*args: Any, **kwargs: Any) -> Any:
        trace = original(*args, **kwargs)
        captured.append(trace)
        return trace

    estimator.trace_workload = capture
    out: dict[str, Any] = {}
    try:
        for name, spec, batch, options in CASES:
            if names is not None and name not in names:
                continue
            options = dict(options)
            gpu = options.pop("gpu", "h200")
            t = time.perf_counter()
            try:
                report = estimator.estimate(spec, batch, gpu=gpu, **options)
            except Exception as exc:  # a failure is an output too
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:22s} ERROR {exc}", flush=True)
                continue
            trace = captured.pop()
            out[name] = {"report": _strip(report.to_dict()), "trace": _trace_digest(trace)}
            print(
                f"{name:22s} {report.peak.allocated_bytes:>14,d} {report.peak.reserved_bytes:>14,d}"
                f" {time.perf_counter() - t:6.1f} s",
                flush=True,
            )
            captured.clear()
    finally:
        estimator.trace_workload = original
    return out


def _first_differences(a: Any, b: Any, path: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        found: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                found.append(f"{path}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                found += _first_differences(a[k], b[k], f"{path}.{k}")
        return found
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        found = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found += _first_differences(x, y, f"{path}[{i}]")
        return found
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def compare(before: Path, after: Path) -> int:
    a = json.loads(before.read_text())["cases"]
    b = json.loads(after.read_text())["cases"]
    differing = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'after' if name not in a else 'before'}")
            continue
        diffs = _first_differences(a[name], b[name])
        if diffs:
            differing += 1
            print(f"{name}: {len(diffs)} differences, first: {'; '.join(diffs[:5])}")
    compared = len(set(a) & set(b))
    print(f"{compared - differing} of {compared} cases identical")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help=f"only {sorted(QUICK)}")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    names = set(args.only) if args.only else (QUICK if args.quick else None)
    import torch

    result = {"torch": torch.__version__, "cases": run(names)}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
