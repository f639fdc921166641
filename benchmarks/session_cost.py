"""A session's fixed cost taken apart: entering ``vramscope.track()``, its first steps, and
leaving it, part by part, for one code tree or two side by side.

Each code tree (``--src``, and ``--baseline`` when given) runs in its own processes, the
trees alternating process by process. A process builds a nanoGPT step (the rows of
``overhead.py``; the small model on the CPU), warms it up, and then runs ``--sessions``
blocks of ``--steps`` steps, untracked and tracked alternately, each step timed to a
synchronize. A tracked block is a fresh ``track()`` (the default detail) entered and left
around the steps, its parts timed with ``perf_counter``: the named functions below are
wrapped for the block, each call's inclusive time added to the part it ran in (entering,
the first ``FIRST_STEPS`` steps, the steps after, leaving; a call on another thread, the
sampler's, apart, as it is off the run's critical path). The process's first session
(imports, NVML's start) is kept apart, timed whole. A part a tree lacks is left out for it.

Printed: per tree, each part's median per session with its interquartile range over the
processes' sessions; entering, leaving and the first steps above the untracked ones; the
same for the other tree beside it.

Usage: python benchmarks/session_cost.py [--row b1-infer-64tok] [--baseline OLD/src]
       [--processes 4] [--sessions 12] [--steps 100] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MAIN = threading.get_ident()
FIRST_STEPS = 20
ROWS: dict[str, dict[str, Any]] = {  # as overhead.py's
    "b64-train": {"batch_size": 64},
    "b8-train": {"batch_size": 8},
    "b1-infer-64tok": {"batch_size": 1, "infer": True, "infer_length": 64},
}
# module:qualname, timed inclusively; a function called inside another counts in both
PARTS = [
    "vramscope.tracking.session:Session.start",
    "vramscope.tracking.session:Session.stop",
    "vramscope.tracking.session:Session.report",
    "vramscope.sources.allocator:PeakLedger.install",
    "vramscope.sources.allocator:PeakLedger.uninstall",
    "vramscope.tracking.session:Session._ensure_device",
    "vramscope.sources.nvml:device_by_uuid",
    "vramscope.tracking.session:Session._read_light",
    "vramscope.sources.host:ProcessTreeRss.read",
    "vramscope.tracking.hooks:GlobalHooks.install",
    "vramscope.tracking.hooks:GlobalHooks.remove",
    "vramscope.tracking.hooks:GlobalHooks.set_discovery",
    "vramscope.tracking.attribution:start_recorder",
    "vramscope.tracking.attribution:stop_recorder",
    "vramscope.tracking.attribution:Recorder.census",
    "vramscope.tracking.attribution:Recorder._pause_history",
    "vramscope.tracking.session:_open_status",
    "vramscope.tracking.status:StatusWriter.close",
    "vramscope.journal.leftovers:prune",
    "vramscope.journal.writer:open_journal",
    "vramscope.journal.writer:JournalWriter.on_steps",
    "vramscope.journal.writer:JournalWriter.close",
    "vramscope.tracking.sampler:Sampler.sample_now",
    "vramscope.tracking.sampler:Sampler.start",
    "vramscope.tracking.sampler:Sampler.stop",
    "vramscope.tracking.session:Session._count_objects",
    "vramscope.tracking.session:Session._final_readings",
    "vramscope.tracking.session:Session._finish_step",
    "vramscope.tracking.session:Session.on_forward_start",
    "vramscope.tracking.session:Session.on_optimizer_end",
    "vramscope.tracking.session:Session._sample",
    "vramscope.sources.allocator:PeakLedger.read_for_tracking",
    "vramscope.tracking.categories:ObjectLedger.count",
    "vramscope.tracking.trace_windows:AllocatorTrace.start",
    "vramscope.tracking.trace_windows:AllocatorTrace.take",
    "vramscope.tracking.attribution:Recorder._final_census",
    "vramscope.tracking.attribution:Recorder._stop_cuda",
    "vramscope.sources.nvml:NvmlDevice.memory",
    "vramscope.sources.nvml:NvmlDevice.processes",
    "vramscope.sources.nvml:_init",
    "vramscope.journal.writer:JournalWriter._header_fields",
    "vramscope.journal.writer:JournalWriter.flush",
]


# ---- the child: one code tree, one process ---------------------------------------------------


class Clock:
    """Wraps the PARTS that exist; adds each call's time to the part of the block it ran in."""

    def __init__(self) -> None:
        self.where = "off"
        self.totals: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        """Wrap the parts (importing their modules: after the process's first session)."""
        for spec in PARTS:
            module_name, qualname = spec.split(":")
            try:
                owner: Any = importlib.import_module(module_name)
                *path, name = qualname.split(".")
                for attr in path:
                    owner = getattr(owner, attr)
                original = owner.__dict__[name]
            except (ImportError, AttributeError, KeyError):
                continue
            setattr(owner, name, self._wrap(qualname, original))
            self._undo.append((owner, name, original))

    def _wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if clock.where == "off":
                return function(*args, **kwargs)
            # (another thread's call is off the run's critical path: counted apart)
            where = clock.where if threading.get_ident() == MAIN else "other threads"
            t = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                key = (where, label)
                clock.totals[key] = clock.totals.get(key, 0.0) + time.perf_counter() - t
                clock.calls[key] = clock.calls.get(key, 0) + 1

        return timed

    def take(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (where, label), seconds in self.totals.items():
            out.setdefault(where, {})[label] = round(seconds * 1000, 4)
        self.totals.clear()
        self.calls.clear()
        return out


def child(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(HERE / "scripts"))
    import nanogpt_train as nanogpt

    t = time.perf_counter()
    import vramscope

    import_ms = (time.perf_counter() - t) * 1000
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = nanogpt.GPTConfig()
    if device.type == "cpu":
        torch.set_num_threads(1)
        cfg = nanogpt.SMALL
    options = dict(ROWS[args.row])
    if options.get("infer"):
        options["infer_length"] = min(options["infer_length"], cfg.block_size)
    step = nanogpt.TrainStep(cfg, device=device, **options)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    for _ in range(args.warmup):
        step()
    sync()
    clock = Clock()

    def block(tracked: bool) -> dict[str, Any]:
        gc.collect()
        sync()
        times: list[float] = []
        session = None
        start = time.perf_counter()
        if tracked:
            clock.where = "enter"
            session = vramscope.track()
            session.__enter__()
        enter = time.perf_counter()
        for i in range(args.steps):
            clock.where = "first steps" if i < FIRST_STEPS else "later steps"
            t = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t) * 1000)
        leave = time.perf_counter()
        if session is not None:
            clock.where = "exit"
            session.__exit__(None, None, None)
            sync()
        end = time.perf_counter()
        clock.where = "off"
        result: dict[str, Any] = {
            "enter_ms": (enter - start) * 1000,
            "exit_ms": (end - leave) * 1000,
            "first_ms": sum(times[:FIRST_STEPS]),
            "later_step_ms": statistics.median(times[FIRST_STEPS:]),
            "wall_ms": (end - start) * 1000,
            "parts": clock.take(),
        }
        if session is not None:
            clock.where = "report"
            t = time.perf_counter()
            report = session.report()
            result["report_ms"] = (time.perf_counter() - t) * 1000
            clock.where = "off"
            result["parts"].update(clock.take())
            result["trace"] = _trace_windows(session, report)
        return result

    first = block(True)  # (before the parts are wrapped: it imports what tracking uses)
    clock.install()
    blocks = []
    for i in range(args.sessions):
        for tracked in (True, False) if i % 2 == 0 else (False, True):
            blocks.append({"tracked": tracked, **block(tracked)})
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"import_ms": import_ms, "first": first, "blocks": blocks, "device": name}
    print(json.dumps({**result, "torch": torch.__version__}))


def _trace_windows(session: Any, report: Any) -> dict[str, Any]:
    """Which steps the session's allocator trace recorded, in how many windows, and whether
    it held the run's peak (what the first steps' and later windows cost is for)."""
    recorder = getattr(session, "_attribution", None)
    trace = getattr(recorder, "_trace", None)
    schedule = getattr(recorder, "schedule", None)
    return {
        "windows": len(trace.windows) if trace is not None else 0,
        "marked": schedule.summary()["marked_steps"] if schedule is not None else [],
        "peak": [report.peak.step, report.peak.phase, report.peak.allocated_bytes],
        "source": report.extra.get("categories_source"),
    }


# ---- the parent: processes, alternating trees -------------------------------------------------


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = values[0] if values else 0.0
        return v, v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    tracked = [b for r in runs for b in r["blocks"] if b["tracked"]]
    plain = [b for r in runs for b in r["blocks"] if not b["tracked"]]
    plain_first = statistics.median(b["first_ms"] for b in plain)
    plain_step = statistics.median(b["later_step_ms"] for b in plain)
    out: dict[str, Any] = {
        "sessions": len(tracked),
        "untracked_step_ms": round(plain_step, 4),
        "untracked_first_steps_ms": round(plain_first, 3),
        "import_ms": round(statistics.median(r["import_ms"] for r in runs), 2),
    }
    figures = {
        "enter": [b["enter_ms"] for b in tracked],
        "exit": [b["exit_ms"] for b in tracked],
        "first steps above untracked": [b["first_ms"] - plain_first for b in tracked],
        "later step above untracked": [b["later_step_ms"] - plain_step for b in tracked],
        "fixed (enter + exit + first steps above)": [
            b["enter_ms"] + b["exit_ms"] + b["first_ms"] - plain_first for b in tracked
        ],
        "report (after exit)": [b["report_ms"] for b in tracked],
        "process's first session: enter": [r["first"]["enter_ms"] for r in runs],
        "process's first session: exit": [r["first"]["exit_ms"] for r in runs],
    }
    out["figures"] = {k: [round(x, 3) for x in quartiles(v)] for k, v in figures.items()}
    traces = [b["trace"] for b in tracked if "trace" in b]
    if traces:
        windows = [t["windows"] for t in traces]
        out["trace"] = {
            "windows": [min(windows), statistics.median(windows), max(windows)],
            "sources": {
                s: sum(t["source"] == s for t in traces) for s in {t["source"] for t in traces}
            },
            "examples": traces[:3],
        }
    parts: dict[str, dict[str, list[float]]] = {}
    for b in tracked:
        for where, labels in b["parts"].items():
            for label, ms in labels.items():
                parts.setdefault(where, {}).setdefault(label, []).append(ms)
    out["parts"] = {
        where: {
            label: [round(x, 3) for x in quartiles(v + [0.0] * (len(tracked) - len(v)))]
            for label, v in sorted(labels.items(), key=lambda kv: -statistics.median(kv[1]))
        }
        for where, labels in parts.items()
    }
    return out


def render(trees: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    names = list(trees)
    lines = [
        f"a session's fixed cost, default detail: {meta['row']} on {meta['device']}, "
        f"torch {meta['torch']}, {meta['date']}",
        f"{meta['processes']} processes a tree x {meta['sessions']} sessions of "
        f"{meta['steps']} steps; ms: median [q1, q3] over sessions",
    ]
    for name in names:
        s = trees[name]
        lines.append(
            f"  {name}: untracked step {s['untracked_step_ms']:.3f} ms, first {FIRST_STEPS} "
            f"steps untracked {s['untracked_first_steps_ms']:.2f} ms, import vramscope "
            f"{s['import_ms']:.1f} ms"
        )
    width = 44

    def cell(q: list[float] | None) -> str:
        if q is None:
            return f"{'-':>26s}"
        return f"{q[1]:8.3f} [{q[0]:7.3f}, {q[2]:7.3f}]"

    lines.append(f"{'':{width}s}" + "".join(f"{n:>28s}" for n in names))
    for key in trees[names[0]]["figures"]:
        row = "".join(f"  {cell(trees[n]['figures'].get(key))}" for n in names)
        lines.append(f"{key:{width}s}{row}")
    for where in ("enter", "first steps", "exit", "report", "other threads"):
        labels: list[str] = []
        for n in names:
            for label in trees[n]["parts"].get(where, {}):
                if label not in labels:
                    labels.append(label)
        if not labels:
            continue
        lines.append(f"{where} (inclusive, ms per session):")
        for label in labels:
            row = "".join(f"  {cell(trees[n]['parts'].get(where, {}).get(label))}" for n in names)
            lines.append(f"  {label:{width - 2}s}{row}")
    for name in names:
        trace = trees[name].get("trace")
        if trace:
            low, mid, high = trace["windows"]
            lines.append(
                f"{name}: allocator trace windows a session {mid} [{low}..{high}]; categories "
                f"from {trace['sources']}; e.g. {trace['examples'][0]}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row", default="b1-infer-64tok", choices=list(ROWS))
    parser.add_argument("--src", default=str(HERE.parent / "src"))
    parser.add_argument("--baseline", default=None, help="another tree's src, side by side")
    parser.add_argument("--processes", type=int, default=4, help="per tree")
    parser.add_argument("--sessions", type=int, default=12, help="tracked blocks a process")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", default=None, help="a folder: session_cost.json and .txt")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = {"this tree": args.src}
    if args.baseline:
        trees = {"baseline": args.baseline, **trees}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    text = ""
    for i in range(args.processes):
        order = list(trees) if i % 2 == 0 else list(trees)[::-1]
        for name in order:
            env = dict(os.environ)
            extra = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (trees[name], extra) if p)
            command = [sys.executable, __file__, "--child", "--row", args.row]
            command += ["--sessions", str(args.sessions), "--steps", str(args.steps)]
            command += ["--warmup", str(args.warmup)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{name}: {done.stderr[-2000:]}")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {name}: process {i + 1} of {args.processes} done", file=sys.stderr)
        text = write(args, runs)  # after every round: a run cut short keeps what it has
    print(text)


def write(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    first = runs["this tree"][0]
    meta = {
        "row": args.row,
        "device": first["device"],
        "torch": first["torch"],
        "date": time.strftime("%Y-%m-%d"),
        "processes": len(runs["this tree"]),
        "sessions": args.sessions,
        "steps": args.steps,
    }
    summary = {name: summarize(r) for name, r in runs.items()}
    text = render(summary, meta)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"meta": meta, "trees": summary, "runs": runs}
        (folder / f"session_cost_{args.row}.json").write_text(json.dumps(doc, indent=1))
        (folder / f"session_cost_{args.row}.txt").write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
