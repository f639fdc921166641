"""Record every example output the docs show, by running the real CLI, then refill the docs.

    python docs/gen/record_outputs.py            # all of them (a few minutes on 2 CPUs)
    python docs/gen/record_outputs.py demo run   # only these (names below, without .txt)

Each recording is ``docs/outputs/NAME.txt``: the command line as a user types it, then what
it printed (stdout and stderr, as a terminal shows them), at 80 columns as in a log file.
The commands run with this checkout's ``src`` first on ``PYTHONPATH``, in an empty folder
holding copies of the few repository files they name (so every path in them reads as in
the repository and files they write land in that folder). Outputs that need a GPU are not
made up: they come from the H200 recordings under ``tests/data`` (``vramscope report`` of a
saved report, ``info`` rendered from a recorded NVML reading), and say so.

The recordings are scrubbed of what belongs to this machine rather than to the output: the
temporary folder and the checkout's path, the home folder, and the host name.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUTPUTS = ROOT / "docs" / "outputs"
WIDTH = 80
# repository files the commands name, copied to the same relative paths
FILES = (
    "tests/scripts/train_loop.py",
    "tests/data/report_h200_gpt.json",
    "tests/data/report_h200_leak.json",
    "tests/data/nvml_h200.json",
)

# the recorded H200 NVML reading rendered as `vramscope info` renders a live one
RENDER_RECORDED_INFO = """
import json, sys
from vramscope.cli.info import render_info, render_text
from vramscope.devices import SystemInfo
reading = json.load(open("tests/data/nvml_h200.json"))["readings"][-1]
print(render_text(render_info(SystemInfo.from_dict(reading)), width=int(sys.argv[1])), end="")
"""


@dataclass(frozen=True)
class Recording:
    name: str  # docs/outputs/NAME.txt
    args: tuple[str, ...]  # after `vramscope`
    shown: str = ""  # the command line shown, when it is not `vramscope ARGS`
    python: str = ""  # run this Python code instead of the CLI (with WIDTH as argv[1])
    before: tuple[tuple[str, ...], ...] = ()  # commands run (and shown) first
    code: int = 0  # the exit code it ends with (docs/exit-codes.md): 1 for "does not fit"


GPT_ON_H100 = ("example:gpt", "--gpu", "h100-80gb")  # the estimates the pages show

RECORDINGS = (
    Recording("demo", ("demo",)),
    Recording("help", ("--help",)),
    *(
        Recording(f"help-{verb}", (verb, "--help"))
        for verb in (
            "run",
            "measure",
            "estimate",
            "fit",
            "compare",
            "info",
            "watch",
            "report",
            "demo",
        )
    ),
    Recording("run", ("run", "tests/scripts/train_loop.py", "--epochs", "2")),
    Recording(
        "run-modules",
        ("run", "--detail", "modules", "tests/scripts/train_loop.py", "--epochs", "1"),
    ),
    Recording("measure", ("measure", "example:gpt", "-b", "4", "--steps", "3")),
    Recording("estimate", ("estimate", *GPT_ON_H100, "-b", "16")),
    Recording("estimate-list-gpus", ("estimate", "--list-gpus")),
    Recording(
        "estimate-ranks",
        (
            "estimate",
            *GPT_ON_H100,
            "-b",
            "16",
            "--world-size",
            "64",
            "--strategy",
            "fsdp",
        ),
    ),
    Recording(
        "estimate-tp",
        (
            "estimate",
            "example:llama",
            "--gpu",
            "h100-80gb",
            "-b",
            "8",
            "--world-size",
            "16",
            "--strategy",
            "fsdp",
            "--tp",
            "4",
        ),
    ),
    Recording(
        "estimate-3d-7b",
        (
            *("estimate", "hf:llama-7b/seq=4096", "-b", "1", "--gpu", "h100-80gb"),
            *("--precision", "32-true", "--world-size", "64", "--strategy", "fsdp"),
            *("--param-dtype", "bf16", "--reduce-dtype", "fp32"),
            *("--tp", "8", "--pp", "4", "--microbatches", "8", "--json", "7b-3d.json"),
        ),
    ),
    Recording("fit", ("fit", "example:gpt", "--gpu", "rtx4090")),
    Recording(
        "fit-plans",
        ("fit", "example:gpt", "--budget", "8GiB", "--effective-batch", "256"),
    ),
    Recording(
        "fit-seq-len",
        (
            *("fit", "hf:llama-1b/lora=8", "--seq-len", "-b", "8"),
            *("--gpu", "rtx4090", "--precision", "bf16-true"),
        ),
    ),
    Recording("compare", ("compare", "example:cnn", "-b", "64")),
    Recording(
        "compare-lora",
        (
            *("compare", "hf:llama-1b/seq=1024", "-b", "4", "--gpu", "rtx4090"),
            *("--precision", "bf16-true"),
            *("--strategies", "checkpointing,lora-r8,lora-r64,lora-r8+checkpointing"),
        ),
    ),
    Recording("compare-ranks", ("compare", "example:gpt", "-b", "16", "--world-size", "8")),
    Recording(
        "fit-ranks",
        ("fit", "example:gpt", "--gpu", "rtx4090", "--world-size", "8", "--strategy", "zero2"),
    ),
    Recording("report-h200", ("report", "tests/data/report_h200_gpt.json")),
    Recording(
        "report-diff",
        ("report", "b16.json", "--diff", "b32.json"),
        before=(
            ("estimate", *GPT_ON_H100, "-b", "16", "-q", "--json", "b16.json"),
            ("estimate", *GPT_ON_H100, "-b", "32", "-q", "--json", "b32.json"),
        ),
    ),
    Recording("info", ("info",)),
    Recording(
        "info-h200",
        ("info",),
        shown="vramscope info --probe     # on an H200: tests/data/nvml_h200.json",
        python=RENDER_RECORDED_INFO,
    ),
    Recording("watch-once", ("watch", "--once")),
)


def record(rec: Recording, folder: Path) -> str:
    """Run one recording in ``folder``; its text, scrubbed."""
    env = {
        **os.environ,
        "COLUMNS": str(WIDTH),
        "LINES": "50",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
        "VRAMSCOPE_STATUS_DIR": str(folder / ".status"),  # runs elsewhere stay out of `info`
        "NO_COLOR": "1",
    }
    text = ""
    for args in (*rec.before, rec.args):
        if rec.python and args is rec.args:
            argv = [sys.executable, "-c", rec.python, str(WIDTH)]
        else:
            argv = [sys.executable, "-m", "vramscope", *args]
        proc = subprocess.run(
            argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        expected = rec.code if args is rec.args else 0
        if proc.returncode != expected:
            raise SystemExit(f"{rec.name}: exit code {proc.returncode}\n{proc.stdout[-3000:]}")
        shown = rec.shown if rec.shown and args is rec.args else "vramscope " + shlex.join(args)
        text += f"$ {shown}\n{proc.stdout}"
    return scrub(text, folder)


def scrub(text: str, folder: Path) -> str:
    """Leave out what belongs to this machine: its folders and its name."""
    for path, replacement in (
        (str(folder.resolve()), "."),
        (str(folder), "."),
        (str(ROOT), "."),
        (str(Path.home()), "~"),
        (tempfile.gettempdir().rstrip("/") + "/", "/tmp/"),
    ):
        text = text.replace(path + "/", replacement + "/").replace(path, replacement)
    host = platform.node()
    if host and len(host) > 2:
        text = text.replace(host, "this-host")
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="recordings to make (default: all)")
    args = parser.parse_args(argv)
    known = {r.name: r for r in RECORDINGS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown recordings {unknown}; known: {', '.join(known)}")
    chosen = [known[n] for n in args.names] if args.names else list(RECORDINGS)
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    for rec in chosen:
        with tempfile.TemporaryDirectory(prefix="vramscope-docs-") as tmp:
            folder = Path(tmp)
            for name in FILES:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / name, folder / name)
            print(f"recording {rec.name} …", flush=True)
            (OUTPUTS / f"{rec.name}.txt").write_text(record(rec, folder), encoding="utf-8")
    sys.path.insert(0, str(HERE))
    import sync

    return sync.main([])


if __name__ == "__main__":
    sys.exit(main())
