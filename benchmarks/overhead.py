"""Step-time overhead of ``vramscope.track()`` (default detail) as a user pays it.

The workload is nanoGPT's character-level GPT (6 layers, width 384, context 256, dropout 0.2,
bf16 autocast, fused AdamW, gradient clipping; ``scripts/nanogpt_train.py``'s ``TrainStep``,
batches copied from pinned host memory while the step runs), in four rows: batch 64 and
batch 8 training, batch-1 inference of 64 tokens, batch 64 under ``torch.compile``. In one
process, each round runs an untracked block of N steps and a block of N steps inside a
freshly entered ``vramscope.track()`` (the order alternates from round to round), every
step timed to a synchronize (``torch.cuda.synchronize()`` on CUDA), at N = 100 and
N = 1,000. Each row reports:

- **steady**: the steps after a session's first ``FIRST_STEPS`` (20) against the untracked
  blocks' steps after their first 20: each round's ratio of the two blocks' medians
  (``paired``, the median over rounds with a bootstrap 95 % interval) and the ratio of the
  pooled medians (``pooled``);
- **whole run**: the tracked block's wall time, entering and leaving ``track()`` included
  (its start, the first steps' full reads, model discovery, the allocator trace of the first
  steps, the sampler and NVML start; its stop, final reads and snapshot), against the
  untracked block's, per round (median, bootstrap interval) and pooled, at 100 and at 1,000
  steps;
- what the session's start and end cost (entering, leaving, the first 20 steps' time above
  the untracked steps'), and the whole-run figure those parts predict;
- beside each figure, the untracked steps' own spread: the interquartile range of their step
  times, and the same statistic taken between consecutive untracked blocks (an A/A
  comparison: what the harness reads when nothing differs).

``--journal-off`` adds a third kind of block, ``track(journal=None)``, to the 100-step
rounds, so that the journal's own cost can be read beside the default's.

What separates these figures from ``overhead_methods.py``'s (``results/overhead_h200.txt``,
+0.45 % median, +1.08 % worst, on the same kinds of rows):

1. It timed 12-30 steps in the middle of a session: each tracked block ran its first 18
   steps (the 16 that read every phase, plus 2) and a random number more (up to one sampler
   interval) untimed, and entering and leaving ``track()`` were outside the timing. A
   session's start, its first steps' full reads, the discovery of the model, the allocator
   trace of the first steps and its snapshots, and its stop were never counted; here they
   are the whole-run figure.
2. Its figure is the median over rounds of a block's median step against the mean of the
   untracked blocks' medians around it: a median of medians leaves out the 1 step in 24-48
   that reads the allocator and the steps the sampler's ticks land on. The steady figure here
   is a median too (the issue's definition), but over 80-980 steps of one session, whose
   read steps and ticks fall where a run's do; the whole-run figure counts every step.
3. Its step was ``StepRunner``'s: batches made on the device with ``torch.randint``, no
   dropout, no clipping, and ``float(loss)`` after backward, a synchronize in the middle of
   every step that lets the GPU drain while Python runs the tracking callbacks. nanoGPT's
   loop copies each batch from pinned host memory while the step runs and reads the loss
   only when it logs.
4. The committed cells were joined from several runs of different code (``--merge``; of two
   runs of a row, the larger kept), all measured before the default detail traced the
   allocator in its first steps and before the journal existed (the run's record written as
   it goes, on by default in ``track()``): the code measured is not the code shipped.
5. Blocks of 0.05-0.3 s, paired with their neighbours, against the issue's 100-step blocks;
   per-round ratios of short blocks hide a cost paid once per block in a median over rounds.

Usage: python benchmarks/overhead.py [--quick] [--out DIR] [--only ROW ...]
       [--rounds 16] [--long-rounds 2] [--steps 100 1000] [--journal-off] [--seed 0]
Writes DIR/overhead.json and DIR/overhead.txt. Runs on the CPU too (a tiny model; the
figures there say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import io
import itertools
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "scripts"))
sys.path.insert(0, str(HERE.parent / "src"))

import nanogpt_train as nanogpt  # noqa: E402

import vramscope  # noqa: E402

FIRST_STEPS = 20  # a session's steps left out of the steady figure (its start's)
BOOTSTRAP = 2000
ROWS: dict[str, dict] = {  # name -> TrainStep's arguments
    "b64-train": {"batch_size": 64},
    "b8-train": {"batch_size": 8},
    "b1-infer-64tok": {"batch_size": 1, "infer": True, "infer_length": 64},
    "b64-train-compiled": {"batch_size": 64, "compile": True},
}
TARGETS = {  # the default detail, 2.4-15 ms steps
    "steady_median_pct": 1.0,
    "steady_worst_pct": 2.0,
    "whole_100_pct": 2.0,
}


# ---- statistics (pure) ---------------------------------------------------------------------


def bootstrap_median(values: Sequence[float], seed: int, n: int = BOOTSTRAP) -> list[float] | None:
    """A 95 % percentile-bootstrap interval of the median of ``values`` (None under 3)."""
    if len(values) < 3:
        return None
    rng = random.Random(seed)
    k = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=k)) for _ in range(n))
    return [medians[int(0.025 * n)], medians[min(n - 1, int(0.975 * n))]]


def pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def pct_list(xs: list[float] | None) -> list[float] | None:
    return None if xs is None else [round(100 * x, 2) for x in xs]


def iqr_share(values: Sequence[float]) -> float | None:
    """The interquartile range of ``values`` as a share of their median."""
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def ratio_summary(ratios: list[float], seed: int) -> dict:
    """The median of per-round ratios, less one, with its bootstrap interval, in percent."""
    return {
        "median_pct": pct(statistics.median(ratios) - 1) if ratios else None,
        "ci95_pct": pct_list(
            None if (ci := bootstrap_median(ratios, seed)) is None else [c - 1 for c in ci]
        ),
        "rounds": len(ratios),
    }


def aa_summary(values: list[float], seed: int) -> dict:
    """Consecutive untracked blocks set against each other (what nothing reads as)."""
    ratios = [b / a for a, b in itertools.pairwise(values) if a > 0]
    out = ratio_summary(ratios, seed)
    out["spread_pct"] = pct(iqr_share(values))
    return out


def analyse(blocks: list[dict], sizes: list[int], seed: int) -> dict:
    """Steady and whole-run figures of one row from its blocks (see the docstring)."""
    kinds = sorted({b["kind"] for b in blocks if b["kind"] != "untracked"})
    out: dict = {"kinds": {}}
    by = {(b["kind"], b["steps"], b["round"]): b for b in blocks}
    rounds = sorted({(b["steps"], b["round"]) for b in blocks})
    untracked_after = [
        t for b in blocks if b["kind"] == "untracked" for t in b["times_ms"][FIRST_STEPS:]
    ]
    base_ms = statistics.median(untracked_after)
    out["step_ms_untracked"] = round(base_ms, 4)
    out["untracked_step_iqr_pct"] = pct(iqr_share(untracked_after))
    base_medians = [
        statistics.median(by["untracked", s, r]["times_ms"][FIRST_STEPS:]) for s, r in rounds
    ]
    out["untracked_steady_aa"] = aa_summary(base_medians, seed)
    for size in sizes:
        walls = [by["untracked", s, r]["wall_s"] for s, r in rounds if s == size]
        out[f"untracked_whole_{size}_aa"] = aa_summary(walls, seed + size)
    for kind in kinds:
        k: dict = {}
        ratios, tracked_after = [], []
        for s, r in rounds:
            if (kind, s, r) not in by:
                continue
            t = by[kind, s, r]["times_ms"][FIRST_STEPS:]
            u = by["untracked", s, r]["times_ms"][FIRST_STEPS:]
            tracked_after += t
            ratios.append(statistics.median(t) / statistics.median(u))
        k["steady"] = ratio_summary(ratios, seed)
        k["steady"]["pooled_pct"] = pct(statistics.median(tracked_after) / base_ms - 1)
        k["steady"]["cost_us_per_step"] = round(
            1000 * (statistics.median(tracked_after) - base_ms), 1
        )
        for size in sizes:
            pairs = [
                (by[kind, s, r], by["untracked", s, r])
                for s, r in rounds
                if s == size and (kind, s, r) in by
            ]
            if not pairs:
                continue
            whole = ratio_summary([t["wall_s"] / u["wall_s"] for t, u in pairs], seed + size)
            whole["pooled_pct"] = pct(
                sum(t["wall_s"] for t, _ in pairs) / sum(u["wall_s"] for _, u in pairs) - 1
            )
            whole["extra_ms_per_block"] = round(
                1000 * statistics.median(t["wall_s"] - u["wall_s"] for t, u in pairs), 2
            )
            k[f"whole_{size}"] = whole
        # the session's parts, from its blocks: entering, leaving, and its first steps' time
        # above the untracked block's median step (the round's)
        parts = [(by[kind, s, r], by["untracked", s, r]) for s, r in rounds if (kind, s, r) in by]
        enter = statistics.median(t["enter_ms"] for t, _ in parts)
        leave = statistics.median(t["exit_ms"] for t, _ in parts)
        first = statistics.median(
            sum(t["times_ms"][:FIRST_STEPS])
            - FIRST_STEPS * statistics.median(u["times_ms"][FIRST_STEPS:])
            for t, u in parts
        )
        steady_ms = k["steady"]["cost_us_per_step"] / 1000
        k["session"] = {
            "enter_ms": round(enter, 2),
            "exit_ms": round(leave, 2),
            "first_steps_extra_ms": round(first, 2),
            "fixed_ms": round(enter + leave + first, 2),
        }
        k["predicted_whole_pct"] = {
            str(n): round(100 * (enter + leave + first + (n - FIRST_STEPS) * steady_ms)
                          / (n * base_ms), 2)
            for n in sizes
        }  # fmt: skip
        out["kinds"][kind] = k
    return out


# ---- measuring -----------------------------------------------------------------------------


def _sync_for(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _compiled_graphs() -> int:
    with contextlib.suppress(Exception):
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    return 0


def run_block(
    step: Callable[[], None], n: int, device: torch.device, session_kwargs: dict | None
) -> dict:
    """``n`` steps, each timed to a synchronize; inside a fresh ``track()`` when
    ``session_kwargs`` is given, whose entering and leaving are timed into the block's wall
    time."""
    sync = _sync_for(device)
    gc.collect()  # an earlier block's garbage is nobody's cost here
    graphs = _compiled_graphs()
    times: list[float] = []
    enter_ms = exit_ms = None
    session = None
    sync()
    start = time.perf_counter()
    if session_kwargs is not None:
        session = vramscope.track(**session_kwargs)
        session.__enter__()
        enter_ms = (time.perf_counter() - start) * 1000
    try:
        for _ in range(n):
            t = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t)
    finally:
        if session is not None:
            interval = getattr(session._sampler, "interval_s", None)
            t = time.perf_counter()
            session.__exit__(None, None, None)
            sync()
            exit_ms = (time.perf_counter() - t) * 1000
    wall = time.perf_counter() - start
    block = {
        "wall_s": round(wall, 6),
        "times_ms": [round(x * 1000, 4) for x in times],
        "compiled_graphs": _compiled_graphs() - graphs,
    }
    if session is not None:
        schedule = session._phase_reads
        block.update(
            enter_ms=round(enter_ms or 0.0, 3),
            exit_ms=round(exit_ms or 0.0, 3),
            sampler_interval_s=interval,
            phase_reads=schedule.summary() if schedule is not None else None,
        )
    return block


# where a fresh session's time goes: each function's inclusive time (a function called
# inside another counts in both), over a few fresh sessions; missing names are skipped
PARTS = (
    "vramscope.tracking.session:Session.start",
    "vramscope.tracking.session:Session.stop",
    "vramscope.tracking.session:Session._count_objects",
    "vramscope.tracking.session:Session._read_light",
    "vramscope.tracking.session:Session._final_readings",
    "vramscope.tracking.session:Session._transition",
    "vramscope.tracking.session:Session._update_ended",
    "vramscope.tracking.session:Session._finish_step",
    "vramscope.tracking.session:Session.on_forward_start",
    "vramscope.tracking.session:Session.on_optimizer_end",
    "vramscope.tracking.session:_open_status",
    "vramscope.tracking.attribution:start_recorder",
    "vramscope.tracking.attribution:stop_recorder",
    "vramscope.tracking.attribution:Recorder.maybe_start_cuda",
    "vramscope.tracking.attribution:Recorder._pause_history",
    "vramscope.tracking.attribution:Recorder._resume_history",
    "vramscope.tracking.attribution:Recorder._end_window",
    "vramscope.tracking.attribution:Recorder._stop_cuda",
    "vramscope.tracking.attribution:Recorder.census",
    "vramscope.journal.writer:open_journal",
    "vramscope.journal.writer:JournalWriter.on_steps",
    "vramscope.journal.writer:JournalWriter.close",
    "vramscope.tracking.hooks:GlobalHooks.install",
    "vramscope.tracking.hooks:GlobalHooks.remove",
    "vramscope.tracking.hooks:_set_discovering",
    "vramscope.tracking.sampler:Sampler.start",
    "vramscope.tracking.sampler:Sampler.stop",
    "vramscope.tracking.sampler:Sampler.sample_now",
    "vramscope.sources.host:ProcessTreeRss.read",
    "vramscope.sources.host:ProcessTreeRss._relist",
    "vramscope.sources.allocator:PeakLedger.read_for_tracking",
)


def session_parts(
    step: Callable[[], None], device: torch.device, sessions: int = 3, steps: int = 30
) -> dict:
    """Calls and inclusive time per fresh session of ``steps`` steps, by function."""
    import importlib

    totals: dict[str, list[float]] = {}
    undo: list[tuple[object, str, object]] = []

    def timed(label: str, function: Callable) -> Callable:
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                entry = totals.setdefault(label, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - t

        return wrapper

    for target in PARTS:
        module_name, path = target.split(":")
        with contextlib.suppress(Exception):
            owner = importlib.import_module(module_name)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            original = owner.__dict__[name]
            undo.append((owner, name, original))
            setattr(owner, name, timed(path, original))
    sync = _sync_for(device)
    try:
        for _ in range(sessions):
            gc.collect()
            with vramscope.track(**KINDS["default"]):
                for _ in range(steps):
                    step()
                    sync()
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)
    return {
        label: {
            "calls_per_session": round(calls / sessions, 1),
            "ms_per_session": round(seconds / sessions * 1000, 3),
            "us_per_call": round(seconds / calls * 1e6, 1),
        }
        for label, (calls, seconds) in sorted(totals.items(), key=lambda kv: -kv[1][1])
    }


KINDS = {  # block kind -> track()'s arguments (None: untracked)
    "untracked": None,
    "default": {"name": "overhead"},
    "journal-off": {"name": "overhead", "journal": None},
}


def bench_row(
    name: str,
    device: torch.device,
    cfg: nanogpt.GPTConfig,
    sizes: list[int],
    rounds: dict[int, int],
    kinds: list[str],
    seed: int,
    warmup: int,
) -> dict:
    options = dict(ROWS[name])
    if options.get("infer"):
        options["infer_length"] = min(options["infer_length"], cfg.block_size)
    built = time.perf_counter()
    step = nanogpt.TrainStep(cfg, device=device, **options)
    sync = _sync_for(device)
    for _ in range(warmup):
        step()
    sync()
    warm_s = time.perf_counter() - built
    # a process's first session imports what tracking uses and starts NVML: once per process
    first = run_block(step, FIRST_STEPS + 10, device, KINDS["default"])
    first_report_ms = None
    blocks: list[dict] = []
    for size in sizes:
        for r in range(rounds[size]):
            order = kinds if r % 2 == 0 else kinds[::-1]  # the order alternates
            if size != sizes[0]:  # the journal comparison runs in the short blocks
                order = [k for k in order if k != "journal-off"]
            for kind in order:
                block = run_block(step, size, device, KINDS[kind])
                block.update(kind=kind, steps=size, round=r)
                blocks.append(block)
        print(f"  {name}: {rounds[size]} rounds of {size} steps done", file=sys.stderr)
    # what making the report costs after a block (not in any figure): once, after the rounds
    session = vramscope.track(**KINDS["default"])
    with session:
        for _ in range(sizes[0]):
            step()
        sync()
    t = time.perf_counter()
    session.report()
    first_report_ms = round((time.perf_counter() - t) * 1000, 1)
    parts = session_parts(step, device)
    result = {
        "row": name,
        **{k: v for k, v in options.items() if k != "infer_length" or options.get("infer")},
        "build_and_warmup_s": round(warm_s, 2),
        "first_session_in_process": {
            "enter_ms": first["enter_ms"],
            "exit_ms": first["exit_ms"],
            "first_steps_ms": round(sum(first["times_ms"][:FIRST_STEPS]), 2),
        },
        "report_ms": first_report_ms,
        **analyse(blocks, sizes, seed),
        "session_parts": parts,
        "blocks": blocks,
    }
    step = None  # type: ignore[assignment]  # free the model before the next row
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# ---- output --------------------------------------------------------------------------------


def _fmt(summary: dict | None, key: str = "median_pct") -> str:
    if not summary or summary.get(key) is None:
        return "n/a"
    ci = summary.get("ci95_pct")
    text = f"{summary[key]:+.2f}%"
    if ci:
        text += f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"
    return text


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def render(doc: dict) -> str:
    """The text table of a results document."""
    out = io.StringIO()
    meta = doc["meta"]
    sizes = meta["steps"]
    print(
        f"vramscope.track() overhead, default detail: {meta['device']}, torch {meta['torch']}, "
        f"{meta['date']}",
        file=out,
    )
    print(
        "steady: steps after a session's first 20, per-round ratio of medians (bootstrap 95 %);"
        "\nwhole N: the block's wall time with entering and leaving track(), per round; "
        "A/A: consecutive untracked blocks set against each other",
        file=out,
    )
    for r in doc["results"]:
        if "error" in r:
            print(f"\n{r['row']}: ERROR {r['error']}", file=out)
            continue
        print(
            f"\n{r['row']}: untracked step {r['step_ms_untracked']:.3f} ms, its IQR "
            f"{_share(r['untracked_step_iqr_pct'])} of a step; blocks' medians A/A "
            f"{_fmt(r['untracked_steady_aa'])}",
            file=out,
        )
        for kind, k in r["kinds"].items():
            s = k["steady"]
            print(
                f"  {kind:12s} steady {_fmt(s)} (pooled {s['pooled_pct']:+.2f}%, "
                f"{s['cost_us_per_step']:.0f} µs/step)",
                file=out,
            )
            for n in sizes:
                w = k.get(f"whole_{n}")
                if w is None:
                    continue
                aa = r[f"untracked_whole_{n}_aa"]
                print(
                    f"  {'':12s} whole {n:5d} steps {_fmt(w)} (pooled {w['pooled_pct']:+.2f}%, "
                    f"{w['extra_ms_per_block']:+.1f} ms/block; predicted "
                    f"{k['predicted_whole_pct'][str(n)]:+.2f}%)  untracked A/A {_fmt(aa)}, "
                    f"blocks' IQR {_share(aa['spread_pct'])}",
                    file=out,
                )
            p = k["session"]
            print(
                f"  {'':12s} session: enter {p['enter_ms']:.1f} ms, exit {p['exit_ms']:.1f} ms, "
                f"first {FIRST_STEPS} steps {p['first_steps_extra_ms']:+.1f} ms: "
                f"{p['fixed_ms']:.1f} ms a session",
                file=out,
            )
        print("  where a fresh session of 30 steps spends its time (inclusive, ms):", file=out)
        for label, part in list(r["session_parts"].items())[:12]:
            print(
                f"    {label:38s} {part['ms_per_session']:8.2f} ms in {part['calls_per_session']:g}"
                f" calls ({part['us_per_call']:.0f} µs each)",
                file=out,
            )
        f = r["first_session_in_process"]
        print(
            f"  (the process's first session: enter {f['enter_ms']:.1f} ms, exit "
            f"{f['exit_ms']:.1f} ms; a report after 100 steps: {r['report_ms']} ms)",
            file=out,
        )
    ok = [r for r in doc["results"] if "error" not in r and "default" in r["kinds"]]
    if ok:
        steady = [r["kinds"]["default"]["steady"]["median_pct"] for r in ok]
        whole = [r["kinds"]["default"].get(f"whole_{sizes[0]}", {}).get("median_pct") for r in ok]
        whole = [w for w in whole if w is not None]
        print(
            f"\ndefault detail over {len(ok)} rows: steady median {statistics.median(steady):+.2f}%"
            f", worst {max(steady):+.2f}% (targets <= {TARGETS['steady_median_pct']}% and <= "
            f"{TARGETS['steady_worst_pct']}%); whole {sizes[0]}-step run worst "
            + (f"{max(whole):+.2f}%" if whole else "n/a")
            + f" (target <= {TARGETS['whole_100_pct']}%)",
            file=out,
        )
        print("  " + verdict(ok, sizes[0]), file=out)
    return out.getvalue()


def verdict(rows: list[dict], size: int) -> str:
    """Met, not met, or not resolved (an interval reaches across a target)."""
    steady = [r["kinds"]["default"]["steady"] for r in rows]
    whole = [r["kinds"]["default"].get(f"whole_{size}") for r in rows]
    medians = [s["median_pct"] for s in steady]
    met = (
        statistics.median(medians) <= TARGETS["steady_median_pct"]
        and max(medians) <= TARGETS["steady_worst_pct"]
        and all(w and w["median_pct"] <= TARGETS["whole_100_pct"] for w in whole)
    )
    unresolved = [
        r["row"]
        for r, s, w in zip(rows, steady, whole, strict=True)
        for summary, target in ((s, TARGETS["steady_worst_pct"]), (w, TARGETS["whole_100_pct"]))
        if summary and summary.get("ci95_pct") and summary["ci95_pct"][0] <= target
        and summary["ci95_pct"][1] > target
    ]  # fmt: skip
    text = "targets met" if met else "targets NOT met"
    if unresolved:
        text += "; intervals reach across a target on: " + ", ".join(sorted(set(unresolved)))
    return text


def device_meta(device: torch.device) -> dict:
    meta = {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "vramscope": vramscope.__version__,
        "device": "cpu",
    }
    if device.type == "cuda":
        from vramscope.sources import nvml

        meta.update(
            device=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            driver=nvml.driver_version(),
        )
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, few short blocks")
    parser.add_argument("--out", default=None, help="a folder: overhead.json, overhead.txt")
    parser.add_argument("--only", nargs="*", choices=list(ROWS))
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the short blocks")
    parser.add_argument("--long-rounds", type=int, default=None, help="rounds of the long ones")
    parser.add_argument("--steps", type=int, nargs=2, default=None, metavar=("SHORT", "LONG"))
    parser.add_argument("--journal-off", action="store_true", help="also track(journal=None)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = nanogpt.GPTConfig()
    rows = list(args.only or ROWS)
    if device.type == "cpu":  # a smoke run: a tiny model, one thread on a shared machine
        torch.set_num_threads(1)
        cfg = nanogpt.SMALL
        if not args.only:  # inductor on the CPU compiles for minutes: only when asked
            rows.remove("b64-train-compiled")
    sizes = args.steps or ([30, 60] if args.quick else [100, 1000])
    if min(sizes) <= FIRST_STEPS:
        sys.exit(f"blocks need more than {FIRST_STEPS} steps")
    short, long = (3, 1) if args.quick else (16, 2)
    rounds = {sizes[0]: args.rounds or short, sizes[1]: args.long_rounds or long}
    kinds = ["untracked", "default"] + (["journal-off"] if args.journal_off else [])
    torch.manual_seed(args.seed)
    results = []
    for name in rows:
        warmup = 30 if ROWS[name].get("compile") else 10
        try:
            results.append(bench_row(name, device, cfg, sizes, rounds, kinds, args.seed, warmup))
        except Exception as exc:  # report and go on with the next row
            results.append({"row": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        row = {k: v for k, v in results[-1].items() if k != "blocks"}
        print(json.dumps(row), flush=True)
        text = write(args.out, device, cfg, sizes, rounds, args.seed, results)  # after every row
    print(text)


def write(
    out: str | None,
    device: torch.device,
    cfg: nanogpt.GPTConfig,
    sizes: list[int],
    rounds: dict[int, int],
    seed: int,
    results: list[dict],
) -> str:
    """The document so far, rendered (and written under ``out``): a run cut short keeps the
    rows it finished."""
    meta = device_meta(device)
    meta.update(steps=sizes, rounds={str(k): v for k, v in rounds.items()}, seed=seed,
                model=("small" if cfg is nanogpt.SMALL else "shakespeare-char"))  # fmt: skip
    doc = {"meta": meta, "targets": TARGETS, "results": results}
    text = render(doc)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "overhead.json").write_text(json.dumps(doc, indent=1))
        (folder / "overhead.txt").write_text(text)
    return text


if __name__ == "__main__":
    main()
