"""Record, on a real GPU, what a depthwise 2-D convolution (groups = in = out channels, stride
1, padding k//2, with a bias as ConvNeXt's, MambaOut's and PVT's have) allocates beyond its
tensors, forward and backward (the input's, the weight's and the bias's gradients, as
autograd runs them), over channels-last and contiguous inputs: the data to pin down when
cuDNN's depthwise backward over a channels-last input takes an engine with 32 to 64 bytes per
input element, and what that workspace is a function of.

Usage (on a machine with a CUDA GPU)::

    python tests/gpu/record_depthwise_sweep.py --out PATH [--seconds 255] [--smoke]

``--out`` defaults to ``$OUT/depthwise_sweep_h200.json.gz``. The grid runs in tiers, the most
telling first (every 7x7 layer over a channels-last input, then 3x3 and 5x5 at batch 1, 4, 16
and 64, 9x9 to 13x13 on a few shapes, the contiguous layout, the other batches); ``--seconds``
bounds the run, and the file is rewritten every minute, so a cut-off run keeps what it did.
``--smoke``: a tiny grid; without CUDA the script prints one line and exits 0.

Each shape runs in a fresh state (``empty_cache`` between shapes, ``cudnn.benchmark`` off,
deterministic algorithms off), each op once under the allocator's history (``requests`` of
``record_conv_batch_sweep.py``). A row (``kind`` "dw", with the fields of
``record_conv_workspace_sweep.py``'s rows, so ``fit_depthwise_sweep.py`` reads both):
``x``, ``w``, ``stride``, ``padding``, ``dilation``, ``groups``, ``dtype`` (fp32, bf16),
``cl`` (channels-last), ``x_bytes``, ``y_bytes``, ``w_bytes``, ``outs`` (the gradients'
bytes), ``fwd_extra`` (the forward's highest allocated above what was held before it and its
output), ``extra`` (the backward's highest above what is held before and after it: the
largest of its workspaces, as in ``record_conv_workspace_sweep.py``); ``fwd_allocs``: the
forward's requests beyond its output; ``bwd_requests``: the backward's requests in order,
its results as "dx", "dw", "db" (torch allocates each gradient before the pass that fills
it), and ``bwd_ws``: those between them by pass (``dgrad``: after dx, cuDNN's data gradient;
``wgrad``: after dw, cuDNN's weight gradient; ``bias``: after db, torch's sum over the
output's gradient; ``pre``: before dx); ``fwd_ms``/``bwd_ms``: the first call's time (plans
built then; a runtime-compiled engine shows as a slow one); ``error`` when the op failed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from record_conv_batch_sweep import requests  # noqa: E402

from sweep_data import DTYPES  # noqa: E402

CHANNELS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768)
SIZES = (5, 7, 10, 14, 20, 28, 40, 56, 80, 112)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
TYPES = ("fp32", "bf16")
MAX_INPUT = 512 * 2**20
# a few shapes for the larger kernels (ConvNeXt-like and MambaOut-like stages among them)
LARGE_KERNELS = (9, 11, 13)
LARGE_CHANNELS = (16, 24, 64, 128, 512)
LARGE_SIZES = (14, 28, 40, 112)
LARGE_BATCHES = (4, 16, 32)

# (kernel, channels, size, batch, dtype, channels_last)
Case = tuple[int, int, int, int, str, bool]


def grid(
    smoke: bool = False,
    channels: tuple[int, ...] = CHANNELS,
    sizes: tuple[int, ...] = SIZES,
    batches: tuple[int, ...] = BATCHES,
    tiers_kept: tuple[int, ...] = (),
) -> list[Case]:
    """The shapes, in the order they run (the most telling first), inputs over 512 MiB left
    out, each shape once; ``channels``, ``sizes``, ``batches``: the grid's (a later run's
    part of it), ``tiers_kept``: only these tiers (1 = every 7x7 over a channels-last
    input)."""
    if smoke:
        tiers = [[(k, c, h, b, d, cl) for k in (3, 7) for c, h, b in ((16, 14, 2), (64, 28, 4))
                  for d in TYPES for cl in (True, False)]]  # fmt: skip
    else:
        full = [(c, h, b) for c in channels for h in sizes for b in batches]
        some = [(c, h, b) for c, h, b in full if b in (1, 4, 16, 64)]
        rest = [(c, h, b) for c, h, b in full if b not in (1, 4, 16, 64)]
        large = [(c, h, b) for c in LARGE_CHANNELS for h in LARGE_SIZES for b in LARGE_BATCHES]
        tiers = [
            [(7, c, h, b, d, True) for c, h, b in full for d in TYPES],
            [(k, c, h, b, d, True) for k in (3, 5) for c, h, b in some for d in TYPES],
            [(k, c, h, b, d, True) for k in LARGE_KERNELS for c, h, b in large for d in TYPES],
            [(7, c, h, b, d, False) for c, h, b in full for d in TYPES],
            [(k, c, h, b, d, False) for k in (3, 5) for c, h, b in some if b in (4, 64)
             for d in TYPES],
            [(k, c, h, b, d, True) for k in (3, 5) for c, h, b in rest for d in TYPES],
            [(k, c, h, 16, d, False) for k in LARGE_KERNELS for c in LARGE_CHANNELS
             for h in LARGE_SIZES for d in TYPES],
        ]  # fmt: skip
    cases: list[Case] = []
    seen: set[Case] = set()
    for number, tier in enumerate(tiers, 1):
        if tiers_kept and number not in tiers_kept:
            continue
        for case in tier:
            _, c, h, b, d, _ = case
            if case in seen or b * c * h * h * DTYPES[d].itemsize > MAX_INPUT:
                continue
            seen.add(case)
            cases.append(case)
    return cases


def nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def beyond(allocs: list[list], results: list[int]) -> list[int]:
    """The sizes requested beyond the op's results (one request of each result's size
    taken out), in order; a refused request as its negative size."""
    left = list(results)
    sizes = []
    for action, size in allocs:
        if action == "alloc" and size in left:
            left.remove(size)
        else:
            sizes.append(size if action == "alloc" else -size)
    return sizes


def passes(allocs: list[list], results: dict[str, int]) -> tuple[list, dict[str, list[int]]]:
    """The requests in order, each result (the next one expected, in ``results``' order) as
    its name; and the other requests by the pass they came in (after which result)."""
    names = list(results)
    phase = {"dx": "dgrad", "dw": "wgrad", "db": "bias"}
    ordered: list = []
    by_pass: dict[str, list[int]] = {"pre": [], "dgrad": [], "wgrad": [], "bias": []}
    now = "pre"
    for action, size in allocs:
        if action == "alloc" and names and size == results[names[0]]:
            now = phase[names[0]]
            ordered.append(names.pop(0))
            continue
        size = size if action == "alloc" else -size
        ordered.append(size)
        by_pass[now].append(size)
    return ordered, by_pass


def one(k: int, c: int, h: int, b: int, dt: str, cl: bool) -> dict:
    dev = torch.device("cuda")
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = torch.randn(b, c, h, h, device=dev, dtype=DTYPES[dt]).contiguous(memory_format=fmt)
    w = torch.randn(c, 1, k, k, device=dev, dtype=DTYPES[dt]).contiguous(memory_format=fmt)
    bias = torch.randn(c, device=dev, dtype=DTYPES[dt])
    for t in (x, w, bias):
        t.requires_grad_(True)
    row: dict = {
        "kind": "dw",
        "x": [b, c, h, h],
        "w": [c, 1, k, k],
        "stride": [1, 1],
        "padding": [k // 2, k // 2],
        "dilation": [1, 1],
        "groups": c,
        "dtype": dt,
        "cl": cl,
        "x_bytes": nbytes(x),
        "w_bytes": nbytes(w),
        "bias": True,
    }
    try:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out: list[torch.Tensor] = []
        start = time.perf_counter()
        fwd = requests(lambda: out.append(F.conv2d(x, w, bias, 1, k // 2, 1, c)))
        row["fwd_ms"] = round(1e3 * (time.perf_counter() - start), 2)
        y = out[0]
        row["y_bytes"] = nbytes(y)
        row["fwd_extra"] = torch.cuda.max_memory_allocated() - base - nbytes(y)
        row["fwd_allocs"] = beyond(fwd, [nbytes(y)])
        grad = torch.randn_like(y)  # laid out as the output (channels-last for such an input)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        res: list[torch.Tensor] = []
        start = time.perf_counter()
        bwd = requests(lambda: res.extend(torch.autograd.grad(y, (x, w, bias), grad)))
        row["bwd_ms"] = round(1e3 * (time.perf_counter() - start), 2)
        after = torch.cuda.memory_allocated()
        row["outs"] = sum(nbytes(t) for t in res)
        row["extra"] = torch.cuda.max_memory_allocated() - max(held, after)
        results = dict(zip(("dx", "dw", "db"), (nbytes(t) for t in res), strict=True))
        row["bwd_requests"], row["bwd_ws"] = passes(bwd, results)
    except RuntimeError as e:  # out of memory among them
        row["error"] = repr(e)[:200]
    return row


def save(path: Path, rows: list[dict], planned: int) -> None:
    meta = {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(),
        "cuda": torch.version.cuda,
        "planned": planned,
    }
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt") as f:
        json.dump({"meta": meta, "rows": rows}, f)
    os.replace(tmp, path)


def summary(rows: list[dict], seconds: float, planned: int) -> None:
    """Per kernel, dtype and layout: how many backwards took over 1 MiB in each pass, and
    how many a weight-gradient workspace over 16 bytes per input element (the other engine)."""
    done = [r for r in rows if "error" not in r]
    print(f"{len(rows)} of {planned} shapes in {seconds:.0f} s; {len(rows) - len(done)} errors")
    groups: dict[tuple, list[dict]] = {}
    for r in done:
        groups.setdefault((r["w"][2], r["dtype"], r["cl"]), []).append(r)
    for (k, dt, cl), rs in sorted(groups.items()):
        over = {p: sum(sum(r["bwd_ws"][p]) > 2**20 for r in rs) for p in ("dgrad", "wgrad", "bias")}
        elems = [r["x_bytes"] // DTYPES[dt].itemsize for r in rs]
        big = sum(sum(r["bwd_ws"]["wgrad"]) > 16 * n for r, n in zip(rs, elems, strict=True))
        fwd = sum(r["fwd_extra"] > 2**20 for r in rs)
        layout = "channels-last" if cl else "contiguous"
        print(
            f"  k={k:2d} {dt} {layout:13s} {len(rs):4d} shapes, max "
            f"{max(r['extra'] for r in rs) / 2**20:7.1f} MiB; over 1 MiB: dgrad {over['dgrad']}, "
            f"wgrad {over['wgrad']} ({big} over 16 B/elem), bias {over['bias']}, forward {fwd}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(os.environ.get("OUT", ".")) / "depthwise_sweep_h200.json.gz"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument("--seconds", type=float, default=255.0, help="bound on the run")
    parser.add_argument("--smoke", action="store_true", help="a tiny grid")
    numbers = {"type": lambda text: tuple(int(n) for n in text.split(","))}
    parser.add_argument("--channels", default=CHANNELS, **numbers, help="e.g. 48,64,96")
    parser.add_argument("--sizes", default=SIZES, **numbers, help="heights (= widths)")
    parser.add_argument("--batches", default=BATCHES, **numbers)
    parser.add_argument("--tiers", default=(), **numbers, help="only these tiers (1: 7x7 NHWC)")
    args = parser.parse_args(argv)
    cases = grid(args.smoke, args.channels, args.sizes, args.batches, args.tiers)
    if not torch.cuda.is_available():
        print(
            f"no CUDA device: nothing recorded ({len(cases)} shapes planned, {len(grid())} in all)"
        )
        return 0
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = False
    torch.use_deterministic_algorithms(False)
    rows: list[dict] = []
    start = last_save = time.time()
    for case in cases:
        if time.time() - start > args.seconds:
            break
        rows.append(one(*case))
        torch.cuda.empty_cache()  # a recording script: each shape starts from nothing
        if time.time() - last_save > 60:
            save(args.out, rows, len(cases))
            last_save = time.time()
    save(args.out, rows, len(cases))
    summary(rows, time.time() - start, len(cases))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
