"""What entering and leaving ``track()`` leave to the sampler's thread is done when
``track()`` returns: the status file `watch` reads is written while the run goes and gone
after, the private directory's left-over journals are pruned, the session's own journal is
removed; a process that ends right after ``track()`` returns leaves its report whole and
nothing behind. Marking vramscope's wrappers for torch.compile imports nothing of dynamo's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import vramscope
from vramscope.tracking.status import read_statuses

SRC = str(Path(vramscope.__file__).resolve().parents[1])


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(folder))
    return folder


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_status_file_is_written_while_the_run_goes_and_gone_when_track_returns(private):
    model = torch.nn.Linear(8, 8)
    with vramscope.track(interval_s=0.01):
        deadline = time.monotonic() + 10
        statuses: list[dict] = []
        while not statuses and time.monotonic() < deadline:
            model(torch.randn(2, 8)).sum().backward()
            statuses = [s for s in read_statuses() if s.get("pid") == os.getpid()]
        assert statuses, "no status file while the run went"
    assert [s for s in read_statuses() if s.get("pid") == os.getpid()] == []
    assert [p.name for p in private.iterdir() if p.name.endswith(".journal")] == []


def test_a_session_stopped_at_once_still_prunes_and_leaves_nothing(private):
    private.mkdir(mode=0o700)
    dead = private / "999999999-0badf00d.journal"  # no such process: a run that died
    dead.write_bytes(b"")
    old = time.time() - 30 * 86400
    os.utime(dead, (old, old))
    session = vramscope.track()
    session.start()
    session.stop()
    assert not dead.exists()
    assert sorted(p.name for p in private.iterdir()) == []


def test_a_journal_that_cannot_open_leaves_the_timeline_going(private, monkeypatch):
    """What the sampler's thread opens before its first sample failing in a way nobody
    foresaw: the run's timeline is still sampled, and the report says what failed."""
    from vramscope.journal import writer

    def broken(session, where):
        raise ValueError("no journal today")

    monkeypatch.setattr(writer, "open_journal", broken)
    model = torch.nn.Linear(8, 8)
    with vramscope.track(interval_s=0.01) as session:
        deadline = time.monotonic() + 10
        while len(session._sampler.samples()) < 3 and time.monotonic() < deadline:
            model(torch.randn(2, 8)).sum().backward()
    report = session.report()
    assert len(report.timeline.t) >= 3
    assert report.extra["sampler"]["error"] == "starting: ValueError: no journal today"


def test_a_process_that_exits_right_after_track_returns_leaves_its_report_whole(tmp_path):
    out = tmp_path / "report.json"
    folder = tmp_path / "private"
    done = run_python(
        f"""
        import os, torch, vramscope
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with vramscope.track() as session:
            for _ in range(5):
                model(torch.randn(4, 16)).sum().backward()
                opt.step()
                opt.zero_grad()
        session.report().save({str(out)!r})
        os._exit(0)  # no interpreter shutdown: nothing runs after this line
        """,
        {"VRAMSCOPE_STATUS_DIR": str(folder)},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert [s["index"] for s in report["steps"]] == [0, 1, 2, 3, 4]
    assert report["exit"]["status"] == "ok"
    assert sorted(p.name for p in folder.iterdir()) == []  # no journal, no status file


def test_marking_the_wrappers_for_torch_compile_imports_nothing_of_dynamo(tmp_path):
    done = run_python(
        """
        import sys, torch, vramscope
        with vramscope.track():
            pass
        print("torch._dynamo" in sys.modules)
        from vramscope.tracking import hooks

        def marked(x):
            return x * 2 + 1

        def plain(x):
            return x * 2 + 1

        hooks._never_compiled(marked)
        from torch._dynamo.utils import counters

        torch.compile(marked, backend="eager")(torch.ones(3))
        print(counters["stats"]["unique_graphs"])  # run as it is: no graph
        torch.compile(plain, backend="eager")(torch.ones(3))
        print(counters["stats"]["unique_graphs"])
        """,
        {"VRAMSCOPE_STATUS_DIR": str(tmp_path / "private")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "0", "1"]
