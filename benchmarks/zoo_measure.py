"""The zoo sweep measured on a GPU: every workload of the CPU sweep, 3 real steps, allocator and NVML peaks.

Usage: python benchmarks/zoo_measure.py [--out benchmarks/results/zoo_measured_h200.json]
           [--jobs 12] [--timeout 120] [--budget 420] [--per-process 1] [--only LIB]
           [--ids ID ...] [--limit N] [--fresh] [--selftest]

The workloads are the rows of ``benchmarks/results/zoo_estimates_cpu.json`` (the same spec,
batch size and precision; the transformers configs are written out from the committed
``zoo_hf_configs.json``, so that the same models are built). Each is measured as
``vramscope measure SPEC --steps 3`` measures it: built on ``cuda``, three standard steps
(:class:`vramscope.workload.StepRunner`), ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` from before the build to the end, and device used = peak reserved +
the process's memory outside the allocator (what NVML reports for the process, less
reserved, at the end), read through :mod:`vramscope.sources.nvml`.

Workloads run in processes forked from this one (which imports torch, torchvision, timm and
transformers once and never initialises CUDA), ``--jobs`` of them sharing the GPU; a
workload starts only when the CPU estimates of those running and its own fit in the GPU's
memory. ``--per-process 1`` (the default) gives each workload a process of its own, so its
CUDA context is its own as under ``vramscope measure``; ``--per-process N`` runs N in one
process with the allocator reset between them (everything freed, ``gc.collect()``,
``empty_cache()``, cuBLAS workspaces cleared, peaks reset), faster but with a context that
grows with the kernels earlier workloads loaded (each row records its place in its process).
A workload that runs out of memory, fails or runs past ``--timeout`` is recorded with its
error. Results are written after every workload (a run cut short keeps what it measured;
started again, it measures only what is missing); no workload starts after ``--budget``
seconds. ``--selftest`` runs three workloads on the CPU through the same code.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
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

# is_available() through NVML: the parent may ask without creating a CUDA context, which a
# forked child could not use
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

from zoo import describe_error, library_versions, load, write_json  # noqa: E402
from zoo_pool import run_all  # noqa: E402

RESULTS = HERE / "results"
SWEEP_JSON = RESULTS / "zoo_estimates_cpu.json"
OUT_JSON = RESULTS / "zoo_measured_h200.json"
STEPS = 3
GIB = 2**30
# what a workload is booked for on the GPU when the CPU has no estimate of it
UNKNOWN_NEED = 16 * GIB
SELFTEST_SPECS = (
    "benchmarks/zoo_layers.py:conv2d",
    "benchmarks/zoo_layers.py:multihead_attention",
    "example:gpt",
)

_state: dict[str, Any] = {"in_process": 0}


def reset_allocator() -> None:
    """Free what the last workload left: its objects, the allocator's cache, the cuBLAS
    workspaces (kept per handle for the process's life), the peaks."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _nvml_device() -> Any:
    import torch

    from vramscope.sources import nvml

    uuid = "GPU-" + str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return nvml.device_by_uuid(uuid)


def measure_one(row: dict[str, Any], note: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """In a forked child: build the row's workload on the device, 3 standard steps, and the
    peaks (allocated, reserved, device used) from before the build to the end."""
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    import torch

    from vramscope.workload import StepRunner, build_workload, resolve

    device = torch.device(_state.get("device", "cuda"))
    cuda = device.type == "cuda"
    index = _state["in_process"]
    _state["in_process"] += 1
    out: dict[str, Any] = {"process_index": index, "pid": os.getpid()}
    if cuda:
        torch.cuda.set_device(device.index or 0)
        torch.cuda.init()
    reset_allocator()
    start = time.perf_counter()
    workload = runner = None
    steps: list[dict[str, int]] = []
    try:
        spec = resolve(row["spec"])
        workload = build_workload(spec.builder, row["batch"], device, spec.spec, row["precision"])
        workload = workload.with_overrides(precision=row["precision"])
        out["parameters"] = sum(p.numel() for p in workload.model.parameters())
        runner = StepRunner(workload, device)
        for _ in range(STEPS):
            runner()
            if cuda:
                torch.cuda.synchronize()
                steps.append(
                    {
                        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                    }
                )
        out["ok"] = True
    except torch.cuda.OutOfMemoryError as exc:
        out["ok"] = False
        out["error"] = {**describe_error(exc, row["spec"]), "class": "OutOfMemoryError"}
    except Exception as exc:
        out["ok"] = False
        out["error"] = describe_error(exc, row["spec"])
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["steps"] = steps
    if cuda:
        torch.cuda.synchronize()
        peak_reserved = torch.cuda.max_memory_reserved()
        out["peak"] = {
            "allocated_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes": peak_reserved,
            "device_used_bytes": None,
        }
        nvml_device = _nvml_device()
        own = nvml_device.process_used_bytes() if nvml_device is not None else None
        if own is not None:
            context = own - torch.cuda.memory_reserved()
            out["context_and_libraries_bytes"] = context
            out["peak"]["device_used_bytes"] = peak_reserved + context
        else:
            from vramscope.sources import nvml

            out["device_used_note"] = nvml.unavailable_reason() or "NVML lists no memory for us"
    del workload, runner
    reset_allocator()
    return out


def gpu_info() -> dict[str, Any]:
    """In a child: the GPU, its driver and CUDA, as the results record them."""
    import torch

    from vramscope.sources import nvml

    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "total_bytes": props.total_memory,
        "driver": nvml.driver_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def _info_child(row: dict[str, Any], note: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    return gpu_info()


def need_bytes(row: dict[str, Any]) -> int:
    """What a workload is booked for on the shared GPU: its CPU estimate of device used with
    a margin, else a generous default."""
    est = (row.get("estimate") or {}).get("peak") or {}
    used = est.get("device_used_bytes")
    return int(used * 1.25) + GIB if used else UNKNOWN_NEED


def rows_to_measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    sweep = json.loads(Path(args.sweep).read_text())["rows"]
    rows = [r for r in sweep if args.only in (None, r["library"]) and not r.get("cpu_only")]
    if args.ids:
        rows = [r for r in rows if r["id"] in args.ids or r["spec"] in args.ids]
    if args.limit:
        rows = rows[: args.limit]
    return rows


def selftest_rows() -> list[dict[str, Any]]:
    return [
        {
            "id": f"{spec} b2 32-true",
            "spec": spec,
            "library": "selftest",
            "batch": 2,
            "precision": "32-true",
        }
        for spec in SELFTEST_SPECS
    ]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok")]
    failed: dict[str, int] = {}
    for r in rows:
        if not r.get("ok"):
            cls = (r.get("error") or {}).get("class") or r.get("lost") or "?"
            failed[cls] = failed.get(cls, 0) + 1
    seconds = [r["seconds"] for r in rows if "seconds" in r]
    return {
        "measured": len(ok),
        "failed": len(rows) - len(ok),
        "failures": dict(sorted(failed.items(), key=lambda kv: -kv[1])),
        "median_seconds": round(statistics.median(seconds), 2) if seconds else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default=str(SWEEP_JSON), help="the CPU sweep's results")
    parser.add_argument("--out", default=str(OUT_JSON))
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per workload")
    parser.add_argument("--budget", type=float, default=420, help="no workload starts after")
    parser.add_argument("--per-process", type=int, default=1)
    parser.add_argument("--gpu-share", type=float, default=0.85, help="of the GPU's memory")
    parser.add_argument("--only", choices=("torchvision", "timm", "hf", "layers"))
    parser.add_argument("--ids", nargs="*")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--fresh", action="store_true", help="ignore an existing results file")
    parser.add_argument("--redo-errors", action="store_true", help="measure failed rows again")
    parser.add_argument("--selftest", action="store_true", help="3 workloads on the CPU")
    args = parser.parse_args()
    started = time.monotonic()
    os.chdir(ROOT)  # specs name files relative to the repository

    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    # everything the children use, imported once before they fork; CUDA stays untouched
    import timm  # noqa: F401
    import torch
    import torchvision  # noqa: F401
    import transformers  # noqa: F401

    import vramscope.workload  # noqa: F401
    import zoo_hf
    from vramscope.sources import nvml  # noqa: F401

    if args.selftest:
        _state["device"] = "cpu"
        rows = selftest_rows()
        out = Path(os.environ.get("TMPDIR", "/tmp")) / "zoo_measure_selftest.json"
        args.fresh, args.per_process, args.jobs = True, 2, 2
        args.timeout, args.budget = max(args.timeout, 600), max(args.budget, 600)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device here: use --selftest to check the code on the CPU")
            return 2
        zoo_hf.write_config_files()
        rows = rows_to_measure(args)
        out = Path(args.out)
    assert not torch.cuda.is_initialized(), "the parent must not create a CUDA context"

    document = load(out) if not args.fresh else {"meta": {}, "rows": []}
    known = {
        r["id"]: r
        for r in document.get("rows", [])
        if "lost" not in r and (r.get("ok") or not args.redo_errors)
    }
    todo = [r for r in rows if r["id"] not in known]
    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "steps": STEPS,
        "jobs": args.jobs,
        "per_process": args.per_process,
        "libraries": library_versions(),
        "torch": torch.__version__,
    }
    # the children's CPU work (building models) shares the cores
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(args.jobs, 1)))
    if not args.selftest:
        info: dict[str, Any] = {}
        run_all(_info_child, [{"id": "gpu"}], lambda _r, res: info.update(res), timeout=120)
        if "gpu" not in info:
            print(f"a child process cannot use the GPU: {info}")
            return 2
        meta.update({k: v for k, v in info.items() if k not in ("process_index", "pid")})
    total = int(meta.get("total_bytes") or 0)
    budget_bytes = int(total * args.gpu_share) if total else None
    document["meta"] = {**document.get("meta", {}), **meta}

    booked = 0
    lock = threading.Lock()

    def admit(chunk: list[dict[str, Any]], force: bool) -> bool:
        nonlocal booked
        need = max(need_bytes(r) for r in chunk)
        if budget_bytes is None or force or booked + need <= budget_bytes:
            booked += need
            return True
        return False

    def release(chunk: list[dict[str, Any]]) -> None:
        nonlocal booked
        booked -= max(need_bytes(r) for r in chunk)

    order = {r["id"]: i for i, r in enumerate(rows)}
    done = 0

    def on_result(row: dict[str, Any], result: dict[str, Any]) -> None:
        nonlocal done
        keep = {k: row[k] for k in ("id", "spec", "library", "family", "task", "batch") if k in row}
        record = {**keep, "precision": row["precision"], **result}
        if "lost" in result:
            record["ok"] = False
        with lock:
            known[row["id"]] = record
            document["rows"] = sorted(known.values(), key=lambda r: order.get(r["id"], 1e9))
            document["summary"] = summary(document["rows"])
            write_json(out, document)
            done += 1
            peak = record.get("peak") or {}
            state = (
                "ok"
                if record.get("ok")
                else ((record.get("error") or {}).get("class") or record.get("lost", "?"))
            )
            print(
                f"[{done}/{len(todo)} {time.monotonic() - started:5.0f}s] {row['id'][:70]:70s} "
                f"{record.get('seconds', 0):6.1f}s alloc "
                f"{(peak.get('allocated_bytes') or 0) / GIB:7.3f} GiB  {state[:60]}",
                flush=True,
            )

    print(f"{len(todo)} workloads to measure ({len(rows)} listed)", flush=True)
    left = run_all(
        measure_one,
        todo,
        on_result,
        jobs=args.jobs,
        timeout=args.timeout,
        per_child=args.per_process,
        admit=admit,
        release=release,
        deadline=started + args.budget,
    )
    document["meta"]["seconds"] = round(time.monotonic() - started, 1)
    document["meta"]["not_started"] = len(left)
    document["rows"] = sorted(known.values(), key=lambda r: order.get(r["id"], 1e9))
    document["summary"] = summary(document["rows"])
    write_json(out, document)
    s = document["summary"]
    print(
        f"measured {s['measured']}, failed {s['failed']}, not started {len(left)} "
        f"(budget {args.budget:.0f} s); {time.monotonic() - started:.0f} s; wrote {out}"
    )
    if args.selftest:
        ok = s["measured"] == len(rows) and not left
        print("selftest " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
