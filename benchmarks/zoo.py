"""The zoo sweep on the CPU: every model of the zoo run for real on the CPU, then estimated for an H200.

Usage: python benchmarks/zoo.py [--only torchvision|timm|hf|layers] [--limit N] [--jobs 2]
                                [--timeout 600] [--fresh] [--redo-errors] [--ids ID ...]

The workloads are those of :mod:`zoo_models` (every torchvision builder, timm's smallest
model per family and its ``/ckpt`` variant, the transformers model types shrunk by
:mod:`zoo_hf`, the layers of :mod:`zoo_layers`). Each runs in its own forked process with a
timeout (:mod:`zoo_pool`), two at a time by default:

1. a real CPU step at batch 2 in 32-true (can torch run it at all? a model counts for
   coverage only when it can);
2. ``vramscope.estimate(spec, batch, gpu="h200", precision=...)`` at the sweep's batch.

Results go to ``benchmarks/results/zoo_estimates_cpu.json`` after every workload (a run
started again goes on from there: rows already there are kept, unless ``--fresh`` or, for
failed ones, ``--redo-errors``), and a table to ``zoo_estimates_cpu.txt``: per model, whether
it ran and estimated, the error class, the seconds and the peak; coverage per library;
errors grouped by class; the estimate's speed. ``zoo_measure.py`` measures the same rows on
a GPU and ``zoo_accuracy.py`` compares.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

from zoo_pool import first_line, run_all  # noqa: E402

RESULTS = HERE / "results"
OUT_JSON = RESULTS / "zoo_estimates_cpu.json"
# workload lists beside the sweep (zoo_models.py): models and heads it never traced
CHECKS = ("timm-variants", "hf-seqcls", "hf-heads", "hf-detection")
REAL_BATCH = 2
REAL_STEP_SGD_ABOVE = 250_000_000  # parameters: larger models take their real step with SGD
GPU = "h200"
SPEED_TARGET_MEDIAN_S = 3.0
SPEED_TARGET_MAX_S = 30.0  # every model up to 1B parameters
LARGE_PARAMETERS = 1_000_000_000


# ---- what goes wrong, in classes ---------------------------------------------------------------

_NUMBER = re.compile(r"\b\d+(\.\d+)?\b")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_PATHISH = re.compile(r"\(at [^()]*(\([^)]*\))?\)|\S+\.py:\d+")
_SHAPE = re.compile(r"\[[^\]]*\]|\([\d, ]+\)")


_TRACING = re.compile(r"^tracing \S+ failed in the (\w+) phase of step \d+: (.*)$")


def error_class(kind: str, message: str, spec: str = "") -> str:
    """A class of errors: the exception's type and its message with the particulars (the
    workload, numbers, names in quotes, shapes, file and line) taken out; a failed trace is
    classed by the error inside it and the phase it came in. At most 120 characters."""
    if spec:
        message = message.replace(spec, "SPEC")
    traced = _TRACING.match(message)
    if traced:
        kind, message = f"{kind} in {traced.group(1)}", traced.group(2)
    text = _PATHISH.sub("", message)
    text = _QUOTED.sub("'…'", text)
    text = _SHAPE.sub("[…]", text)
    text = _NUMBER.sub("N", text)
    text = " ".join(text.split())
    return f"{kind}: {text}"[:120]


def describe_error(exc: BaseException, spec: str = "") -> dict[str, str]:
    message = without_paths(first_line(exc))
    return {
        "type": type(exc).__name__,
        "message": message[:400],
        "class": error_class(type(exc).__name__, message, spec),
    }


def without_paths(text: str) -> str:
    """Text without this machine's directories (results are committed)."""
    for prefix, name in ((str(ROOT) + os.sep, ""), (sys.prefix, "<env>")):
        text = text.replace(prefix, name)
    return text


# ---- one workload ------------------------------------------------------------------------------


def real_step(row: dict[str, Any]) -> dict[str, Any]:
    """Build the workload on the CPU at batch 2 in 32-true and run one standard step."""
    import torch

    from vramscope.workload import StepRunner, resolve

    cpu = torch.device("cpu")
    start = time.perf_counter()
    out: dict[str, Any] = {"batch": REAL_BATCH}
    try:
        workload = resolve(row["spec"]).build(REAL_BATCH, cpu)
        out["parameters"] = sum(p.numel() for p in workload.model.parameters())
        if out["parameters"] > REAL_STEP_SGD_ABOVE and workload.optimizer is not None:
            # whether torch runs the step does not depend on the optimizer's state, which
            # would take gigabytes of this machine's memory
            trained = [p for p in workload.model.parameters() if p.requires_grad]
            workload.optimizer = torch.optim.SGD(trained, lr=1e-3)
            out["optimizer"] = "SGD"
        StepRunner(workload, cpu)()
        out["ran"] = True
    except Exception as exc:
        out["ran"] = False
        out["error"] = describe_error(exc, row["spec"])
    out["seconds"] = round(time.perf_counter() - start, 2)
    return out


def estimate_row(row: dict[str, Any]) -> dict[str, Any]:
    """``vramscope.estimate`` of the row for the H200: its peaks, notes and data-dependent
    values, and the seconds it took."""
    from vramscope.estimate.estimator import estimate

    start = time.perf_counter()
    try:
        report = estimate(row["spec"], row["batch"], gpu=GPU, precision=row["precision"])
    except Exception as exc:
        return {
            "ok": False,
            "error": describe_error(exc, row["spec"]),
            "seconds": round(time.perf_counter() - start, 2),
        }
    extra = report.extra.get("estimate", {})
    peak = report.peak
    return {
        "ok": True,
        "seconds": round(time.perf_counter() - start, 2),
        "peak": {
            "allocated_bytes": peak.allocated_bytes,
            "reserved_bytes": peak.reserved_bytes,
            "device_used_bytes": peak.device_used_bytes,
            # the upper bound: what the estimate cannot know allowed for
            "device_used_upper_bytes": extra.get("device_used_upper_bytes"),
            "step": peak.step,
            "phase": peak.phase,
        },
        "context_and_libraries_bytes": report.startup.context_and_libraries_bytes,
        # the cuDNN kernels and convolutions the step ran, and what the upper bound of device
        # used adds above the point (vramscope.estimate.allowance)
        "libraries": extra.get("libraries"),
        "device_used_allowance": extra.get("device_used_allowance"),
        "parameters": report.workload.get("parameters"),
        "notes": [without_paths(str(n)) for n in extra.get("notes", [])][:10],
        "data_dependent": [
            without_paths(json.dumps(d, default=str)) for d in extra.get("data_dependent", [])
        ][:10],
        "simulated_steps": extra.get("simulated_steps"),
        # values the trace could not know and assumed (detection's proposals, an MoE's
        # routing): the peak is the larger of two traces, the other one is the alternative
        "assumptions": [
            without_paths(f"{a['kind']} at {a['op']} ({a['where']}): {a['assumed']}")
            for a in extra.get("assumptions", [])
        ][:10],
        "assumption_variant": extra.get("assumption_variant"),
        "alternative_peak": {
            key: (extra.get("alternative_peak") or {}).get(key)
            for key in ("allocated_bytes", "reserved_bytes", "device_used_bytes")
        }
        if extra.get("alternative_peak")
        else None,
    }


def sweep_one(row: dict[str, Any], note: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """In a forked child: the real CPU step, then the estimate (each result sent as soon as
    it is known, so that a timeout in the estimate keeps the real step's)."""
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    if row.get("ran_on_gpu"):
        # a real step of it ran on the GPU (zoo_measure.py, --measured): none here
        real: dict[str, Any] = {"ran": True, "on": "gpu"}
    else:
        real = real_step(row)
    note({"real": real})
    return {"estimate": estimate_row(row)}


# ---- the results file --------------------------------------------------------------------------


def library_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in ("torch", "torchvision", "timm", "transformers", "peft", "accelerate"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def load(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "rows": []}


def write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(path)


def status(row: dict[str, Any]) -> str:
    """``estimated``, ``estimate failed``, ``not runnable`` (torch cannot run its step on the
    CPU: it does not count), ``timeout``/``crashed``, or ``pending``."""
    real, est = row.get("real"), row.get("estimate")
    if row.get("lost") and not est:
        return "lost" if real and real.get("ran") else "not runnable"
    if real is None:
        return "pending"
    if not real.get("ran"):
        return "not runnable"
    if row.get("cpu_only"):
        return "cpu only"
    if est is None:
        return "pending"
    return "estimated" if est.get("ok") else "estimate failed"


def counts(row: dict[str, Any]) -> bool:
    """Whether a row counts for coverage: its real step ran, and it is made for a GPU."""
    return bool((row.get("real") or {}).get("ran")) and not row.get("cpu_only")


def estimated(row: dict[str, Any]) -> bool:
    return bool((row.get("estimate") or {}).get("ok"))


def error_of(row: dict[str, Any]) -> dict[str, str] | None:
    """The estimate's error (or the loss of the child while it estimated)."""
    est = row.get("estimate") or {}
    if est.get("error"):
        err = est["error"]
        return {**err, "class": error_class(err["type"], err["message"], row["spec"])}
    if row.get("lost"):
        kind = "Timeout" if row["lost"].startswith("timeout") else "Crash"
        return {"type": kind, "message": row["lost"], "class": f"{kind}: {row['lost']}"}
    if row.get("harness_error"):
        return {"type": "Harness", "message": row["harness_error"], "class": row["harness_error"]}
    return None


def real_error(row: dict[str, Any]) -> dict[str, str] | None:
    """The real step's error, classed."""
    err = (row.get("real") or {}).get("error")
    if not err:
        return None
    return {**err, "class": error_class(err["type"], err["message"], row["spec"])}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    libraries: dict[str, Any] = {}
    for lib in sorted({r["library"] for r in rows}):
        mine = [r for r in rows if r["library"] == lib]
        counted = [r for r in mine if counts(r)]
        ok = [r for r in counted if estimated(r)]
        libraries[lib] = {
            "workloads": len(mine),
            "ran_real_step": len(counted),
            "not_runnable": sum(1 for r in mine if status(r) == "not runnable"),
            "cpu_only": sum(1 for r in mine if r.get("cpu_only")),
            "estimated": len(ok),
            "coverage_pct": round(100 * len(ok) / len(counted), 1) if counted else None,
        }
    counted = [r for r in rows if counts(r)]
    classes: dict[str, dict[str, Any]] = {}
    for row in counted:
        if estimated(row):
            continue
        err = error_of(row) or {"class": "?", "message": "?"}
        entry = classes.setdefault(err["class"], {"count": 0, "example": None, "specs": []})
        entry["count"] += 1
        entry["specs"].append(row["spec"])
        entry["example"] = entry["example"] or f"{row['spec']}: {err['message']}"
    not_runnable: dict[str, dict[str, Any]] = {}
    for row in rows:
        if status(row) != "not runnable":
            continue
        err = real_error(row) or {"class": row.get("lost", "?")}
        entry = not_runnable.setdefault(err["class"], {"count": 0, "specs": []})
        entry["count"] += 1
        entry["specs"].append(row["spec"])
    times = [r["estimate"]["seconds"] for r in counted if estimated(r)]
    small = [
        r["estimate"]["seconds"]
        for r in counted
        if estimated(r) and (r.get("real") or {}).get("parameters", 0) <= LARGE_PARAMETERS
    ]
    speed = None
    if times:
        speed = {
            "median_s": round(statistics.median(times), 2),
            "max_s": round(max(times), 2),
            "max_up_to_1b_s": round(max(small), 2) if small else None,
            "over_30s_up_to_1b": sum(1 for t in small if t > SPEED_TARGET_MAX_S),
            "target": f"median ≤{SPEED_TARGET_MEDIAN_S:g} s, ≤{SPEED_TARGET_MAX_S:g} s each up to 1B",
            "met": statistics.median(times) <= SPEED_TARGET_MEDIAN_S
            and all(t <= SPEED_TARGET_MAX_S for t in small),
        }
    ok = sum(1 for r in counted if estimated(r))
    return {
        "workloads": len(rows),
        "ran_real_step": len(counted),
        "estimated": ok,
        "coverage_pct": round(100 * ok / len(counted), 1) if counted else None,
        "libraries": libraries,
        "error_classes": dict(sorted(classes.items(), key=lambda kv: -kv[1]["count"])),
        "not_runnable_classes": dict(sorted(not_runnable.items(), key=lambda kv: -kv[1]["count"])),
        "speed": speed,
    }


def _gib(value: int | None) -> str:
    return f"{value / 2**30:8.3f}" if value is not None else "       -"


def table(document: dict[str, Any]) -> str:
    rows, summ = document["rows"], document["summary"]
    lines = [
        f"zoo sweep on the CPU, estimated for the {GPU.upper()} ({document['meta'].get('date')}; "
        + ", ".join(f"{k} {v}" for k, v in document["meta"].get("libraries", {}).items() if v)
        + ")",
        "",
        f"{'workload':78s} {'batch':>5s} {'precision':10s} {'status':16s} {'est s':>6s} "
        f"{'alloc GiB':>9s} {'resv GiB':>9s} {'used GiB':>9s}  error class",
    ]
    for row in rows:
        est = row.get("estimate") or {}
        peak = est.get("peak") or {}
        err = error_of(row) if counts(row) else real_error(row)
        lines.append(
            f"{row['spec'][:78]:78s} {row['batch']:5d} {row['precision']:10s} "
            f"{status(row):16s} {est.get('seconds', float('nan')):6.1f} "
            f"{_gib(peak.get('allocated_bytes')):>9s} {_gib(peak.get('reserved_bytes')):>9s} "
            f"{_gib(peak.get('device_used_bytes')):>9s}  {(err or {}).get('class', '')}"
        )
    lines += ["", "coverage (over the models whose real CPU step ran):"]
    for lib, s in summ["libraries"].items():
        pct = f"{s['coverage_pct']:.1f} %" if s["coverage_pct"] is not None else "-"
        lines.append(
            f"  {lib:12s} {s['estimated']:4d} of {s['ran_real_step']:4d} estimate ({pct}); "
            f"{s['not_runnable']} of {s['workloads']} workloads do not run on the CPU"
            + (f", {s['cpu_only']} run on the CPU only" if s["cpu_only"] else "")
        )
    pct = f"{summ['coverage_pct']:.1f} %" if summ["coverage_pct"] is not None else "-"
    lines.append(f"  {'all':12s} {summ['estimated']:4d} of {summ['ran_real_step']:4d} ({pct})")
    lines += ["", "estimate errors by class (models that ran a real step):"]
    for cls, entry in summ["error_classes"].items():
        lines.append(f"  {entry['count']:4d}  {cls}")
        lines.append(f"        e.g. {entry['example'][:200]}")
    lines += ["", "not runnable on the CPU (not counted), by class:"]
    for cls, entry in summ["not_runnable_classes"].items():
        lines.append(f"  {entry['count']:4d}  {cls}  ({', '.join(entry['specs'][:3])})")
    speed = summ.get("speed")
    if speed:
        lines += [
            "",
            f"estimate time: median {speed['median_s']} s, worst {speed['max_s']} s, worst up "
            f"to 1B parameters {speed['max_up_to_1b_s']} s ({speed['over_30s_up_to_1b']} over "
            f"30 s); target {speed['target']}: {'met' if speed['met'] else 'MISSED'}",
        ]
    return "\n".join(lines) + "\n"


def finish(path: Path, document: dict[str, Any]) -> None:
    document["summary"] = summary(document["rows"])
    write_json(path, document)
    path.with_suffix(".txt").write_text(table(document))


# ---- the command -------------------------------------------------------------------------------


def select(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.ids:
        rows = [r for r in rows if r["id"] in args.ids or r["spec"] in args.ids]
    if args.limit:
        rows = rows[: args.limit]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        choices=("torchvision", "timm", "hf", "layers", *CHECKS),
    )
    parser.add_argument("--limit", type=int, help="the first N workloads (in the list's order)")
    parser.add_argument("--ids", nargs="*", help="only these workload ids (or specs)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per workload")
    parser.add_argument("--out", default=str(OUT_JSON))
    parser.add_argument("--fresh", action="store_true", help="ignore an existing results file")
    parser.add_argument("--redo-errors", action="store_true", help="run failed rows again")
    parser.add_argument(
        "--measured",
        help="zoo_measure.py's results: the workloads measured there skip the CPU's real step",
    )
    args = parser.parse_args()

    os.chdir(ROOT)  # specs name files relative to the repository
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    # every library the children use, imported once here before they fork
    import timm  # noqa: F401
    import torch
    import torchvision  # noqa: F401
    import transformers

    # transformers imports lazily: its model registry (a scan of every model's package, about
    # a second) and the modules every model's code uses would otherwise be imported again in
    # each child, and counted in its estimate's seconds
    import transformers.generation.utils
    import transformers.masking_utils
    import transformers.modeling_layers
    import transformers.modeling_utils
    import transformers.models.auto.modeling_auto  # noqa: F401

    import vramscope.estimate.estimator
    import vramscope.hf_models
    import vramscope.workload  # noqa: F401
    import zoo_models

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(args.jobs, 1)))
    out = Path(args.out)
    document = load(out) if not args.fresh else {"meta": {}, "rows": []}
    known = {r["id"]: r for r in document.get("rows", [])}
    all_rows = zoo_models.workloads(args.only)
    on_gpu = set()
    if args.measured:
        on_gpu = {r["id"] for r in load(Path(args.measured))["rows"] if r.get("ok")}
    todo = []
    for row in select(all_rows, args):
        old = known.get(row["id"])
        if old is None or (args.redo_errors and status(old) not in ("estimated",)):
            todo.append({**row, "ran_on_gpu": True} if row["id"] in on_gpu else row)
    document["meta"] = {
        "date": datetime.date.today().isoformat(),
        "gpu_profile": GPU,
        "real_step": {"batch": REAL_BATCH, "precision": "32-true", "device": "cpu"},
        "estimated_on": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "jobs": args.jobs,
        },
        "libraries": library_versions(),
        "workloads_listed": len(all_rows),
    }
    order = {r["id"]: i for i, r in enumerate(all_rows)}
    lock = threading.Lock()
    started = time.perf_counter()
    done = 0

    def on_result(row: dict[str, Any], result: dict[str, Any]) -> None:
        nonlocal done
        with lock:
            known[row["id"]] = {**row, **result}
            document["rows"] = sorted(known.values(), key=lambda r: order.get(r["id"], 1e9))
            finish(out, document)
            done += 1
            est = known[row["id"]].get("estimate") or {}
            err = error_of(known[row["id"]]) or real_error(known[row["id"]])
            print(
                f"[{done}/{len(todo)} {time.perf_counter() - started:6.0f}s] "
                f"{row['id'][:80]:80s} {status(known[row['id']]):16s} "
                f"{est.get('seconds', 0):6.1f}s {(err or {}).get('class', '')[:80]}",
                flush=True,
            )

    print(f"{len(todo)} workloads to run ({len(all_rows)} listed)", flush=True)
    run_all(sweep_one, todo, on_result, jobs=args.jobs, timeout=args.timeout)
    document["meta"]["sweep_seconds"] = round(time.perf_counter() - started, 1)
    document["rows"] = sorted(known.values(), key=lambda r: order.get(r["id"], 1e9))
    finish(out, document)
    summ = document["summary"]
    print(
        "coverage" + table(document).split("\ncoverage", 1)[1]
        if summ["workloads"]
        else "nothing ran"
    )
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
