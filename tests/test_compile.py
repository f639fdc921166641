"""torch.compile under tracking: the same losses, graphs, graph breaks and compiled frames.

Each case runs tests/scripts/compiled_gpt.py in a fresh process, plainly and under
vramscope (``vramscope run``, or ``vramscope.track()`` started after compiling), and compares
what the script prints: its losses and dynamo's counters. The first call of the compiled
model comes under ``torch.no_grad()``, as in GPT training scripts that evaluate first.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope.report.model import Report

SCRIPT = Path(__file__).parent / "scripts" / "compiled_gpt.py"
# one worker runs this module (`--dist loadgroup`): each plain run is made once (`_run`)
pytestmark = pytest.mark.xdist_group("compile")


@functools.cache
def _run(*argv: str) -> dict:
    # one thread: inductor's CPU kernels on two threads sum in an order that depends on the
    # machine's load (three plain runs side by side: now and then one's last loss differs in
    # the 7th digit, with or without vramscope); on one thread every run gives the same bits
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=600, env=env
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def plain(*args: str) -> dict:
    return _run(str(SCRIPT), *args)


def under_run(tmp_path: Path, *args: str, options: tuple[str, ...] = ()) -> tuple[dict, Report]:
    out = tmp_path / "report.json"
    result = _run("-m", "vramscope", "run", "--json", str(out), *options, str(SCRIPT), *args)
    return result, Report.load(out)


def same_compilation(tracked: dict, untracked: dict) -> None:
    assert tracked["losses"] == untracked["losses"]
    assert tracked["frames"] == untracked["frames"]  # no frame compiled again
    assert tracked["graphs"] == untracked["graphs"]
    assert tracked["graph_breaks"] == untracked["graph_breaks"]


MODEL = ("--compile", "model", "--accumulate", "2")  # torch.compile(model), 2 micro-batches


def test_compiled_model_evaluated_first_runs_as_without_vramscope(tmp_path):
    result, report = under_run(tmp_path, *MODEL)
    same_compilation(result, plain(*MODEL))
    assert report.exit.status == "ok"
    train = [s for s in report.steps if s.mode == "train"]
    assert [s.micro_batches for s in train] == [2, 2, 2]  # one step per optimizer step
    for step in train[1:]:
        assert [p.name for p in step.phases] == ["zero_grad", "forward", "backward", "optimizer"]
    assert report.categories_at_peak.parameters == 65408  # tied weights counted once


def test_model_compiled_in_place_runs_as_without_vramscope(tmp_path):
    result, report = under_run(tmp_path, "--compile", "method")
    same_compilation(result, plain("--compile", "method"))
    assert sum(1 for s in report.steps if s.mode == "train") == 3
    assert "tracking_notes" not in report.extra  # every forward was seen


def test_compiled_training_step_keeps_its_one_graph_break(tmp_path):
    result, report = under_run(tmp_path, "--compile", "step")
    same_compilation(result, plain("--compile", "step"))
    assert sum(1 for s in report.steps if s.mode == "train") == 3
    assert report.categories_at_peak.gradients == 65408


def test_tracking_started_after_compiling_changes_nothing():
    same_compilation(plain(*MODEL, "--track"), plain(*MODEL))


@pytest.mark.parametrize("detail", ["modules", "lines"])
def test_attribution_details_run_compiled_scripts(tmp_path, detail):
    result, report = under_run(tmp_path, *MODEL, options=("--detail", detail))
    assert result["losses"] == plain(*MODEL)["losses"]
    assert report.exit.status == "ok"
    assert report.modules  # the model's rows, and a note on what compiled code hides
    notes = " ".join(report.extra.get("attribution_notes", []))
    assert "torch.compile" in notes


@pytest.mark.skipif(shutil.which("gcc") is None, reason="inductor needs a C++ compiler on CPU")
def test_inductor_compiled_model(tmp_path):
    result, report = under_run(tmp_path, "--compile", "model", "--backend", "inductor")
    same_compilation(result, plain("--compile", "model", "--backend", "inductor"))
    assert report.exit.status == "ok"
