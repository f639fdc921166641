"""Record, on a real GPU, the workspace cuDNN takes beyond a convolution's outputs, over
many shapes drawn at random: first layers' weight gradients (an image's 1 to 4 channels,
kernels of 2x2 to 16x16, patch embeddings included), grouped 1-D convolutions' gradients
(a speech model's positional convolution), depthwise backward in channels-first and
channels-last layouts, and wide dilated forwards (segmentation heads).

Usage (on a machine with a CUDA GPU):

    python tests/gpu/record_conv_workspace_sweep.py OUT.json [SECONDS] [--grid NAME]

Each case builds its tensors, runs the op once with ``cudnn.benchmark`` off (as
``vramscope measure`` runs it) and records ``extra``: the peak of allocated memory during
the op, less what was allocated before it and the op's outputs. The cases come from a
seeded generator (the same list every run); ``SECONDS`` bounds the run. The recording of
2026-12-04 on an H200 is ``tests/data/conv_workspace_sweep_h200.json.gz``. ``--grid
first-layers`` records a grid of the first layers model zoos build instead (patch embeddings
and stems, :func:`first_layer_grid`): ``tests/data/first_layer_grid_h200.json.gz``; ``--grid
grouped`` grouped convolutions' three passes (:func:`grouped_grid`):
``tests/data/grouped_conv2d_grid_h200.json.gz``; ``--grid grouped-wide`` the same with wider
groups: ``tests/data/grouped_conv2d_wide_grid_h200.json.gz``.
"""

import json
import random
import sys
import time

import torch
import torch.nn.functional as F

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
rows: list[dict] = []


def nbytes(t):
    return t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) else 0


def measure(kind, xs, ws, stride, padding, dilation, groups, dt, mask, channels_last=False):
    dev = torch.device("cuda")
    n = len(xs) - 2
    x = torch.randn(xs, device=dev, dtype=DT[dt])
    w = torch.randn(ws, device=dev, dtype=DT[dt])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    with torch.no_grad():
        y = conv(x, w, None, stride, padding, dilation, groups)
    torch.cuda.synchronize()
    rec = {
        "kind": kind,
        "x": list(xs),
        "w": list(ws),
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "groups": groups,
        "dtype": dt,
        "cl": channels_last,
        "x_bytes": nbytes(x),
        "y_bytes": nbytes(y),
        "w_bytes": nbytes(w),
    }
    if kind == "fwd":
        del y
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            y = conv(x, w, None, stride, padding, dilation, groups)
        torch.cuda.synchronize()
        rec["extra"] = torch.cuda.max_memory_allocated() - base - nbytes(y)
    else:
        go = torch.randn_like(y)
        del y
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        res = torch.ops.aten.convolution_backward(
            go,
            x,
            w,
            [ws[0]] if mask[2] else None,
            list(stride),
            list(padding),
            list(dilation),
            False,
            [0] * n,
            groups,
            mask,
        )
        torch.cuda.synchronize()
        rec["outs"] = sum(nbytes(t) for t in res)
        rec["extra"] = torch.cuda.max_memory_allocated() - base - rec["outs"]
        rec["mask"] = mask
        del res, go
    del x, w
    rows.append(rec)


def safe(*a, **k):
    try:
        measure(*a, **k)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
    except Exception as e:
        rows.append({"error": repr(e)[:200], "args": repr(a)[:300]})


def random_cases(rng: random.Random) -> list[tuple]:
    """The seeded draw of 2026-12-04: first layers, grouped 1-D, depthwise, wide forwards."""
    cases = []
    # A: first layers' weight gradients (input without grad)
    for _ in range(1800):
        k, s, p = rng.choice(
            [
                (16, 16, 0),
                (14, 14, 0),
                (8, 8, 0),
                (4, 4, 0),
                (2, 2, 0),
                (7, 4, 3),
                (7, 2, 3),
                (5, 2, 2),
                (3, 2, 1),
                (11, 4, 2),
                (4, 2, 1),
                (6, 2, 2),
                (9, 1, 4),
            ]
        )
        c = rng.choice([1, 3, 3, 3, 4])
        co = rng.choice([16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 768])
        b = rng.choice([1, 2, 4, 8, 16, 32, 64, 128])
        h = rng.choice([32, 64, 128, 160, 224, 256, 384, 512, 896])
        dt = rng.choice(["fp32", "fp32", "bf16"])
        if b * c * h * h * 4 > 1.6e9 or b * co * (h // s) ** 2 * 4 > 2e9:
            continue
        cases.append(
            (
                "wgrad",
                (b, c, h, h),
                (co, c, k, k),
                (s, s),
                (p, p),
                (1, 1),
                1,
                dt,
                [False, True, False],
            )
        )
    # the same with a bias gradient and the grid of the recorded ones
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for h, k, s, p, co in (
            (160, 16, 16, 0, 64),
            (224, 16, 16, 0, 768),
            (224, 7, 4, 3, 32),
            (896, 7, 4, 3, 96),
            (224, 7, 2, 3, 64),
            (224, 4, 4, 0, 96),
            (224, 4, 4, 0, 64),
        ):
            for dt in ("fp32", "bf16"):
                if b * 3 * h * h * 4 <= 1.6e9:
                    cases.append(
                        (
                            "wgrad",
                            (b, 3, h, h),
                            (co, 3, k, k),
                            (s, s),
                            (p, p),
                            (1, 1),
                            1,
                            dt,
                            [False, True, True],
                        )
                    )
    # B: grouped 1-D convolutions (a positional convolution)
    for _ in range(300):
        c = rng.choice([64, 128, 256, 384, 512, 768, 1024])
        g = rng.choice([16, 16, 8, 4])
        k = rng.choice([128, 64, 31, 15])
        t = rng.choice([49, 50, 99, 100, 200, 400, 800, 1600])
        b = rng.choice([1, 2, 4, 8, 16])
        dt = rng.choice(["fp32", "fp32", "bf16"])
        cases.append(
            ("g1d", (b, c, t), (c, c // g, k), (1,), (k // 2,), (1,), g, dt, [True, True, True])
        )
    # C: depthwise 3x3 backward, NCHW and channels-last
    for _ in range(250):
        c = rng.choice([32, 64, 128, 256, 384, 512, 640, 768, 1024])
        h = rng.choice([7, 14, 28, 56, 112])
        b = rng.choice([1, 4, 8, 16, 32, 64])
        dt = rng.choice(["fp32", "fp32", "bf16"])
        k = rng.choice([3, 3, 5, 7])
        if b * c * h * h * 4 > 1e9:
            continue
        cases.append(
            (
                "dw",
                (b, c, h, h),
                (c, 1, k, k),
                (1, 1),
                (k // 2, k // 2),
                (1, 1),
                c,
                dt,
                [True, True, True],
                rng.random() < 0.5,
            )
        )
    # D: dilated and plain 3x3 forwards, wide (segmentation heads, dilated ResNets)
    for _ in range(200):
        ci = rng.choice([256, 512, 1024, 2048])
        co = rng.choice([256, 512, 1024, 2048])
        d = rng.choice([1, 2, 4])
        h = rng.choice([28, 30, 32, 60, 64])
        b = rng.choice([1, 2, 4, 8, 16])
        dt = rng.choice(["fp32", "fp32", "bf16"])
        cases.append(("fwd", (b, ci, h, h), (co, ci, 3, 3), (1, 1), (d, d), (d, d), 1, dt, None))
    rng.shuffle(cases)
    return cases


def first_layer_grid() -> list[tuple]:
    """First layers as model zoos build them, a grid rather than a draw: patch embeddings
    (kernel = stride 4, 14, 16) and 7x7 stride-2 stems into 32 to 1024 channels, over 160 to
    384 pixels, batch 1 to 64, float32 and bfloat16, with the bias's gradient."""
    cases = []
    for k, s, p in ((16, 16, 0), (14, 14, 0), (4, 4, 0), (7, 2, 3)):
        for co in (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024):
            for h in (224, 160, 256, 384):
                for b in (1, 2, 4, 8, 16, 32, 64):
                    for dt in ("fp32", "bf16"):
                        if b * co * (h // s) ** 2 * 4 > 2e9:
                            continue
                        cases.append(
                            ("wgrad", (b, 3, h, h), (co, 3, k, k), (s, s), (p, p), (1, 1), 1,
                             dt, [False, True, True])
                        )  # fmt: skip
    return cases


def grouped_grid(
    widths: tuple[int, ...] = (4, 6, 8, 12, 16, 24, 32, 64), seed: int = 11
) -> list[tuple]:
    """Grouped 2-D convolutions that are not depthwise (ResNeXt's, RegNet's, CPUBone's), a
    grid in a seeded order: 2 to 32 groups of 4 to 64 channels widened 1, 2 or 4 times,
    3x3 (stride 1 and 2), 2x2 and 1x1 kernels over 8x8 to 112x112, batch 16 and 64, in
    bfloat16, float16 and float32, channels-first; the forward, the data gradient and the
    weight gradient each recorded alone."""
    cases = []
    for dt in ("bf16", "fp32", "fp16"):
        for g in (2, 4, 8, 32):
            for cin in widths:
                for mult in (1, 2, 4):
                    for k, s, p in ((3, 1, 1), (3, 2, 1), (2, 1, 0), (1, 1, 0)):
                        for h in (8, 14, 28, 56, 112):
                            for b in (16, 64):
                                if dt == "fp16" and g not in (2, 8):
                                    continue
                                if b * g * cin * mult * h * h * 4 > 1e9:
                                    continue
                                xs, ws = (b, g * cin, h, h), (g * cin * mult, cin, k, k)
                                for kind, mask in (
                                    ("fwd", [False, False, False]),
                                    ("dgrad", [True, False, False]),
                                    ("wgrad", [False, True, False]),
                                ):
                                    cases.append(
                                        (kind, xs, ws, (s, s), (p, p), (1, 1), g, dt, mask)
                                    )
    random.Random(seed).shuffle(cases)
    return cases


def grouped_wide_grid() -> list[tuple]:
    """The grouped grid's wider groups: 48, 96 and 128 channels a group (CPUBone's 96)."""
    return grouped_grid((48, 96, 128), seed=12)


def main(argv: list[str]) -> int:
    """``OUT [SECONDS] [--grid first-layers|grouped]``: the seeded draw, or a grid."""
    torch.backends.cudnn.benchmark = False
    grid = None
    if "--grid" in argv:
        at = argv.index("--grid")
        grid = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    out_path = argv[0]
    budget = float(argv[1]) if len(argv) > 1 else 240.0
    grids = {
        "first-layers": first_layer_grid,
        "grouped": grouped_grid,
        "grouped-wide": grouped_wide_grid,
    }
    if grid is not None and grid not in grids:
        print(f"unknown grid {grid!r}: one of {', '.join(grids)}", file=sys.stderr)
        return 2
    cases = grids[grid]() if grid else random_cases(random.Random(7))
    start = time.time()
    for c in cases:
        if time.time() - start > budget:
            break
        kind = c[0]
        if kind == "dw":
            safe(*c[:9], channels_last=c[9])
        else:
            safe(*c)
    with open(out_path, "w") as f:
        json.dump(
            {
                "torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version(),
                "gpu": torch.cuda.get_device_name(),
                "rows": rows,
                "planned": len(cases),
            },
            f,
        )
    print(
        len(rows),
        "of",
        len(cases),
        "in",
        round(time.time() - start),
        "s; errors",
        sum("error" in r for r in rows),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
