"""The grouped 2-D convolutions' grid (``tests/gpu/record_conv_workspace_sweep.py --grid
grouped``) read per configuration: for each dtype, pass, channels a group in and out,
kernel, stride and padding, what cuDNN took set against the input's bytes over the grid's
batches (16, 64), sizes (8x8 to 112x112) and group counts (2 to 32).

Usage (on any machine)::

    python tests/gpu/fit_grouped_grid.py [PATH ...]
    python tests/gpu/fit_grouped_grid.py --table OUT [PATH ...]

``PATH``: the recordings, by default ``tests/data/grouped_conv2d_grid_h200.json.gz`` and
``tests/data/grouped_conv2d_wide_grid_h200.json.gz``. Without
``--table``: per dtype and pass, how many configurations are *steady* (every layer of 28x28
or more took the same bytes per input byte, within 10 %) and what share of the bytes they
hold. ``--table OUT``: the table the estimator reads on the swept GPU
(``src/vramscope/estimate/recorded/grouped_conv2d_h200.json.gz``, :func:`table`): for each
steady configuration the line ``bytes = a * input bytes + c`` fitted over all its layers
(least squares), ``a`` in millionths.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "src"))

from sweep_data import DATA, DTYPES, write_table  # noqa: E402
from vramscope.estimate.kernels import grouped_key  # noqa: E402

PASSES = {"fwd": "forward", "dgrad": "data", "wgrad": "weight"}
# the recordings: 4 to 64 channels a group, and 48 to 128 (``--grid grouped-wide``)
GRIDS = [DATA / "grouped_conv2d_grid_h200.json.gz", DATA / "grouped_conv2d_wide_grid_h200.json.gz"]
STEADY = 0.10  # the largest spread of bytes per input byte over the layers of 28x28 or more
SHARE = 0.75  # the share of those layers within it, for a configuration to be read


def configurations(rows: list[dict]) -> dict[str, list[tuple[int, int, int]]]:
    """key -> (input bytes, bytes taken, height) of each recorded layer."""
    found: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for row in rows:
        if "error" in row or row["groups"] in (1, row["x"][1]):
            continue
        dtype = DTYPES[row["dtype"]]
        cout, cin, kernel = row["w"][0], row["w"][1], row["w"][2]
        key = grouped_key(
            PASSES[row["kind"]], cin, cout // row["groups"], kernel, row["stride"][0],
            row["padding"][0], dtype,
        )  # fmt: skip
        size = int(np.prod(row["x"])) * dtype.itemsize
        found[key].append((size, row["extra"], row["x"][2]))
    return found


def inliers(layers: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The layers whose bytes per input byte are within 10 % of the median of those of
    28x28 or more (the smaller ones carry a fixed part)."""
    ratios = [taken / size for size, taken, height in layers if height >= 28]
    if not ratios:
        return []
    median = float(np.median(ratios))
    if median <= 0:
        return []
    return [
        (size, taken, height)
        for size, taken, height in layers
        if height < 28 or abs(taken / size - median) <= STEADY * median
    ]


def steady(layers: list[tuple[int, int, int]]) -> bool:
    """At least ``SHARE`` of the layers of 28x28 or more took the median bytes per input
    byte (within 10 %): one engine over most of the grid."""
    large = [layer for layer in layers if layer[2] >= 28]
    kept = [layer for layer in inliers(layers) if layer[2] >= 28]
    return bool(large) and len(kept) >= SHARE * len(large)


def fitted(layers: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(a in millionths, c) of ``bytes = a * input bytes + c``, least squares over the
    inliers."""
    layers = inliers(layers)
    sizes = np.array([s for s, _, _ in layers], float)
    taken = np.array([t for _, t, _ in layers], float)
    design = np.vstack([sizes, np.ones_like(sizes)]).T
    (a, c), *_ = np.linalg.lstsq(design, taken, rcond=None)
    return round(a * 1e6), round(c)


def table(paths: list[Path]) -> dict:
    recorded: list[dict] = []
    for path in paths:
        with gzip.open(path, "rt") as f:
            doc = json.load(f)
        recorded += doc["rows"]
    rows = {
        key: list(fitted(layers))
        for key, layers in sorted(configurations(recorded).items())
        if steady(layers)
    }
    return {
        "about": "grouped 2-D convolutions (not depthwise), channels-first, on an H200 (torch "
        f"{doc['torch']}, cuDNN {doc['cudnn']}): per pass, channels a group in and out, "
        "kernel, stride, padding and dtype, bytes = a / 1e6 * input bytes + c, for the "
        "configurations whose layers took the same bytes per input byte at every size",
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=GRIDS)
    parser.add_argument("--table", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.table is not None:
        write_table(args.table, table(args.paths))
        return 0
    recorded: list[dict] = []
    for path in args.paths:
        with gzip.open(path, "rt") as f:
            recorded += json.load(f)["rows"]
    found = configurations(recorded)
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    for key, layers in found.items():
        part = tuple(key.split(",")[i] for i in (0, 6))
        counts[part]["configurations"] += 1
        counts[part]["bytes"] += sum(t for _, t, _ in layers)
        if steady(layers):
            counts[part]["steady"] += 1
            counts[part]["steady_bytes"] += sum(t for _, t, _ in layers)
    for (kind, dtype), c in sorted(counts.items()):
        share = c["steady_bytes"] / max(c["bytes"], 1)
        print(f"{kind:8s} {dtype:9s} steady {c['steady']:3d} of {c['configurations']:3d} "
              f"configurations, {share:.0%} of the bytes")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
