"""Record, on a real GPU, which allocations each aten op makes: the data behind the
estimator's model of cuDNN convolution workspaces.

Usage (on a machine with a CUDA GPU):

    python tests/gpu/record_conv_workspaces.py OUTDIR [--only CASE ...] [--steps 3]
    python tests/gpu/record_conv_workspaces.py OUTDIR --run NAME=SPEC,BATCH[,PRECISION[,STRATEGY[,BUDGET_GIB]]]

``--run`` records a workload outside the suite, optionally with one of ``compare``'s
strategies applied and under a budget (``set_per_process_memory_fraction``, set before the
workload is built, as ``fit --verify`` trials do; an out-of-memory error ends the recording
with the allocator's ``oom`` entry in the trace).

For each case of the accuracy suite (``benchmarks/suite.py``) named here, a fresh process
builds the workload exactly as ``vramscope measure`` does, records the allocator's history
(``torch.cuda.memory._record_memory_history``) over ``--steps`` training steps, and tags
every allocation with the aten op that made it: a dispatch mode sets the allocator's user
metadata to the op's index before the op runs (per thread, so backward ops on autograd's
thread are tagged too). ``OUTDIR/op_trace_CASE.json.gz`` holds (the fixtures in
``tests/data`` are these files, named ``op_trace_h200_CASE.json.gz``)

* ``meta``: torch, CUDA and cuDNN versions, GPU, the case;
* ``ops``: per op ``[index, name, thread, args]`` where ``args`` describes the tensors
  (shape, dtype, bytes) and, for convolutions, stride, padding, dilation, groups;
* ``trace``: ``[action, addr, size, stream, op]`` per trace entry (``op`` -1 when none);
* ``stats``: the allocator's peak counters at the end.

The fixtures let CPU code answer: how many bytes does each convolution forward and backward
allocate beyond its outputs, and when are they freed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CASES = [
    "resnet18-sgd-fp32",
    "vgg16-sgdm-fp32",
    "example-cnn-fp32",
    "mobilenetv3-adamw-fp16",
    "resnet50-sgdm-bf16",
    "resnet50-sgdm-fp32",
    "vit_b16-adamw-bf16",
    "efficientnet_b0-adam-fp32",
    "resnet50-infer-fp32",
    "swin_t-adamw-fp32",
]
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"]
CONV_OPS = {"convolution", "convolution_backward"}


def _describe(args: tuple, name: str) -> list:
    import torch

    out: list = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(
                {
                    "shape": list(a.shape),
                    "dtype": str(a.dtype)[6:],
                    "bytes": a.untyped_storage().nbytes(),
                }
            )
        elif name in CONV_OPS and isinstance(a, (int, bool, list, tuple)):
            out.append(a if not isinstance(a, tuple) else list(a))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            out.append({"tensors": len(a)})
        else:
            out.append(None)
    return out


def _adhoc(text: str):
    """``NAME=SPEC,BATCH[,PRECISION[,STRATEGY[,BUDGET_GIB]]]`` as a suite case plus extras."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from suite import Case

    name, _, rest = text.partition("=")
    parts = rest.split(",")
    precision = parts[2] if len(parts) > 2 and parts[2] else "32-true"
    strategy = parts[3] if len(parts) > 3 and parts[3] else "baseline"
    budget = float(parts[4]) if len(parts) > 4 and parts[4] else None
    return Case(name, parts[0], int(parts[1]), precision), strategy, budget


def child(case_name: str, out: Path, steps: int) -> int:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from suite import SUITE
    from vramscope.fit.strategies import get_strategy
    from vramscope.workload import StepRunner, build_workload, resolve

    strategy_name, budget_gib = "baseline", None
    if "=" in case_name:
        case, strategy_name, budget_gib = _adhoc(case_name)
    else:
        case = next(c for c in SUITE if c.name == case_name)
    strategy = get_strategy(strategy_name)
    if budget_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_gib * 2**30 / total))
    set_meta = torch._C._cuda_setMemoryMetadata
    device = torch.device("cuda", 0)
    ops: list[list] = []
    main_thread = threading.get_ident()
    lock = threading.Lock()

    class TagOps(TorchDispatchMode):
        # higher-order operators (flex_attention) pass through as one op, run eagerly
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            packet = getattr(func, "overloadpacket", None)
            name = packet.__name__ if packet is not None else str(getattr(func, "__name__", func))
            with lock:
                index = len(ops)
                thread = "main" if threading.get_ident() == main_thread else "autograd"
                ops.append([index, name, thread, _describe(args, name)])
            set_meta(f"op{index}")
            try:
                return func(*args, **(kwargs or {}))
            finally:
                set_meta("")

    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    spec = resolve(case.spec)
    builder = strategy.wrap(spec.builder)
    w = build_workload(builder, strategy.micro_batch(case.batch_size), device, spec.spec)
    w = w.with_overrides(
        precision=strategy.precision or case.precision,
        accumulate=strategy.accumulate(case.accumulate),
    )
    runner = StepRunner(w, device)
    step_marks = []
    oom = None
    with TagOps():
        try:
            for _ in range(steps):
                runner()
                torch.cuda.synchronize()
                step_marks.append(len(ops))
        except torch.cuda.OutOfMemoryError as exc:
            oom = str(exc).splitlines()[0][:300]
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    streams: dict[int, int] = {}
    trace = []
    for e in snap["device_traces"][0]:
        if e["action"] not in ACTIONS:
            continue
        meta = e.get("user_metadata") or ""
        op = int(meta[2:]) if meta.startswith("op") else -1
        stream = streams.setdefault(e.get("stream", 0), len(streams))
        trace.append([ACTIONS.index(e["action"]), e.get("addr", 0), e["size"], stream, op])
    stats = torch.cuda.memory_stats()
    keep = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "segment.all.peak")
    payload = {
        "schema": "vramscope.op_trace/1",
        "meta": {
            "case": case.name,
            "spec": case.spec,
            "batch_size": case.batch_size,
            "precision": case.precision,
            "steps": steps,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "strategy": strategy_name,
            "budget_gib": budget_gib,
            "oom": oom,
        },
        "actions": ACTIONS,
        "step_marks": step_marks,
        "ops": ops,
        "trace": trace,
        "stats": {k: int(stats[k]) for k in keep},
    }
    with gzip.open(out, "wt") as f:
        json.dump(payload, f, separators=(",", ":"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--run", action="append", default=[], metavar="NAME=SPEC,BATCH,...")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.outdir, args.steps)
    args.outdir.mkdir(parents=True, exist_ok=True)
    failed = []
    runs = args.run or args.only or DEFAULT_CASES
    for name in runs:
        out = args.outdir / f"op_trace_{name.partition('=')[0]}.json.gz"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_CUDA_ALLOC")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        t0 = time.time()
        proc = subprocess.run(
            [sys.executable, __file__, str(out), "--child", name, "--steps", str(args.steps)],
            env=env,
        )
        status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        size = out.stat().st_size // 1024 if out.exists() else 0
        print(f"[{name}] {status} {size} KiB in {time.time() - t0:.1f}s", flush=True)
        if proc.returncode:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
