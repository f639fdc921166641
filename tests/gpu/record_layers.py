"""Record, on a real GPU, what each layer workload of ``tests/layer_workloads.py`` allocates:
the data to check the estimator's rules for cuDNN recurrent layers (weight space, reserve,
workspace, dropout state), grouped and channels-last convolutions, EmbeddingBag, masked
attention with dropout, fused Adam and GradScaler.

Usage (on a machine with a CUDA GPU, from the repository root):

    python tests/gpu/record_layers.py OUTDIR [--only NAME ...] [--steps 3]

Each case runs in a fresh process through ``tests/gpu/record_conv_workspaces.py --run`` (the
same recorder as the convolution fixtures): every allocation of ``--steps`` standard steps
tagged with the aten op that made it, and the allocator's peak counters. It writes
``OUTDIR/op_trace_GPU_layer-NAME.json.gz`` (GPU: ``h200`` on an H200, else the device name);
copied into ``tests/data/``, ``tests/test_estimate_layers.py`` compares them with the estimate.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

from record_conv_workspaces import main as record  # noqa: E402

from layer_workloads import BUILDERS, CASES  # noqa: E402


def gpu_tag() -> str:
    import torch

    name = torch.cuda.get_device_name(0)
    return "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    tag = gpu_tag()
    runs = []
    for name, (batch, precision) in CASES.items():
        if args.only and name not in args.only:
            continue
        spec = f"{ROOT / 'tests' / 'layer_workloads.py'}:{BUILDERS.get(name, name)}"
        runs += ["--run", f"{tag}_layer-{name}={spec},{batch},{precision}"]
    return record([str(args.outdir), "--steps", str(args.steps), *runs])


if __name__ == "__main__":
    sys.exit(main())
