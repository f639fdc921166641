"""The estimator on one torch version: its tests and its accuracy, in one results file.

Usage: python benchmarks/torch_version_report.py --python PYTHON [--out FILE]

Runs, with the interpreter PYTHON (an environment with that torch and vramscope's test
extras, such as one of the noxfile's sessions), the estimator's tests (the noxfile's list)
and ``benchmarks/accuracy.py`` (its CPU-side estimates against the H200 measurements; cases
whose library, torchvision or timm, is missing there are listed as not estimated). Writes
``benchmarks/results/torch_versions_VERSION.txt``: torch version, date, machine, the tests'
pass/fail counts and the accuracy summary; the accuracy details beside it as JSON.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def estimator_tests() -> list[str]:
    """``ESTIMATOR_TESTS`` of the noxfile (read, not imported: nox need not be installed)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ESTIMATOR_TESTS":
            return list(ast.literal_eval(node.value))
    raise SystemExit("noxfile.py has no ESTIMATOR_TESTS")


def run(python: str, args: list[str], timeout: int = 3600) -> tuple[int, str, float]:
    """Exit code, standard output (warnings on stderr are left out) and seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    proc = subprocess.run(
        [python, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout, time.perf_counter() - start


def scrub(accuracy_json: Path) -> dict:
    """Drop the tracebacks of cases that could not be estimated (they name this machine's
    paths; the one-line error stays) and return the summary."""
    doc = json.loads(accuracy_json.read_text())
    for row in doc["cases"]:
        row.pop("traceback", None)
    accuracy_json.write_text(json.dumps(doc, indent=1))
    return doc["summary"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    _, version, _ = run(args.python, ["-c", "import torch; print(torch.__version__)"])
    version = version.strip().splitlines()[-1]
    release = version.split("+")[0]
    out = Path(args.out or HERE / "results" / f"torch_versions_{release}.txt")
    code, text, seconds = run(
        args.python, ["-m", "pytest", "-q", "-p", "no:cacheprovider", *estimator_tests()]
    )
    counts = re.findall(
        r"(\d+) (passed|failed|skipped|error|errors)", text.splitlines()[-1] if text else ""
    )
    failures = [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))]
    skips = [line for line in text.splitlines() if line.startswith("SKIPPED")]
    accuracy_json = out.with_name(f"accuracy_h200_torch-{release}.json")
    _, accuracy, acc_seconds = run(
        args.python, [str(HERE / "accuracy.py"), "--out", str(accuracy_json)]
    )
    summary = scrub(accuracy_json) if accuracy_json.exists() else {}
    lines = [
        f"vramscope estimator on torch {version}",
        f"date: {datetime.date.today().isoformat()}; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs shared with other work, no GPU; python {platform.python_version()}",
        "",
        f"estimator tests ({len(estimator_tests())} files of noxfile.py): "
        + (", ".join(f"{n} {w}" for n, w in counts) or "no summary")
        + f" in {seconds:.0f} s (exit {code})",
        *failures,
        *skips,
        "",
        f"benchmarks/accuracy.py (estimates on this CPU against the H200 measurements), "
        f"{acc_seconds:.0f} s:",
        *[line for line in accuracy.splitlines() if not line.startswith(("wrote ", "["))],
    ]
    out.write_text("\n".join(lines).rstrip() + "\n")
    print("\n".join(lines[:8]))
    print(f"wrote {out} and {accuracy_json.name}; summary {json.dumps(summary)[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
