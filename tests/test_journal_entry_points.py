"""Nothing lost when a run dies, whichever entry point tracks it: a process tracked by the
Lightning callback, the Hugging Face Trainer callback, `vramscope.measure`,
`@vramscope.profile`, the pytest plugin's fixture or the `%%vramscope` cell magic that is
SIGKILLed (or ends with `os._exit`) leaves its journal where that entry point writes it by
default (beside the callback's report; the others' in the private directory), `vramscope
report --list` lists it as a left-over, and `vramscope report JOURNAL` makes a report with
every step the process finished more than a second before it died. Such a journal damaged
afterwards still gives the report of what is intact, one line and exit code 2.

Each test trains a tiny model in a real process (tests/scripts/killed_with_integration.py)
that kills itself after step 24; its steps are spread over about two seconds.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
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


def play(entry: str, folder: Path, *more: str) -> tuple[Scenario, int]:
    """Run the script with ``entry`` until it kills itself: what it printed, and its pid."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), entry, str(folder), "--at", str(DIES_AFTER_STEP), *more],
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


def vramscope_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vramscope", *args],
        cwd=cwd,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def report_by_hand(journal: Path, expect: int = 0) -> dict:
    proc = vramscope_cli("report", "-q", "--json", "r.json", str(journal), cwd=journal.parent)
    assert proc.returncode == expect, proc.stderr
    report = json.loads((journal.parent / "r.json").read_text())
    assert schema.errors(report) == []
    return report


def check_killed_run(scenario: Scenario, journal: Path, died: int = -signal.SIGKILL) -> None:
    assert scenario.returncode == died, scenario.stderr
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


def left_over(folder: Path, pid: int) -> Path:
    """The one journal in the private directory, named after the process that died, which
    ``vramscope report --list`` lists as a left-over (and says how to make its report)."""
    private = folder / "private"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    journals = list(private.glob("*.journal"))
    assert [j.name.split("-")[0] for j in journals] == [str(pid)]  # <pid>-<random>.journal
    listed = vramscope_cli(
        "report", "--list", "--json", "-", cwd=folder, VRAMSCOPE_STATUS_DIR=str(private)
    )
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["journals"]
    assert entry["path"] == str(journals[0]) and entry["pid"] == pid and not entry["alive"]
    assert (
        entry["steps"] == DIES_AFTER_STEP + 1 and entry["size_bytes"] == journals[0].stat().st_size
    )
    assert str(SCRIPT) in entry["command"] and entry["problem"] is None
    return journals[0]


@pytest.mark.parametrize("die", ["kill", "exit"])
def test_a_profiled_function_that_dies_leaves_its_journal_in_the_private_directory(tmp_path, die):
    scenario, pid = play("profile", tmp_path, "--die", die)
    journal = left_over(tmp_path, pid)
    check_killed_run(scenario, journal, died=-signal.SIGKILL if die == "kill" else 3)


def test_a_test_with_the_pytest_fixture_killed_leaves_its_journal_and_is_listed(tmp_path):
    scenario, pid = play("pytest", tmp_path)
    journal = left_over(tmp_path, pid)
    check_killed_run(scenario, journal)
    listed = vramscope_cli(
        "report",
        "--list",
        cwd=tmp_path,
        VRAMSCOPE_STATUS_DIR=str(tmp_path / "private"),
        COLUMNS="200",
    )
    assert listed.returncode == 0, listed.stderr
    assert str(journal) in listed.stdout and f"pid {pid} · died · 25 steps" in listed.stdout
    assert "test_by_hand.py::test_training" in listed.stdout
    assert f"vramscope report {journal} --json run.json" in listed.stdout


def test_a_cell_with_the_magic_killed_leaves_its_journal_and_survives_damage(tmp_path):
    scenario, pid = play("ipython", tmp_path)
    journal = left_over(tmp_path, pid)
    check_killed_run(scenario, journal)

    # damaged afterwards: a step line overwritten gives the rest, one line and exit code 2
    lines = journal.read_bytes().split(b"\n")
    steps = [i for i, line in enumerate(lines) if line.startswith(b'{"k":"step"')]
    lines[steps[3]] = b"\x00\x17 overwritten"
    damaged = tmp_path / "damaged.journal"
    damaged.write_bytes(b"\n".join(lines))
    proc = vramscope_cli("report", "-q", "--json", "d.json", str(damaged), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"vramscope: error: {damaged} is damaged: 1 line left out (line {steps[3] + 1}: not a "
        "record); the report is made from the rest"
    ]
    indices = [s["index"] for s in json.loads((tmp_path / "d.json").read_text())["steps"]]
    assert indices == [i for i in range(DIES_AFTER_STEP + 1) if i != 3]

    # cut off in its middle (what a copy interrupted leaves): the report of what is whole
    data = journal.read_bytes()
    cut = tmp_path / "cut.journal"
    cut.write_bytes(data[: data.index(b'{"k":"step"', data.index(b'{"k":"step"') + 1) + 30])
    report = report_by_hand(cut)
    assert [s["index"] for s in report["steps"]] == [0]
    assert report["journal"]["truncated_last_line"] and report["journal"]["damaged_lines"] == 0
    assert any("last line was cut off" in note for note in report["tracking_notes"])

    # cut inside its header, or another program's file: one line, exit code 2, no report
    for name, content in (("header.journal", data[:40]), ("foreign.journal", b"PK\x03\x04zip")):
        (tmp_path / name).write_bytes(content)
        proc = vramscope_cli("report", str(tmp_path / name), cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("vramscope: error: ")


# ---- where each entry point journals, when the run ends as it should ----------------------


def journals_seen(folder: Path, seen: list[list[str]], expect: bool = True):
    """A function of one training step that notes the journals in ``folder`` as it runs
    (one in the private directory is opened on the sampler's thread: ``expect`` waits a
    second at most for it)."""
    import torch

    model = torch.nn.Linear(8, 8)

    def train() -> None:
        for _ in range(2):
            model(torch.randn(2, 8)).sum().backward()
        deadline = time.monotonic() + (1.0 if expect else 0.0)
        while not list(folder.glob("*.journal")) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(sorted(p.name for p in folder.glob("*.journal")))

    return train


def test_profile_journals_beside_its_json_or_in_the_private_directory(tmp_path, monkeypatch):
    private = tmp_path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(private))
    seen: list[list[str]] = []
    vramscope.profile(journals_seen(private, seen), print_report=False)()
    assert len(seen[0]) == 1 and seen[0][0].startswith(f"{os.getpid()}-")
    assert list(private.glob("*.journal")) == []  # removed when the call ended

    seen.clear()
    report_path = tmp_path / "call.json"
    vramscope.profile(
        journals_seen(tmp_path, seen), print_report=False, json_path=str(report_path)
    )()
    assert seen == [["call.journal"]] and report_path.is_file()
    assert not (tmp_path / "call.journal").exists()  # the report holds what it held

    kept = tmp_path / "kept.journal"
    vramscope.profile(journals_seen(tmp_path, []), print_report=False, journal=kept)()
    assert kept.is_file()
    seen.clear()
    vramscope.profile(
        journals_seen(private, seen, expect=False), print_report=False, journal=None
    )()
    assert seen == [[]]


def test_the_magic_journals_beside_its_json_or_where_it_is_told(tmp_path, monkeypatch):
    pytest.importorskip("IPython", reason="the magic needs IPython")
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    private = tmp_path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(private))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "vramscope")
    seen: list[list[str]] = []
    shell.user_ns["in_private"] = journals_seen(private, seen)
    shell.user_ns["beside"] = journals_seen(tmp_path, seen)
    with capture_output():
        shell.run_cell_magic("vramscope", "-q", "in_private()")
        shell.run_cell_magic("vramscope", f"-q --json {tmp_path}/cell.json", "beside()")
        shell.run_cell_magic("vramscope", f"-q --journal {tmp_path}/kept.journal", "beside()")
        shell.run_cell_magic("vramscope", "-q --no-journal", "in_private()")
    assert len(seen[0]) == 1 and seen[0][0].startswith(f"{os.getpid()}-")
    assert seen[1:] == [["cell.journal"], ["kept.journal"], []]
    assert sorted(p.name for p in tmp_path.glob("*.journal")) == ["kept.journal"]
    assert list(private.glob("*.journal")) == []
    with pytest.raises(UsageError, match="--journal PATH or --no-journal, not both"):
        shell.run_cell_magic("vramscope", "--journal x.journal --no-journal", "pass")
