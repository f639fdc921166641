"""Set a depthwise sweep's backward workspaces beside the estimator's rule for them
(``_depthwise_channels_last_backward_bytes`` of ``vramscope.estimate.kernels``): per kernel,
dtype and layout, the rows where the rule is off by more than ``--tolerance`` MiB (1), so the
law of the engine cuDNN switches to can be read off.

Usage (on any machine)::

    python tests/gpu/fit_depthwise_sweep.py [PATH] [--maps] [--forward]
    python tests/gpu/fit_depthwise_sweep.py --table OUT [PATH ...]

``PATH``: a recording of ``tests/gpu/record_depthwise_sweep.py`` or of
``tests/gpu/record_conv_workspace_sweep.py`` (its "dw" rows have the same meaning), gzipped
or not; by default ``tests/data/conv_workspace_sweep_h200.json.gz``. Per row off the rule:
the input's shape, the recorded and predicted workspace, the recorded bytes per input element
and what is left above 32 bytes per element counted in weight-sized float32 buffers (``wbuf``:
C*k*k*4 bytes; split-K partials show as a constant count), and, when recorded, the
requests of each pass of the backward (``dgrad``, ``wgrad``, ``bias``: see the recorder). ``--maps``: per batch a channels x size map of the recorded bytes per
element (``.`` where the rule holds, ``-`` not recorded). ``--forward``: also the forwards
that took more than the tolerance (the estimator models none). ``--table OUT``: write the
table the estimator reads on the swept GPU (``src/vramscope/estimate/recorded/
depthwise_conv2d_h200.json.gz``, :func:`table`) from the given recordings, by default both
depthwise sweeps kept in ``tests/data`` (``depthwise_sweep_h200.json.gz``,
``depthwise_sweep_h200_2.json.gz``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from itertools import accumulate
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "src"))

from sweep_data import DATA, DTYPES, depthwise_rule, write_table  # noqa: E402
from vramscope.estimate.kernels import depthwise_key  # noqa: E402

MiB = 2**20


def load(path: Path) -> tuple[dict, list[dict]]:
    """The recording's meta (torch, cudnn, gpu) and its depthwise rows that ran."""
    raw = path.read_bytes()
    document = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    meta = document.get("meta") or {k: document.get(k) for k in ("torch", "cudnn", "gpu")}
    rows = [r for r in document["rows"] if r.get("kind") == "dw" and "error" not in r]
    return meta, rows


SWEEPS = ("depthwise_sweep_h200.json.gz", "depthwise_sweep_h200_2.json.gz")


def pass_peak(sizes: list[int]) -> int:
    """A pass's highest allocated above its start: the largest running sum of its requests
    (allocations positive, frees negative), 0 when it allocates nothing."""
    return max(0, *accumulate(sizes)) if sizes else 0


def table(paths: list[Path]) -> dict:
    """The recorded cuDNN workspaces of the depthwise backward, the rows keyed
    "layout,N,C,H,W,k,dtype" (layout: channels_last or contiguous; dtype as torch names it)
    -> [data gradient's, weight gradient's]: each pass's peak above its start
    (:func:`pass_peak` of ``bwd_ws``'s "dgrad" and "wgrad"). Rows that failed, or that did
    not record the passes, are left out; the recordings must agree on torch, cuDNN and GPU."""
    meta: dict = {}
    rows: dict[str, list[int]] = {}
    for path in paths:
        m, recorded = load(path)
        seen = {k: m.get(k) for k in ("torch", "cudnn", "gpu")}
        if meta and seen != meta:
            raise SystemExit(f"{path}: recorded on {seen}, not {meta}")
        meta = seen
        for r in recorded:
            if "bwd_ws" not in r:
                continue
            layout = "channels_last" if r["cl"] else "contiguous"
            key = depthwise_key(layout, r["x"], r["w"][2], DTYPES[r["dtype"]])
            rows[key] = [pass_peak(r["bwd_ws"]["dgrad"]), pass_peak(r["bwd_ws"]["wgrad"])]
    meta["columns"] = ["dgrad_workspace", "wgrad_workspace"]
    meta["about"] = (
        f"a depthwise 2-D convolution (groups = in = out channels, stride 1, padding k//2, "
        f"with a bias) on an {meta['gpu']}: the workspaces cuDNN's data-gradient and "
        f"weight-gradient passes of its backward allocate, each pass's peak above its start; "
        f"key: layout (channels_last, contiguous), batch, channels, height, width, kernel, "
        f"dtype; recorded by tests/gpu/record_depthwise_sweep.py"
    )
    return {"meta": meta, "rows": dict(sorted(rows.items()))}


def predicted(row: dict, gpu: str = "h200") -> int:
    return depthwise_rule(row, gpu)


def numel(row: dict) -> int:
    b, c, h, w = row["x"]
    return b * c * h * w


def describe(row: dict, pred: int, key: str = "extra") -> str:
    n, (c, _, k, _) = numel(row), row["w"]
    got = row[key]
    wbuf = (got - 32 * n) / (c * k * k * 4)
    if key == "extra" and "bwd_ws" in row:
        shown = "".join(
            f"  {p} {','.join(map(str, sizes))}" for p, sizes in row["bwd_ws"].items() if sizes
        )
    elif key == "fwd_extra" and row.get("fwd_allocs"):
        shown = "  allocs " + ",".join(map(str, row["fwd_allocs"]))
    else:
        shown = ""
    return (
        f"    {'x'.join(map(str, row['x'])):>16s} got {got / MiB:9.2f} MiB ({got:>11d})"
        f" rule {pred / MiB:8.2f}  {got / n:6.2f} B/elem  wbuf {wbuf:8.1f}{shown}"
    )


def by_group(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["w"][2], row["dtype"], row["cl"]), []).append(row)
    for rs in groups.values():
        rs.sort(key=lambda r: (r["x"][1], r["x"][2], r["x"][0]))
    return dict(sorted(groups.items()))


def label(k: int, dt: str, cl: bool) -> str:
    return f"k={k} {dt} {'channels-last' if cl else 'contiguous'}"


def report(rows: list[dict], tolerance: float, gpu: str = "h200") -> int:
    """Print the rows off the rule, grouped; returns how many. Where the passes were
    recorded, also how often the rule matches the bias gradient's pass alone (torch's sum
    over the output's gradient) rather than the whole backward."""
    off_all = 0
    for (k, dt, cl), rs in by_group(rows).items():
        off = [(r, p) for r in rs if abs(r["extra"] - (p := predicted(r, gpu))) > tolerance]
        off_all += len(off)
        split = [r for r in rs if "bwd_ws" in r]
        bias = sum(abs(sum(r["bwd_ws"]["bias"]) - predicted(r, gpu)) <= tolerance for r in split)
        also = f"; the bias pass alone matches it on {bias} of {len(split)}" if split else ""
        print(f"{label(k, dt, cl)}: {len(rs)} rows, {len(off)} off the rule by > "
              f"{tolerance / MiB:g} MiB{also}")  # fmt: skip
        for r, p in off:
            print(describe(r, p))
    return off_all


def maps(rows: list[dict], tolerance: float, gpu: str = "h200") -> None:
    """Per group and batch, recorded bytes per input element by channels (lines) and size."""
    for (k, dt, cl), rs in by_group(rows).items():
        cells = {(r["x"][0], r["x"][1], r["x"][2]): r for r in rs}
        sizes = sorted({h for _, _, h in cells})
        channels = sorted({c for _, c, _ in cells})
        for b in sorted({b for b, _, _ in cells}):
            print(f"{label(k, dt, cl)} batch {b}: B/elem, '.' = the rule within tolerance")
            print("     C \\ H " + "".join(f"{h:>7d}" for h in sizes))
            for c in channels:
                line = []
                for h in sizes:
                    r = cells.get((b, c, h))
                    if r is None:
                        line.append("-")
                    elif abs(r["extra"] - predicted(r, gpu)) <= tolerance:
                        line.append(".")
                    else:
                        line.append(f"{r['extra'] / numel(r):.1f}")
                print(f"{c:10d} " + "".join(f"{s:>7s}" for s in line))


def forwards(rows: list[dict], tolerance: float) -> None:
    recorded = [r for r in rows if "fwd_extra" in r]
    for (k, dt, cl), rs in by_group(recorded).items():
        big = [r for r in rs if r["fwd_extra"] > tolerance]
        print(f"forward {label(k, dt, cl)}: {len(rs)} rows, {len(big)} over "
              f"{tolerance / MiB:g} MiB")  # fmt: skip
        for r in big:
            print(describe(r, 0, "fwd_extra"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, nargs="*")
    parser.add_argument("--table", type=Path, metavar="OUT", help="write the estimator's table")
    parser.add_argument("--tolerance", type=float, default=1.0, help="MiB")
    parser.add_argument("--gpu", default="h200", help="the estimator's profile")
    parser.add_argument("--maps", action="store_true")
    parser.add_argument("--forward", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        write_table(args.table, table(args.path or [DATA / name for name in SWEEPS]))
        return 0
    if len(args.path) > 1:
        parser.error("one recording at a time (several only with --table)")
    args.path = args.path[0] if args.path else DATA / "conv_workspace_sweep_h200.json.gz"
    meta, rows = load(args.path)
    tolerance = args.tolerance * MiB
    print(f"{args.path.name}: {len(rows)} depthwise rows; torch {meta.get('torch')}, "
          f"cuDNN {meta.get('cudnn')}, {meta.get('gpu')}")  # fmt: skip
    off = report(rows, tolerance, args.gpu)
    print(f"{off} of {len(rows)} rows off the rule")
    if args.maps:
        maps(rows, tolerance, args.gpu)
    if args.forward:
        forwards(rows, tolerance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
