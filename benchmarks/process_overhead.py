"""What ``vramscope run`` costs a real training script, process against process.

Runs ``python SCRIPT ARGS`` and ``python -m vramscope run SCRIPT ARGS`` in interleaved pairs
(the order alternates from pair to pair, so that a drift of the host over minutes falls on
both), each a fresh process, with the same interpreter and ``PYTHONPATH`` (this checkout's
``src`` first). The script times its own iterations (``iter N: ... time T ms`` lines; by
default ``scripts/nanogpt_train.py``, nanoGPT's character-level loop). For each process:
the median iteration after the first ``--skip`` (the steady figure), the sum of all its
iterations (the whole loop, a session's start and first steps included), and its wall time
(interpreter start, imports, the report). For each figure: the median over pairs of the
tracked/plain ratio with a bootstrap 95 % interval, the ratio of the medians of the
per-process medians, and beside it the plain processes' own spread: their IQR over their
median, and the same pairing taken between consecutive plain processes (an A/A comparison:
what the hosts read when nothing differs). Identical plain runs of nanoGPT's ``train.py``
differed by up to 37 % in median step on H200 hosts: a difference inside the A/A interval
is not resolved.

Usage: python benchmarks/process_overhead.py [--pairs 7] [--quick] [--out DIR]
       [--script benchmarks/scripts/nanogpt_train.py] [-- SCRIPT ARGS...]
Writes DIR/process_overhead.json and DIR/process_overhead.txt.
"""

from __future__ import annotations

import argparse
import datetime
import io
import itertools
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
DEFAULT_SCRIPT = HERE / "scripts" / "nanogpt_train.py"
ITERATION = re.compile(r"^iter (\d+): .*time ([0-9.]+) ?ms", re.MULTILINE)
BOOTSTRAP = 2000
TARGET_PCT = 2.0


def bootstrap_median(values: list[float], seed: int, n: int = BOOTSTRAP) -> list[float] | None:
    """A 95 % percentile-bootstrap interval of the median of ``values`` (None under 3)."""
    if len(values) < 3:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return [medians[int(0.025 * n)], medians[min(n - 1, int(0.975 * n))]]


def ratio_summary(ratios: list[float], seed: int) -> dict:
    ci = bootstrap_median(ratios, seed)
    return {
        "median_pct": round(100 * (statistics.median(ratios) - 1), 2) if ratios else None,
        "ci95_pct": None if ci is None else [round(100 * (c - 1), 2) for c in ci],
        "pairs": len(ratios),
    }


def iqr_pct(values: list[float]) -> float | None:
    if len(values) < 4:
        return round(100 * (max(values) - min(values)) / statistics.median(values), 2)
    q = statistics.quantiles(values, n=4)
    return round(100 * (q[2] - q[0]) / statistics.median(values), 2)


def run_process(command: list[str], env: dict[str, str], timeout: float) -> dict:
    """One process: its iteration times (ms) from its output, and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.perf_counter() - start
    times = [float(m.group(2)) for m in ITERATION.finditer(done.stdout)]
    result = {"wall_s": round(wall, 3), "iteration_ms": times, "returncode": done.returncode}
    if done.returncode != 0 or not times:
        result["error"] = (done.stderr or done.stdout)[-800:]
    return result


def summarize(pairs: list[dict], skip: int, seed: int) -> dict:
    """The figures of the pairs (see the docstring)."""
    figures = {
        "steady": lambda p: statistics.median(p["iteration_ms"][skip:]),
        "whole_loop": lambda p: sum(p["iteration_ms"]),
        "first_iterations": lambda p: sum(p["iteration_ms"][:skip]),
        "wall": lambda p: p["wall_s"],
    }
    out: dict = {}
    for name, value in figures.items():
        plain = [value(p["plain"]) for p in pairs]
        tracked = [value(p["tracked"]) for p in pairs]
        summary = ratio_summary([t / b for t, b in zip(tracked, plain, strict=True)], seed)
        summary["median_of_medians_pct"] = round(
            100 * (statistics.median(tracked) / statistics.median(plain) - 1), 2
        )
        summary["plain"] = round(statistics.median(plain), 3)
        summary["tracked"] = round(statistics.median(tracked), 3)
        summary["plain_iqr_pct"] = iqr_pct(plain)
        summary["plain_aa"] = ratio_summary([b / a for a, b in itertools.pairwise(plain)], seed)
        out[name] = summary
    return out


def verdict(steady: dict) -> str:
    ci = steady.get("ci95_pct")
    aa = steady["plain_aa"].get("ci95_pct")
    if ci is None:
        return "too few pairs for an interval"
    if ci[1] <= TARGET_PCT:
        return f"within {TARGET_PCT:g} % (the interval's top is under it)"
    if ci[0] > TARGET_PCT:
        return f"NOT within {TARGET_PCT:g} % (the whole interval is above it)"
    width = f"; plain A/A interval {aa[0]:+.2f}..{aa[1]:+.2f}%" if aa else ""
    return f"not resolved: the interval reaches across {TARGET_PCT:g} %{width}"


def render(doc: dict) -> str:
    out = io.StringIO()
    meta = doc["meta"]
    print(
        f"vramscope run against python, {meta['pairs']} interleaved pairs: "
        f"{' '.join(meta['script_args'])} ({meta['device']}, torch {meta['torch']}, "
        f"{meta['date']})",
        file=out,
    )
    units = {"steady": "ms", "whole_loop": "ms", "first_iterations": "ms", "wall": "s"}
    labels = {
        "steady": f"median iteration after the first {meta['skip']}",
        "whole_loop": "all iterations, summed",
        "first_iterations": f"the first {meta['skip']} iterations, summed",
        "wall": "process wall time",
    }
    for name, s in doc["figures"].items():
        ci = s["ci95_pct"]
        aa = s["plain_aa"]
        interval = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
        aa_text = f"{aa['median_pct']:+.2f}%" if aa["median_pct"] is not None else "n/a"
        if aa["ci95_pct"]:
            aa_text += f" [{aa['ci95_pct'][0]:+.2f}, {aa['ci95_pct'][1]:+.2f}]"
        print(
            f"  {labels[name]:38s} {s['plain']:9.3f} -> {s['tracked']:9.3f} {units[name]}: "
            f"pairs {s['median_pct']:+.2f}%{interval}, medians {s['median_of_medians_pct']:+.2f}%"
            f"; plain spread (IQR) {s['plain_iqr_pct']:.1f}%, plain A/A {aa_text}",
            file=out,
        )
    print(f"  steady: {verdict(doc['figures']['steady'])}", file=out)
    return out.getvalue()


def device_meta() -> dict:
    probe = (
        "import json, torch; d = torch.cuda.is_available(); print(json.dumps({"
        "'torch': torch.__version__, "
        "'device': torch.cuda.get_device_name(0) if d else 'cpu'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    try:
        meta = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        meta = {"torch": "?", "device": "?"}
    meta.update(date=datetime.date.today().isoformat(), python=platform.python_version())
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="the script's tiny model, few iters")
    parser.add_argument("--out", default=None, help="a folder: process_overhead.json, .txt")
    parser.add_argument("--script", default=str(DEFAULT_SCRIPT))
    parser.add_argument("--skip", type=int, default=20, help="iterations left out of steady")
    parser.add_argument("--timeout", type=float, default=600.0, help="per process, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: the script's")
    args = parser.parse_args()
    script_args = [a for a in args.script_args if a != "--"]
    if not script_args and Path(args.script) == DEFAULT_SCRIPT:
        script_args = ["--small", "--iters", "40", "--batch-size", "4"] if args.quick else []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    if args.quick:  # a shared CPU machine: one thread each
        env.setdefault("OMP_NUM_THREADS", "1")
    meta = device_meta()
    pairs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="vramscope-process-overhead-") as tmp:
        # the report written as a user would write one; each run its own file
        commands = {
            "plain": lambda i: [sys.executable, args.script, *script_args],
            "tracked": lambda i: [
                sys.executable, "-m", "vramscope", "run",
                "--json", str(Path(tmp) / f"run{i}.json"),
                args.script, *script_args,
            ],
        }  # fmt: skip
        for i in range(args.pairs):
            order = ["plain", "tracked"] if i % 2 == 0 else ["tracked", "plain"]
            pair: dict = {"order": order}
            for kind in order:
                pair[kind] = run_process(commands[kind](i), env, args.timeout)
                if "error" in pair[kind]:
                    sys.exit(f"{kind} run {i} failed:\n{pair[kind]['error']}")
            pairs.append(pair)
            print(
                f"pair {i}: plain {statistics.median(pair['plain']['iteration_ms'][args.skip :]):.3f}"
                f" ms, tracked {statistics.median(pair['tracked']['iteration_ms'][args.skip :]):.3f}"
                f" ms (median iteration)",
                file=sys.stderr,
                flush=True,
            )
    if any(len(p[k]["iteration_ms"]) <= args.skip for p in pairs for k in ("plain", "tracked")):
        sys.exit(f"the script printed {args.skip} iterations or fewer: lower --skip")
    meta.update(
        pairs=args.pairs,
        skip=args.skip,
        script=os.path.relpath(args.script, HERE.parent),
        script_args=[os.path.relpath(args.script, HERE.parent), *script_args],
        seed=args.seed,
    )
    doc = {"meta": meta, "figures": summarize(pairs, args.skip, args.seed), "pairs": pairs}
    text = render(doc)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "process_overhead.json").write_text(json.dumps(doc, indent=1))
        (out / "process_overhead.txt").write_text(text)


if __name__ == "__main__":
    main()
