"""Record, on a real GPU, every allocation of the recurrent shapes of ``tests/rnn_shapes.py``
(through ``record_conv_workspaces.py --run``, each in a fresh process).

Usage (from the repository root): python tests/gpu/record_rnn_shapes.py OUTDIR [--only NAME ...]
writes ``OUTDIR/op_trace_GPU_rnn-NAME.json.gz``; copied into ``tests/data/``, the estimator's
tests compare them with the estimate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from record_conv_workspaces import main as record  # noqa: E402
from record_layers import gpu_tag  # noqa: E402

from rnn_shapes import SHAPES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    tag = gpu_tag()
    runs = []
    for name, shape in SHAPES.items():
        if args.only and name not in args.only:
            continue
        runs += ["--run", f"{tag}_rnn-{name}=tests/rnn_shapes.py:{name},{shape[5]},32-true"]
    return record([str(args.outdir), "--steps", "2", *runs])


if __name__ == "__main__":
    sys.exit(main())
