"""The table of first layers' weight-gradient workspaces the estimator reads on the swept GPU
(``src/vramscope/estimate/recorded/first_layer_wgrad_h200.json.gz``), from the "wgrad" rows of
``tests/gpu/record_conv_workspace_sweep.py``'s two recordings kept in ``tests/data``
(``conv_workspace_sweep_h200.json.gz``, its seeded draw, and ``first_layer_grid_h200.json.gz``,
its grid of patch embeddings and stems): convolutions whose input needs no gradient
(an image's 1 to 4 channels; kernels of 2x2 to 16x16, patch embeddings among them), the
backward asked for the weight's gradient (and the bias's, for some).

Usage (on any machine)::

    python tests/gpu/first_layer_table.py [OUT]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "src"))

from sweep_data import DATA, DTYPES, recorded, write_table  # noqa: E402
from vramscope.estimate.kernels import first_layer_key  # noqa: E402

SWEEPS = ("conv_workspace_sweep_h200.json.gz", "first_layer_grid_h200.json.gz")
OUT = HERE.parents[1] / "src/vramscope/estimate/recorded/first_layer_wgrad_h200.json.gz"


def table() -> dict:
    """Each recorded shape -> the bytes its backward allocated beyond its gradients: the
    larger where a shape was recorded more than once (with and without the bias's gradient,
    in both recordings: the same engine within 2 % for most, up to 11 % apart for a few
    4x4 patches). Channels-first inputs only (as recorded); both recordings from one torch,
    cuDNN and GPU."""
    rows: dict[str, int] = {}
    meta: dict = {}
    for sweep in SWEEPS:
        document = json.loads(gzip.decompress((DATA / sweep).read_bytes()))
        seen = {k: document[k] for k in ("torch", "cudnn", "gpu")}
        assert not meta or seen == meta, (sweep, seen, meta)
        meta = seen
        for r in recorded(sweep, "wgrad"):
            if r["cl"] or "extra" not in r:
                continue
            k = first_layer_key(r["x"], r["w"], r["stride"], r["padding"], r["dilation"],
                                r["groups"], DTYPES[r["dtype"]])  # fmt: skip
            rows[k] = max(rows.get(k, 0), int(r["extra"]))
    return {
        "meta": {
            **meta,
            "about": (
                "a convolution's backward whose input needs no gradient (a first layer), "
                f"channels-first, on an {meta['gpu']}: the bytes it allocated beyond its "
                "gradients; key: input shape, weight shape, stride, padding, dilation, "
                "groups, dtype; recorded by tests/gpu/record_conv_workspace_sweep.py"
            ),
        },
        "rows": dict(sorted(rows.items())),
    }


def main(argv: list[str]) -> int:
    write_table(Path(argv[0]) if argv else OUT, table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
