"""Record reports on a GPU for the CPU tests of analysis and rendering.

Usage (on a CUDA machine): python tests/gpu/record_fixtures.py OUTDIR
Writes report_gpu_gpt.json (example:gpt measured) and report_gpu_leak.json (a script
that leaks 2 MiB a step, run under ``vramscope run``). Copy them to tests/data/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import vramscope

ROOT = Path(__file__).resolve().parents[2]


def main(outdir: str) -> None:
    out = Path(outdir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = vramscope.measure("example:gpt", batch_size=16, steps=6, interval_s=0.02)
    report.save(out / "report_gpu_gpt.json")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "vramscope",
            "run",
            "-q",
            "--interval",
            "0.02",
            "--json",
            str(out / "report_gpu_leak.json"),
            "tests/scripts/train_loop.py",  # relative: no machine path in the fixture
            "--epochs",
            "3",
            "--batches",
            "6",
            "--leak",
        ],
        check=True,
        cwd=ROOT,
    )


if __name__ == "__main__":
    main(sys.argv[1])
