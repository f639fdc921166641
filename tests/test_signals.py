"""Jobs that are stopped (a scheduler's preemption, `timeout`, `kill`, a closed terminal) still
leave their report, every file asked for, and the exit status of a killed process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vramscope import schema

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "train_until_stopped.py"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def start(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vramscope", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def wait_for(proc: subprocess.Popen, marker: str, timeout: float = 180) -> None:
    """Read the child's stdout until ``marker`` (the loop is running), or fail."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            if marker in line:
                return
    finally:
        watchdog.cancel()
    _, err = proc.communicate()
    pytest.fail(f"no {marker!r} line; exit {proc.returncode}\n{err[-2000:]}")


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running {timeout} s after the signal\n{err[-2000:]}")


@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGTERM, 143), (getattr(signal, "SIGHUP", 1), 129)],
    ids=["SIGTERM", "SIGHUP"],
)
def test_a_stopped_run_leaves_every_file_and_exits_as_a_killed_script(tmp_path, signum, code):
    outputs = {"json": "r.json", "csv": "steps.csv", "trace": "r.trace.json", "html": "r.html"}
    options = [arg for kind, name in outputs.items() for arg in (f"--{kind}", name)]
    proc = start("run", *options, str(SCRIPT), cwd=tmp_path)
    wait_for(proc, "training")
    proc.send_signal(signum)
    out, err = finish(proc)
    assert proc.returncode == code, err
    name = signal.Signals(signum).name
    assert f"stopped by {name}; the report is partial" in err
    assert "Traceback" not in err
    assert "What the peak is made of" in out  # the partial report is printed
    for name_ in outputs.values():
        assert (tmp_path / name_).stat().st_size > 0, name_
    data = json.loads((tmp_path / "r.json").read_text())
    assert schema.errors(data) == []
    assert data["exit"] == {
        "status": "terminated",
        "code": code,
        "error": f"stopped by {name}",
        "signal": name,
        "signal_number": signum,
        "killed_by": None,
        "lost_seconds": None,
        "source": None,
    }
    assert len(data["steps"]) >= 1
    assert (tmp_path / "steps.csv").read_text().count("\n") == len(data["steps"]) + 1


def test_a_second_signal_ends_at_once(tmp_path):
    """The script's cleanup hangs after the first SIGTERM; the second one is not waited on."""
    proc = start("run", "--json", "r.json", str(SCRIPT), "--hang-in-cleanup", cwd=tmp_path)
    wait_for(proc, "training")
    proc.send_signal(signal.SIGTERM)
    wait_for(proc, "cleaning up")
    proc.send_signal(signal.SIGTERM)
    finish(proc, timeout=20)
    assert proc.returncode == -signal.SIGTERM  # killed by the signal itself


def test_a_script_that_handles_sigterm_itself_keeps_its_own_handling(tmp_path):
    proc = start("run", "--json", "r.json", str(SCRIPT), "--own-handler", cwd=tmp_path)
    wait_for(proc, "training")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert "checkpoint saved" in out
    assert json.loads((tmp_path / "r.json").read_text())["exit"]["status"] == "ok"


def test_a_stopped_measure_leaves_its_report(tmp_path):
    wl = tmp_path / "wl.py"
    wl.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    m = torch.nn.Linear(32, 32)\n"
        "    calls = []\n"
        "    def batch():\n"
        "        calls.append(1)\n"
        "        if len(calls) == 2:\n"
        "            print('training', flush=True)\n"
        "        return (torch.randn(batch_size, 32),)\n"
        "    return vramscope.Workload(model=m, optimizer=torch.optim.SGD(m.parameters()),\n"
        "        batch=batch, loss=lambda m, x: m(x).sum())\n"
    )
    proc = start(
        "measure", f"{wl}:build", "--steps", "1000000", "-q", "--json", "m.json", cwd=tmp_path
    )
    wait_for(proc, "training")
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc)
    assert proc.returncode == 143, err
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["exit"]["status"] == "terminated" and data["exit"]["signal"] == "SIGTERM"
    assert len(data["steps"]) >= 1


def _frame_inside_the_schedule():
    """A real frame of vramscope's bookkeeping: the marker schedule calling its clock."""
    from vramscope.tracking.marking import MarkerSchedule

    frames = []

    def clock() -> float:
        frames.append(sys._getframe(1))  # marking.py's begin(), called from this test
        return 0.0

    MarkerSchedule("auto", clock=clock).begin(0)
    return frames[0]


def test_bookkeeping_is_told_from_the_users_code():
    import torch

    from vramscope.tracking.runner import _in_bookkeeping

    assert _in_bookkeeping(_frame_inside_the_schedule())
    assert not _in_bookkeeping(sys._getframe())  # this test: the user's code
    seen = []
    torch.nn.Linear(2, 2).apply(lambda m: seen.append(sys._getframe(1)))
    assert seen[0].f_code.co_filename.startswith(str(Path(torch.__file__).parent))
    assert not _in_bookkeeping(seen[0])  # torch's frame, called from the user's code


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_signal_in_the_bookkeeping_comes_again_in_the_users_code():
    # stopped inside a hook, the session would keep a half-made record (the run's open step
    # taken off as current and not yet stored: a report with no steps); the signal is sent
    # again a moment later and then ends the user's code as usual
    import time

    from vramscope.tracking.runner import StopSignals, Terminated

    with StopSignals() as stops:
        stops.arm()
        stops._handle(signal.SIGTERM, _frame_inside_the_schedule())  # deferred: no raise
        assert stops.received is None
        with pytest.raises(Terminated) as raised:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.001)  # the user's code, running
        assert raised.value.signum == signal.SIGTERM and stops.received is raised.value


def test_a_burst_of_one_passed_on_signal_is_not_taken_for_the_next_one():
    """Recorded: a SIGTERM passed on to the script came back acknowledged three times within
    10 ms; the two extra ones once swallowed the user's second SIGTERM 1 ms later."""
    from vramscope.journal.supervise import ACK_WAIT_S, _Relay

    sent: list[int] = []
    relay = _Relay(sent.append)
    relay.got(0.0, [signal.SIGTERM])
    relay.decide(ACK_WAIT_S)  # the child said nothing: passed on
    relay.acknowledged(ACK_WAIT_S, bytes([signal.SIGTERM]))
    relay.acknowledged(ACK_WAIT_S + 0.006, bytes([signal.SIGTERM]))
    relay.acknowledged(ACK_WAIT_S + 0.010, bytes([signal.SIGTERM]))
    relay.got(ACK_WAIT_S + 0.011, [signal.SIGTERM])  # the user's second one
    relay.decide(2 * ACK_WAIT_S + 0.011)
    assert sent == [signal.SIGTERM, signal.SIGTERM]


def test_a_signal_the_script_sends_itself_is_not_taken_for_one_from_outside():
    """A signal that came during vramscope's bookkeeping is sent again when the user's code
    runs; the child says so first. Its acknowledgment, however late, is not taken for a
    signal from outside, which would swallow the user's next one."""
    from vramscope.journal.supervise import ACK_WAIT_S, OWN, _Relay

    sent: list[int] = []
    relay = _Relay(sent.append)
    term = signal.SIGTERM
    relay.got(0.0, [term])
    relay.decide(ACK_WAIT_S)  # passed on
    relay.acknowledged(ACK_WAIT_S, bytes([term]))
    relay.acknowledged(0.9, bytes([OWN, term]))  # sent again, announced (a loaded machine)
    relay.acknowledged(1.4, bytes([term]))
    assert relay.direct == []
    relay.got(1.5, [term])  # the user's second one
    relay.decide(1.5 + ACK_WAIT_S)
    assert sent == [term, term]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_signal_sent_again_while_its_timer_starts_is_sent_once_more():
    """On a loaded machine the signal put off came back while the timer sending it was still
    starting (inside vramscope's handler): it is put off once more, not raised there."""
    import time

    from vramscope.tracking.runner import StopSignals, Terminated

    with StopSignals() as stops:
        stops.arm()
        stops._deferring = True  # as while the timer of a first deferral starts
        stops._handle(signal.SIGTERM, None)
        assert stops._again and stops.received is None
        stops._deferring = False
        stops._handle(signal.SIGTERM, _frame_inside_the_schedule())  # deferred: no raise
        with pytest.raises(Terminated):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.001)
