"""Nothing lost when a run dies, whichever entry point tracks it: a process tracked by the
Lightning callback, the Hugging Face Trainer callback or `vramscope.measure` that is SIGKILLed
leaves its journal where that entry point writes it by default (beside the callback's report;
measure's in the private directory), and `vramscope report JOURNAL` makes a report with every
step the process finished more than a second before it died.

Each test trains a tiny model in a real process (tests/scripts/killed_with_integration.py)
that kills itself after step 24; its steps are spread over about two seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import vramscope
from test_faults import Scenario, check_steps_and_peaks, finished_a_second_before
from vramscope import schema

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "killed_with_integration.py"
DIES_AFTER_STEP = 24

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux signals")


def environment(**more: str) -> dict[str, str]:
    """The tests' environment, where the processes they start import this vramscope."""
    here = str(Path(vramscope.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **more)


def play(entry: str, folder: Path) -> tuple[Scenario, int]:
    """Run the script with ``entry`` until it kills itself: what it printed, and its pid."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), entry, str(folder), "--at", str(DIES_AFTER_STEP)],
        cwd=folder,
        env=environment(OMP_NUM_THREADS="1", VRAMSCOPE_STATUS_DIR=str(folder / "private")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    scenario = Scenario(entry, [], returncode=proc.returncode, stderr=proc.stderr, folder=folder)
    pid = 0
    for line in proc.stdout.splitlines():
        words = line.split()
        if words[:1] == ["pid"]:
            pid, scenario.parameters = int(words[1]), int(words[3])
        elif words[:1] == ["done"]:
            scenario.done.append((int(words[1]), float(words[2]), int(words[3])))
        elif words[:1] == ["dying"]:
            scenario.ended_at = float(words[1])
    return scenario, pid


def report_by_hand(journal: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "report", "-q", "--json", "r.json", str(journal)],
        cwd=journal.parent,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((journal.parent / "r.json").read_text())
    assert schema.errors(report) == []
    return report


def check_killed_run(scenario: Scenario, journal: Path) -> None:
    assert scenario.returncode == -signal.SIGKILL, scenario.stderr
    assert [step for step, _, _ in scenario.done] == list(range(DIES_AFTER_STEP + 1))
    assert finished_a_second_before(scenario), "no step ended a second before the kill"
    assert not (scenario.folder / "vramscope.json").exists()  # the process wrote no report
    report = report_by_hand(journal)
    assert report["exit"]["source"] == "journal" and report["exit"]["status"] == "unknown"
    assert {s["mode"] for s in report["steps"]} == {"train"}
    check_steps_and_peaks(scenario, report)


def test_a_fit_with_the_lightning_callback_killed_leaves_its_journal_beside_the_report(tmp_path):
    pytest.importorskip("lightning.pytorch", reason="the Lightning callback needs lightning")
    scenario, _ = play("lightning", tmp_path)
    check_killed_run(scenario, tmp_path / "vramscope.journal")


def test_a_trainer_with_the_hf_callback_killed_leaves_its_journal_beside_the_report(tmp_path):
    pytest.importorskip("transformers", reason="the HF callback needs transformers")
    pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
    scenario, _ = play("hf", tmp_path)
    check_killed_run(scenario, tmp_path / "vramscope.journal")


def test_measure_killed_leaves_its_journal_in_the_private_directory(tmp_path):
    scenario, pid = play("measure", tmp_path)
    journals = list((tmp_path / "private").glob("*.journal"))
    assert [j.name.split("-")[0] for j in journals] == [str(pid)]  # <pid>-<random>.journal
    check_killed_run(scenario, journals[0])
