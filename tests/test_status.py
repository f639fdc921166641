"""The status files between a tracked run and ``vramscope watch``: real files, real processes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.tracking.status import (
    StatusWriter,
    read_statuses,
    status_dir,
    status_dir_problem,
)

WRITER = textwrap.dedent(
    """
    import sys
    from vramscope.tracking.status import StatusWriter

    writer = StatusWriter({"name": "train.py", "device": None}, min_interval=0.0)
    writer.update(phase="backward", step=41, epoch=2, allocated_bytes=3 << 30,
                  reserved_bytes=4 << 30, peak_allocated_bytes=5 << 30)
    print(writer.path, flush=True)
    if sys.stdin.readline().strip() == "close":
        writer.close()
    """
)


@pytest.fixture
def private_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A status directory of this test's own, created by the writer."""
    path = tmp_path / "status"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(path))
    return path


def start_writer(env_dir: Path) -> tuple[subprocess.Popen[str], Path]:
    env = dict(os.environ, VRAMSCOPE_STATUS_DIR=str(env_dir))
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    return child, path


def test_writer_creates_a_private_directory_and_file(private_dir: Path) -> None:
    with StatusWriter({"name": "a"}) as writer:
        assert writer.enabled, writer.disabled_reason
        assert stat.S_IMODE(os.stat(private_dir).st_mode) == 0o700
        assert writer.path is not None
        assert stat.S_IMODE(os.stat(writer.path).st_mode) == 0o600
        status = json.loads(writer.path.read_text())
    assert status["pid"] == os.getpid()
    assert status["name"] == "a"
    assert status["schema"] == "vramscope.status/1"
    assert status["updated_at"] >= status["started"]


def test_another_process_reads_the_status_and_sees_it_removed_on_close(
    private_dir: Path,
) -> None:
    child, path = start_writer(private_dir)
    try:
        statuses = read_statuses()
        assert [s["pid"] for s in statuses] == [child.pid]
        status = statuses[0]
        assert (status["phase"], status["step"], status["epoch"]) == ("backward", 41, 2)
        assert (status["allocated_bytes"], status["reserved_bytes"]) == (3 << 30, 4 << 30)
        assert status["peak_allocated_bytes"] == 5 << 30
        assert 0 <= status["age_s"] < 30
        child.communicate("close\n", timeout=30)
    finally:
        child.kill()
    assert not path.exists()
    assert read_statuses() == []


def test_reader_removes_the_file_of_a_killed_writer(private_dir: Path) -> None:
    child, path = start_writer(private_dir)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert path.exists()  # nobody cleaned up
    assert read_statuses() == []
    assert not path.exists()


def test_reader_removes_a_file_whose_pid_was_reused(private_dir: Path) -> None:
    with StatusWriter({"name": "live"}):
        stale = private_dir / f"{os.getpid()}-deadbeef.json"
        # this PID, but a run that started before this process existed: a reused PID
        stale.write_text(json.dumps({"pid": os.getpid(), "started": 1000.0, "updated_at": 1000.0}))
        names = [s["name"] for s in read_statuses()]
    assert names == ["live"]
    assert not stale.exists()


def test_updates_are_throttled_and_flush_writes_the_last_one(private_dir: Path) -> None:
    with StatusWriter({"name": "t"}, min_interval=60.0) as writer:
        assert writer.path is not None
        writer.update(step=1)  # within 60 s of the first write: kept, not written
        assert "step" not in json.loads(writer.path.read_text())
        writer.update(step=2)
        writer.flush()
        assert json.loads(writer.path.read_text())["step"] == 2


def test_a_reader_never_sees_a_half_written_file(private_dir: Path) -> None:
    code = textwrap.dedent(
        """
        import time
        from vramscope.tracking.status import StatusWriter
        w = StatusWriter({"name": "x" * 2000}, min_interval=0.0)
        print(w.path, flush=True)
        end = time.time() + 1.5
        step = 0
        while time.time() < end:
            step += 1
            w.update(step=step, note="y" * (step % 3000))
        w.close()
        """
    )
    env = dict(os.environ, VRAMSCOPE_STATUS_DIR=str(private_dir))
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    reads = 0
    steps = []
    while child.poll() is None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        reads += 1
        steps.append(json.loads(text).get("step", 0))  # raises on a torn write
    child.wait(timeout=30)
    assert reads > 20
    assert steps == sorted(steps)  # each read is one whole, newer-or-equal version


def test_writer_refuses_a_directory_others_can_read(private_dir: Path) -> None:
    private_dir.mkdir(mode=0o755)
    os.chmod(private_dir, 0o755)
    writer = StatusWriter({"name": "t"})
    assert not writer.enabled
    assert writer.path is None
    assert "chmod 700" in (writer.disabled_reason or "")
    assert list(private_dir.iterdir()) == []
    writer.update(step=1)  # silently nothing
    writer.close()
    assert "permissions 755" in (status_dir_problem() or "")


def test_writer_refuses_a_symlinked_directory(tmp_path: Path, monkeypatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(link))
    writer = StatusWriter({"name": "t"})
    assert not writer.enabled
    assert "symlink" in (writer.disabled_reason or "")
    assert list(real.iterdir()) == []
    assert "symlink" in (status_dir_problem() or "")
    assert read_statuses() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_writer_refuses_a_directory_owned_by_someone_else(private_dir: Path) -> None:
    private_dir.mkdir(mode=0o700)
    os.chown(private_dir, 12345, 12345)
    writer = StatusWriter({"name": "t"})
    assert not writer.enabled
    assert "owned by uid 12345" in (writer.disabled_reason or "")
    assert list(private_dir.iterdir()) == []


def test_reader_does_not_follow_a_symlinked_status_file(private_dir: Path, tmp_path: Path) -> None:
    with StatusWriter({"name": "real"}):
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps({"pid": os.getpid(), "name": "planted"}))
        (private_dir / f"{os.getpid()}-0badf00d.json").symlink_to(target)
        names = [s["name"] for s in read_statuses()]
    assert names == ["real"]


def test_reader_is_not_blocked_by_a_fifo(private_dir: Path) -> None:
    with StatusWriter({"name": "real"}):
        os.mkfifo(private_dir / f"{os.getpid()}-0ff1f0.json")
        names = [s["name"] for s in read_statuses()]
    assert names == ["real"]


def test_a_forked_child_neither_writes_nor_removes_the_parents_file(private_dir: Path) -> None:
    with StatusWriter({"name": "parent"}, min_interval=0.0) as writer:
        assert writer.path is not None
        pid = os.fork()
        if pid == 0:  # the child, as a DataLoader worker would be
            writer.update(step=999)
            writer.close()
            os._exit(0)
        os.waitpid(pid, 0)
        assert writer.path.exists()
        assert "step" not in json.loads(writer.path.read_text())


def test_status_dir_prefers_our_runtime_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("VRAMSCOPE_STATUS_DIR", raising=False)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert status_dir() == runtime / "vramscope"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert status_dir() == Path(f"/tmp/vramscope-{os.geteuid()}")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_status_dir_ignores_a_runtime_dir_we_do_not_own(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("VRAMSCOPE_STATUS_DIR", raising=False)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 12345, 12345)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert status_dir() == Path(f"/tmp/vramscope-{os.geteuid()}")


def test_no_directory_means_no_runs_and_no_problem(private_dir: Path) -> None:
    assert read_statuses() == []
    assert status_dir_problem() is None
    assert not private_dir.exists()  # reading never creates it
