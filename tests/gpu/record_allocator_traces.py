"""Record CUDA caching-allocator traces on a real GPU, as fixtures for the allocator simulator.

Usage (on a machine with a CUDA GPU; needs only torch):

    python tests/gpu/record_allocator_traces.py OUTDIR [--only NAME ...]

Each workload runs in a fresh subprocess whose ``PYTORCH_CUDA_ALLOC_CONF`` is set before CUDA
starts, records the allocator's history from the first allocation on
(``torch.cuda.memory._record_memory_history``), and writes ``OUTDIR/alloc_trace_NAME.json.gz``
(one file per workload, eight in all, each well under 300 KB):

* ``meta``: torch and CUDA versions, GPU name and memory, the allocator config;
* ``trace``: every trace entry as ``[action, addr, size, stream]`` (``action`` indexes
  ``actions``; streams renumbered from 0 = default stream; for ``oom`` ``addr`` is the free
  memory CUDA reported and ``size`` the rounded request);
* ``checkpoints``: at chosen points, ``trace_len`` (how many trace entries came before),
  ``memory_stats()`` (the subset in ``STAT_KEYS``), and the operations done right before
  (``empty_cache``) or right after (``reset_peak``, ``set_allowed``) the point;
* ``final_segments``: the allocator's segments and blocks at the end (``_snapshot()``);
* ``size_check``: whether the ``alloc`` entries carry requested or rounded sizes, checked
  against the requested sizes of the blocks still allocated at the end.

Nothing is written outside OUTDIR.  The script fails loudly if the trace ring buffer could
have overflowed or if anything was allocated before recording began.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

MAX_ENTRIES = 400_000
SCHEMA = "vramscope.alloc_trace/1"
ACTIONS = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "user_defined",
]
STAT_KEYS = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "active_bytes.all.peak",
    "requested_bytes.all.current",
    "requested_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "inactive_split_bytes.all.peak",
    "inactive_split.all.current",
    "segment.all.current",
    "segment.all.peak",
    "allocation.all.current",
    "reserved_bytes.small_pool.current",
    "reserved_bytes.small_pool.peak",
    "reserved_bytes.large_pool.current",
    "reserved_bytes.large_pool.peak",
    "allocated_bytes.small_pool.current",
    "allocated_bytes.large_pool.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
]
MiB = 1 << 20

# name -> (PYTORCH_CUDA_ALLOC_CONF, description)
WORKLOADS: dict[str, tuple[str, str]] = {
    "mlp_adamw": ("", "4-layer MLP, fp32, AdamW, 4 training steps"),
    "convnet_bn": ("", "small conv net with BatchNorm, SGD momentum, 3 steps and an eval pass"),
    "transformer_bf16": ("", "2 transformer blocks, SDPA attention, bf16 autocast, AdamW"),
    "fragmentation": ("", "interleaved variable-size allocs/frees on 2 streams, empty_cache"),
    "expandable": (
        "expandable_segments:True",
        "transformer steps with varying sequence length, 2 streams, empty_cache, then a cap",
    ),
    "max_split": (
        "max_split_size_mb:64,max_non_split_rounding_mb:32,roundup_power2_divisions:[32:4,256:8,>:2]",
        "oversize blocks and power-of-2 rounding under a memory-fraction cap, with OOM",
    ),
    "capped_retries": ("", "memory-fraction cap: cache flush + retry, then an OOM"),
    "gc_threshold": (
        "garbage_collection_threshold:0.6",
        "memory-fraction cap with garbage collection of old cached blocks",
    ),
}


# ------------------------------------------------------------------------------------------
# Parent: one fresh process per workload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), default=None)
    parser.add_argument("--child", nargs=2, metavar=("NAME", "OUTFILE"), help=argparse.SUPPRESS)
    parser.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], Path(args.child[1]))
    if args.dry_run_cpu:
        import torch

        for name in args.only or list(WORKLOADS):
            rec = DryRunRecorder(torch, name)
            WORKLOAD_FUNCS[name](torch, rec)
            print(f"[{name}] dry run on the CPU: {len(rec.checkpoints)} checkpoints", flush=True)
        return 0

    args.outdir.mkdir(parents=True, exist_ok=True)
    names = args.only or list(WORKLOADS)
    failed = []
    for name in names:
        conf, _ = WORKLOADS[name]
        env = dict(os.environ)
        for var in (
            "PYTORCH_CUDA_ALLOC_CONF",
            "PYTORCH_ALLOC_CONF",
            "PYTORCH_HIP_ALLOC_CONF",
            "PYTORCH_NO_CUDA_MEMORY_CACHING",
        ):
            env.pop(var, None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        out = args.outdir / f"alloc_trace_{name}.json.gz"
        t0 = time.time()
        proc = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                str(args.outdir),
                "--child",
                name,
                str(out),
            ],
            env=env,
        )
        took = time.time() - t0
        if proc.returncode != 0:
            failed.append(name)
            print(f"[{name}] FAILED (exit {proc.returncode}) after {took:.1f}s", flush=True)
            continue
        size = out.stat().st_size
        flag = "  WARNING: over 300 KB" if size > 300_000 else ""
        print(f"[{name}] wrote {out} ({size / 1024:.0f} KiB) in {took:.1f}s{flag}", flush=True)
    if failed:
        print("failed:", ", ".join(failed), flush=True)
        return 1
    return 0


# ------------------------------------------------------------------------------------------
# Child: record one workload


class Recorder:
    dev = "cuda"

    def __init__(self, torch, name: str):
        self.torch = torch
        self.name = name
        self.device = torch.cuda.current_device()
        self.checkpoints: list[dict] = []
        self.total = torch.cuda.mem_get_info()[1]

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def new_stream(self):
        return self.torch.cuda.Stream()

    def on_stream(self, stream):
        return self.torch.cuda.stream(stream)

    def reserved(self) -> int:
        return self.torch.cuda.memory_reserved()

    def trace(self) -> list[dict]:
        return self.torch.cuda.memory._snapshot()["device_traces"][self.device]

    def stats(self) -> dict[str, int]:
        raw = self.torch.cuda.memory_stats(self.device)
        return {k: int(raw[k]) for k in STAT_KEYS if k in raw}

    def cp(self, name: str, before: tuple = (), after: tuple = ()) -> None:
        """A checkpoint: do ``before``, record stats and trace position, then do ``after``."""
        torch = self.torch
        ops_before = [self._do(op) for op in before]
        torch.cuda.synchronize()
        entry = {
            "name": name,
            "trace_len": len(self.trace()),
            "stats": self.stats(),
            "ops_before": ops_before,
        }
        entry["ops_after"] = [self._do(op) for op in after]
        self.checkpoints.append(entry)

    def _do(self, op) -> list:
        torch = self.torch
        if op == "empty_cache":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return ["empty_cache"]
        if op == "reset_peak":
            torch.cuda.reset_peak_memory_stats()
            return ["reset_peak"]
        if isinstance(op, tuple) and op[0] == "fraction":
            fraction = float(op[1])
            torch.cuda.set_per_process_memory_fraction(fraction)
            # the allocator computes static_cast<size_t>(fraction * total) from cudaMemGetInfo
            return ["set_allowed", int(fraction * float(self.total))]
        raise ValueError(op)

    def fraction_for(self, nbytes: int) -> float:
        return nbytes / float(self.total)


class DryRunRecorder(Recorder):
    """Runs a workload on the CPU, recording nothing: checks the workload code itself."""

    dev = "cpu"

    def __init__(self, torch, name: str):
        self.torch = torch
        self.name = name
        self.checkpoints = []
        self.total = 80 << 30

    def sync(self) -> None:
        pass

    def new_stream(self):
        return None

    def on_stream(self, stream):
        return contextlib.nullcontext()

    def reserved(self) -> int:
        return 0

    def cp(self, name: str, before: tuple = (), after: tuple = ()) -> None:
        self.checkpoints.append({"name": name, "before": list(before), "after": list(after)})


def start_recording(torch) -> None:
    torch.cuda.init()  # the device allocators must exist before history is switched on
    mem = torch.cuda.memory
    try:
        mem._record_memory_history(
            enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES
        )
    except TypeError:  # older signature
        mem._record_memory_history(
            True, trace_alloc_max_entries=MAX_ENTRIES, trace_alloc_record_context=False
        )
    stats = torch.cuda.memory_stats()
    if stats.get("reserved_bytes.all.current", 0) or stats.get("allocation.all.current", 0):
        raise SystemExit("memory was allocated before recording began; the trace would be partial")


def child(name: str, out: Path) -> int:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    torch.manual_seed(0)
    random.seed(0)
    start_recording(torch)
    rec = Recorder(torch, name)
    rec.cp("start")
    WORKLOAD_FUNCS[name](torch, rec)
    torch.cuda.synchronize()
    rec.cp("end")

    snap = torch.cuda.memory._snapshot()
    trace = snap["device_traces"][rec.device]
    if len(trace) >= MAX_ENTRIES:
        raise SystemExit(f"trace has {len(trace)} entries: the ring buffer may have wrapped")
    streams: dict[int, int] = {0: 0}
    rows = []
    last_alloc_size: dict[int, int] = {}
    for e in trace:
        action = e["action"]
        raw_stream = int(e.get("stream", 0) or 0)
        stream = streams.setdefault(raw_stream, len(streams))
        if action == "oom":
            addr = int(e.get("device_free", e.get("addr", 0)) or 0)
        else:
            addr = int(e.get("addr", 0) or 0)
        size = int(e.get("size", 0) or 0)
        rows.append([ACTIONS.index(action), addr, size, stream])
        if action == "alloc":
            last_alloc_size[addr] = size

    segments = []
    check = {"live_blocks": 0, "trace_size_is_requested": 0, "trace_size_is_block_size": 0}
    for seg in snap["segments"]:
        blocks = []
        for b in seg["blocks"]:
            state = b.get("state", "")
            blocks.append([int(b["size"]), int(b.get("requested_size", 0)), state[:1]])
            if state == "active_allocated" and "address" in b:
                traced = last_alloc_size.get(int(b["address"]))
                if traced is not None:
                    check["live_blocks"] += 1
                    check["trace_size_is_requested"] += traced == int(b.get("requested_size", -1))
                    check["trace_size_is_block_size"] += traced == int(b["size"])
        segments.append(
            [
                int(seg["address"]),
                int(seg["total_size"]),
                streams.setdefault(int(seg.get("stream", 0) or 0), len(streams)),
                seg.get("segment_type", ""),
                bool(seg.get("is_expandable", False)),
                blocks,
            ]
        )

    props = torch.cuda.get_device_properties(rec.device)
    conf, description = WORKLOADS[name]
    doc = {
        "schema": SCHEMA,
        "workload": name,
        "description": description,
        "meta": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(rec.device),
            "total_memory": int(props.total_memory),
            "mem_get_info_total": int(rec.total),
            "driver": _driver_version(),
            "alloc_conf": conf,
            "allocator_settings": snap.get("allocator_settings"),
            "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "actions": ACTIONS,
        "streams": {str(k): v for k, v in streams.items()},
        "trace": rows,
        "checkpoints": rec.checkpoints,
        "final_segments": segments,
        "size_check": check,
    }
    data = json.dumps(doc, separators=(",", ":")).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wb", compresslevel=9) as f:
        f.write(data)
    print(
        f"[{name}] {len(rows)} trace entries, {len(rec.checkpoints)} checkpoints, "
        f"peak reserved {rec.checkpoints[-1]['stats'].get('reserved_bytes.all.peak', 0) / MiB:.0f}"
        f" MiB, size check {check}",
        flush=True,
    )
    return 0


def _driver_version() -> str | None:
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


# ------------------------------------------------------------------------------------------
# Workloads (pure torch, small: each trace stays well under the fixture size budget)


def _train_steps(torch, rec, model, opt, batch, loss_fn, steps, autocast=None):
    for step in range(steps):
        x, y = batch()
        if autocast is not None:
            with torch.autocast(rec.dev, dtype=autocast):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
        rec.cp(f"step{step}", after=("reset_peak",))


def w_mlp_adamw(torch, rec):
    nn = torch.nn
    dev = rec.dev
    model = nn.Sequential(
        nn.Linear(1024, 4096),
        nn.GELU(),
        nn.Linear(4096, 4096),
        nn.GELU(),
        nn.Linear(4096, 1000),
        nn.GELU(),
        nn.Linear(1000, 1024),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.cp("model_built")

    def batch():
        return torch.randn(384, 1024, device=dev), torch.randn(384, 1024, device=dev)

    _train_steps(torch, rec, model, opt, batch, torch.nn.functional.mse_loss, steps=4)
    del model, opt


def w_convnet_bn(torch, rec):
    nn = torch.nn
    dev = rec.dev

    def block(cin, cout, stride):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
        )

    model = nn.Sequential(
        block(3, 32, 1),
        block(32, 64, 2),
        block(64, 128, 2),
        block(128, 128, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 100),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rec.cp("model_built")

    def batch():
        return (
            torch.randn(48, 3, 96, 96, device=dev),
            torch.randint(0, 100, (48,), device=dev),
        )

    _train_steps(torch, rec, model, opt, batch, torch.nn.functional.cross_entropy, steps=3)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(96, 3, 96, 96, device=dev))
    del out
    rec.cp("eval")


def _transformer(torch, d=512, heads=8, layers=2, vocab=8192):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return Model()


def _lm_loss(torch):
    def loss(logits, y):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    return loss


def w_transformer_bf16(torch, rec):
    dev = rec.dev
    model = _transformer(torch).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.cp("model_built")

    def batch():
        idx = torch.randint(0, 8192, (12, 256), device=dev)
        return idx, torch.roll(idx, -1, 1)

    _train_steps(torch, rec, model, opt, batch, _lm_loss(torch), steps=3, autocast=torch.bfloat16)


def _suppress_oom(torch, fn) -> bool:
    """Run ``fn``; on a CUDA OOM drop what it held (at once, not at some later GC) and go on."""
    try:
        fn()
        return True
    except torch.cuda.OutOfMemoryError:
        pass
    gc.collect()
    return False


def _churn(torch, rec, rng, n_ops, sizes, streams, live_cap):
    """Interleaved allocations and frees of variable sizes, deterministic."""
    live = []
    for _ in range(n_ops):
        if live and (rng.random() < 0.45 or len(live) >= live_cap):
            live.pop(rng.randrange(len(live)))
        else:
            lo, hi = rng.choice(sizes)
            nbytes = rng.randint(lo, hi)
            stream = rng.choice(streams)
            if stream is None:
                live.append(torch.empty(nbytes, dtype=torch.uint8, device=rec.dev))
            else:
                with rec.on_stream(stream):
                    live.append(torch.empty(nbytes, dtype=torch.uint8, device=rec.dev))
    return live


def w_fragmentation(torch, rec):
    rng = random.Random(1234)
    side = rec.new_stream()
    sizes = [
        (1, 4096),  # tiny: small pool, 512 B rounding
        (4097, 1 << 20),  # small pool up to 1 MiB
        ((1 << 20) + 1, 10 * MiB - 1),  # large pool, shares 20 MiB segments
        (10 * MiB, 48 * MiB),  # own segments rounded to 2 MiB
    ]
    live = _churn(torch, rec, rng, 1400, sizes, [None, None, None, side], live_cap=60)
    rec.sync()
    rec.cp("churn1")
    live = live[::2]
    rec.cp("after_empty_cache", before=("empty_cache",))
    live += _churn(torch, rec, rng, 800, sizes, [None, side], live_cap=40)
    rec.sync()
    rec.cp("churn2")
    del live
    rec.cp("all_freed")
    rec.cp("after_empty_cache2", before=("empty_cache",))


def w_expandable(torch, rec):
    dev = rec.dev
    model = _transformer(torch, d=384, heads=6, layers=2, vocab=4096).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = _lm_loss(torch)
    rec.cp("model_built")
    for step, seq in enumerate([192, 256, 160, 288]):  # the case expandable segments target
        idx = torch.randint(0, 4096, (10, seq), device=dev)
        with torch.autocast(rec.dev, dtype=torch.bfloat16):
            loss = loss_fn(model(idx), torch.roll(idx, -1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del idx, loss
        rec.cp(f"step{step}", after=("reset_peak",))
    rng = random.Random(99)
    side = rec.new_stream()
    sizes = [(1, 1 << 20), ((1 << 20) + 1, 9 * MiB), (10 * MiB, 64 * MiB)]
    live = _churn(torch, rec, rng, 500, sizes, [None, None, side], live_cap=40)
    rec.sync()
    rec.cp("churn")
    live = live[1::2]
    rec.cp("after_empty_cache", before=("empty_cache",))
    # a cap just above what is reserved now: growing needs the free pages unmapped first
    reserved = rec.reserved()
    rec.cp("capped", after=(("fraction", rec.fraction_for(reserved + 200 * MiB)),))
    live.append(torch.empty(150 * MiB, dtype=torch.uint8, device=dev))
    rec.cp("grew_under_cap")
    _suppress_oom(torch, lambda: live.append(torch.empty(400 * MiB, dtype=torch.uint8, device=dev)))
    rec.cp("after_oom")
    live.clear()
    del model, opt
    rec.cp("freed", before=("empty_cache",))


def w_max_split(torch, rec):
    dev = rec.dev
    rng = random.Random(7)
    rec.cp("capped", after=(("fraction", rec.fraction_for(1536 * MiB)),))
    live = []
    # oversize (>= 64 MiB) blocks: cached whole, reused only within 32 MiB of the request
    for nbytes in [70, 90, 130, 300, 66, 100, 260]:
        live.append(torch.empty(nbytes * MiB + rng.randint(0, MiB), dtype=torch.uint8, device=dev))
    rec.cp("oversize_allocated")
    del live[1::2]
    for nbytes in [80, 65, 120, 30, 12, 5, 270]:
        live.append(torch.empty(nbytes * MiB + rng.randint(0, MiB), dtype=torch.uint8, device=dev))
    rec.cp("reused")
    sizes = [(1, 1 << 20), ((1 << 20) + 1, 60 * MiB), (64 * MiB, 200 * MiB)]
    _suppress_oom(
        torch, lambda: live.extend(_churn(torch, rec, rng, 300, sizes, [None], live_cap=12))
    )
    rec.cp("churn")
    # past the cap: frees oversize cached blocks, then everything, then OOM
    _suppress_oom(
        torch, lambda: live.append(torch.empty(1200 * MiB, dtype=torch.uint8, device=dev))
    )
    rec.cp("after_oom")
    live.clear()
    rec.cp("freed", before=("empty_cache",))


def w_capped_retries(torch, rec):
    dev = rec.dev
    rec.cp("capped", after=(("fraction", rec.fraction_for(1024 * MiB)),))
    live = [torch.empty(50 * MiB, dtype=torch.uint8, device=dev) for _ in range(16)]
    del live[::2]  # 400 MiB cached in unsplit segments
    rec.cp("half_freed")
    big = torch.empty(600 * MiB, dtype=torch.uint8, device=dev)  # needs a flush and a retry
    rec.cp("retried")
    small = [torch.empty(3 * MiB, dtype=torch.uint8, device=dev) for _ in range(5)]
    del small[1::2]
    rec.cp("small")
    more: list = []
    _suppress_oom(
        torch,
        lambda: more.extend(
            torch.empty(100 * MiB, dtype=torch.uint8, device=dev) for _ in range(10)
        ),
    )
    rec.cp("after_oom")
    live.clear()
    more.clear()
    del big, small
    rec.cp("freed", before=("empty_cache",))


def w_gc_threshold(torch, rec):
    dev = rec.dev
    rng = random.Random(5)
    rec.cp("capped", after=(("fraction", rec.fraction_for(1024 * MiB)),))
    keep = []
    for round_ in range(8):
        batch = []
        for _ in range(14):
            nbytes = rng.choice([12, 16, 24, 30, 40, 56]) * MiB + rng.randint(0, MiB)
            batch.append(torch.empty(nbytes, dtype=torch.uint8, device=dev))
        keep.append(batch.pop(rng.randrange(len(batch))))
        del batch
        rec.cp(f"round{round_}")
    del keep
    rec.cp("freed")


WORKLOAD_FUNCS = {
    "mlp_adamw": w_mlp_adamw,
    "convnet_bn": w_convnet_bn,
    "transformer_bf16": w_transformer_bf16,
    "fragmentation": w_fragmentation,
    "expandable": w_expandable,
    "max_split": w_max_split,
    "capped_retries": w_capped_retries,
    "gc_threshold": w_gc_threshold,
}


if __name__ == "__main__":
    sys.exit(main())
