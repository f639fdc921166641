"""``vramscope watch``: one frame, the CSV log, a recorded H200, and the live view in tmux."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from vramscope.cli.info import render_text
from vramscope.cli.main import main
from vramscope.cli.watch import SPARK, WatchView, sparkline
from vramscope.devices import SystemInfo
from vramscope.sources import nvml
from vramscope.units import format_bytes

FIXTURE = Path(__file__).parent / "data" / "nvml_h200.json"
NO_DRIVER = nvml.unavailable_reason() is not None

TRACKED_RUN = textwrap.dedent(
    """
    import sys
    from vramscope.tracking.status import StatusWriter

    writer = StatusWriter({"name": "train.py --lr 3e-4", "device": None}, min_interval=0.0)
    writer.update(phase="optimizer", step=1234, epoch=7, allocated_bytes=6 << 30,
                  reserved_bytes=8 << 30, peak_allocated_bytes=7 << 30)
    print("ready", flush=True)
    sys.stdin.readline()
    writer.close()
    """
)


@pytest.fixture
def status_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "status"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(path))
    monkeypatch.setenv("COLUMNS", "200")
    return path


@pytest.fixture
def tracked_run(status_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process publishing its status, as ``vramscope run`` does."""
    child = subprocess.Popen(
        [sys.executable, "-c", TRACKED_RUN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    yield child
    child.communicate("\n", timeout=30)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def replay() -> WatchView:
    view = WatchView(interval=0.5)
    for reading in json.loads(FIXTURE.read_text())["readings"]:
        view.show(SystemInfo.from_dict(reading))
    return view


# --------------------------------------------------------------------------- one frame


def test_once_prints_host_memory_and_exits_0(status_dir: Path, capsys) -> None:
    code, out, err = run_cli(["watch", "--once"], capsys)
    assert code == 0, err
    assert "Host memory" in out
    assert format_bytes(psutil.virtual_memory().total) in out
    if NO_DRIVER:
        assert "No NVIDIA GPU to show" in out


def test_once_shows_a_tracked_runs_phase_step_and_memory_split(tracked_run, capsys) -> None:
    code, out, err = run_cli(["watch", "--once"], capsys)
    assert code == 0, err
    row = next(line for line in out.splitlines() if str(tracked_run.pid) in line)
    assert "train.py --lr 3e-4" in row
    assert "optimizer" in row
    assert "1234" in row and " 7 " in row
    assert "6.00 GiB / 8.00 GiB" in row
    assert "7.00 GiB" in row  # peak allocated


def test_log_appends_one_row_per_reading_with_one_header(
    tracked_run, tmp_path: Path, capsys
) -> None:
    log = tmp_path / "watch.csv"
    for _ in range(2):
        code, _out, err = run_cli(["watch", "--once", "--log", str(log)], capsys)
        assert code == 0, err
    with log.open() as f:
        rows = list(csv.DictReader(f))
    assert log.read_text().count("time,kind,") == 1
    kinds = [row["kind"] for row in rows]
    per_reading = nvml.device_count() + 2  # devices, the tracked run, the host
    assert len(rows) == 2 * per_reading
    assert kinds.count("host") == 2 and kinds.count("tracked") == 2
    run = next(row for row in rows if row["kind"] == "tracked")
    assert int(run["pid"]) == tracked_run.pid
    assert (run["phase"], run["step"], run["epoch"]) == ("optimizer", "1234", "7")
    assert int(run["allocated_bytes"]) == 6 << 30 and int(run["reserved_bytes"]) == 8 << 30
    host = next(row for row in rows if row["kind"] == "host")
    assert int(host["total_bytes"]) == psutil.virtual_memory().total


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["watch", "--once", "--interval", "0"], "must be a positive number of seconds"),
        (["watch", "--once", "--interval", "-2"], "must be a positive number of seconds"),
        (["watch", "--once", "--device", "7"], "there is no GPU 7"),
        (["watch", "--once", "--log", "/no/such/folder/log.csv"], "cannot write the log"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(args, message, status_dir, capsys) -> None:
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("vramscope: error: ")
    assert message in err


def test_an_unsafe_status_directory_is_reported(status_dir: Path, capsys) -> None:
    status_dir.mkdir(mode=0o777)
    os.chmod(status_dir, 0o777)
    code, out, err = run_cli(["watch", "--once"], capsys)
    assert code == 0, err
    assert "Tracked runs not shown" in out and "chmod 700" in out


def test_piped_output_prints_a_frame_per_reading_until_sigterm(status_dir, tmp_path) -> None:
    log = tmp_path / "watch.csv"
    command = [sys.executable, "-m", "vramscope", "watch", "--interval", "0.1", "--log", str(log)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        if log.exists() and log.read_text().count(",host,") >= 3:  # the kind column
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=20)
    assert child.returncode == 0, err
    with log.open() as f:
        readings = [row for row in csv.DictReader(f) if row["kind"] == "host"]
    assert len(readings) >= 3
    assert out.count("vramscope watch ·") >= len(readings) - 1  # a frame per reading


# --------------------------------------------------------------------------- recorded H200


def test_recorded_h200_full_frame() -> None:
    view = replay()
    assert view.info is not None
    gpu = view.info.devices[0]
    console = Console(width=140, height=60, color_system=None)
    text = render_text(view.frame(console, height=60), width=140)
    assert f"GPU {gpu.index} · {gpu.name}" in text
    assert f"{format_bytes(gpu.used_bytes)} / {format_bytes(gpu.total_bytes)}" in text
    assert "Host memory" in text
    for proc in gpu.processes:
        assert str(proc.pid) in text
    # the memory history has one mark per reading, the largest one full height
    values = list(view.memory_history[gpu.index])
    history = next(line for line in text.splitlines() if "≤" in line)
    marks = history.split("≤")[0].split()[-1]
    assert set(marks) <= set(SPARK)
    assert len(marks) == len(values) and marks[values.index(max(values))] == SPARK[-1]


def test_recorded_h200_compact_frame_when_the_terminal_is_small() -> None:
    view = replay()
    assert view.info is not None
    gpu = view.info.devices[0]
    console = Console(width=70, height=8, color_system=None)
    frame = view.frame(console, height=8)
    text = render_text(frame, width=70)
    assert "compact" in text
    assert len(text.splitlines()) <= 8
    assert f"GPU{gpu.index} {format_bytes(gpu.used_bytes)}" in text
    assert "Host memory" in text


def test_sparkline_maps_zero_to_top_onto_the_blocks() -> None:
    assert sparkline([0, 50, 100], 100, 10) == "▁▅█"
    assert sparkline([0, 50, 100, 100], 100, 2) == "██"  # only the newest fit
    assert sparkline([], 100, 10) == ""


# --------------------------------------------------------------------------- live, in tmux

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """A private tmux server running one command in a pane of a given size."""

    def __init__(self, tmp_path: Path, command: str, width: int = 120, height: int = 40) -> None:
        self.socket = str(tmp_path / "tmux.sock")  # a private server, gone with tmp_path
        self.done = tmp_path / "done"
        self.stty = tmp_path / "stty"
        script = f"{command}; echo $? > {self.done}.tmp; stty -a > {self.stty}; "
        script += f"mv {self.done}.tmp {self.done}; sleep 30"
        self.tmux("new-session", "-d", "-s", "w", "-x", str(width), "-y", str(height), script)

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "w")

    def wait_for(self, text: str, timeout: float = 15.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared; the pane shows:\n{self.screen()}")

    def exit_code(self, timeout: float = 10.0) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.done.exists():
                return int(self.done.read_text())
            time.sleep(0.05)
        raise AssertionError(f"watch did not exit; the pane shows:\n{self.screen()}")

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def tmux_watch(tmp_path: Path, status_dir: Path) -> Iterator[Tmux]:
    env = f"VRAMSCOPE_STATUS_DIR={status_dir} "
    pane = Tmux(tmp_path, f"{env}{sys.executable} -m vramscope watch --interval 0.2")
    yield pane
    pane.close()


@needs_tmux
def test_live_view_shows_host_memory_and_quits_on_q(tmux_watch: Tmux) -> None:
    tmux_watch.wait_for("Host memory")
    tmux_watch.tmux("send-keys", "-t", "w", "q")
    assert tmux_watch.exit_code() == 0
    settings = tmux_watch.stty.read_text()
    assert " icanon" in settings and " echo " in settings  # the terminal is as it was


@needs_tmux
def test_live_view_quits_on_ctrl_c_and_restores_the_terminal(tmux_watch: Tmux) -> None:
    tmux_watch.wait_for("Host memory")
    tmux_watch.tmux("send-keys", "-t", "w", "C-c")
    assert tmux_watch.exit_code() == 0
    settings = tmux_watch.stty.read_text()
    assert " icanon" in settings and " echo " in settings


@needs_tmux
def test_live_view_turns_compact_when_the_terminal_shrinks(tmux_watch: Tmux) -> None:
    tmux_watch.wait_for("Host memory")
    tmux_watch.tmux("resize-window", "-t", "w", "-x", "50", "-y", "6")
    tmux_watch.wait_for("compact")
    tmux_watch.tmux("resize-window", "-t", "w", "-x", "120", "-y", "40")
    screen = tmux_watch.wait_for("╭")  # panels again
    assert "compact" not in screen
    tmux_watch.tmux("send-keys", "-t", "w", "q")
    assert tmux_watch.exit_code() == 0
