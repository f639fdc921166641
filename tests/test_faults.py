"""Nothing lost when a run dies: real training scripts under `vramscope run`, killed with
SIGKILL at seeded random moments, crashing with a segfault, leaving with `os._exit(5)`,
running into a host memory limit, and hanging until a timeout stops them. Each leaves a
report (made from the run's journal when the script's process could not write it), with
the script's exit code, every step the script finished more than one second before it
died, and peaks no lower than what the script printed then.

Each test plays its scenario in a real process tree (`pytest -n auto` spreads them over the
cores); the SIGKILLs fall at moments drawn from a seeded generator.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from vramscope import schema

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "train_until_killed.py"
MIB = 2**20
RUN = [sys.executable, "-m", "vramscope", "run", "-q", "--json", "r.json"]  # SCRIPT, ARGS
SEED = 2034  # kills at 0.23, 1.08 and 2.42 s: before the first step, and later
_moments = random.Random(SEED)
KILL_AFTER_S = [round(_moments.uniform(0.0, 3.0), 2) for _ in range(3)]  # after its first line

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux signals")


@dataclass
class Scenario:
    name: str
    args: list[str]
    kill_after_s: float | None = None  # SIGKILL the script's process this long after it began
    group_signal: int | None = None  # once it hangs, signal the whole group (as `timeout` does)
    # what the run left
    returncode: int | None = None
    stderr: str = ""
    parameters: int | None = None
    done: list[tuple[int, float, int]] = field(default_factory=list)  # (step, time, rss)
    ended_at: float | None = None  # when the script's process died (as it said, or we did)
    hung_at: float | None = None  # when its last step began to hang (as read)
    folder: Path | None = None

    def report(self, name: str = "r.json") -> dict:
        assert self.folder is not None
        data = json.loads((self.folder / name).read_text())
        assert schema.errors(data) == []
        return data


SCENARIOS = {
    **{
        f"sigkill-{i}": Scenario(f"sigkill-{i}", [], kill_after_s=delay)
        for i, delay in enumerate(KILL_AFTER_S)
    },
    "segfault": Scenario("segfault", ["--die", "segfault", "--at", "6"]),
    "os_exit": Scenario("os_exit", ["--die", "exit", "--at", "6"]),
    "memory_limit": Scenario("memory_limit", ["--die", "memory", "--at", "4"]),
    "hang": Scenario("hang", ["--die", "hang", "--at", "4"], group_signal=signal.SIGTERM),
    "ctrl_c": Scenario("ctrl_c", ["--die", "hang", "--at", "4"], group_signal=signal.SIGINT),
    "hang_holding_the_gil": Scenario(
        "hang_holding_the_gil",
        ["--die", "hang-holding-the-gil", "--at", "4"],
        group_signal=signal.SIGKILL,
    ),
}


def _interruptible() -> None:
    """The script hears SIGINT as a terminal's script does: a test run started in the
    background by a non-interactive shell (``pytest ... &``) ignores SIGINT, and a child
    inherits that (POSIX), so Ctrl-C would never reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def play(name: str, folder: Path) -> Scenario:
    """Run scenario ``name`` to its end in ``folder``, reading what the script prints."""
    scenario = replace(SCENARIOS[name], done=[], folder=folder)
    proc = subprocess.Popen(
        [*RUN, str(SCRIPT), *scenario.args],
        cwd=folder,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as under `timeout` or a scheduler
        preexec_fn=_interruptible,
    )
    seen: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            words = line.split()
            if words[:1] == ["pid"]:
                scenario.parameters = int(words[3])
                seen.update(pid=int(words[1]), began=time.monotonic())
            elif words[:1] == ["done"]:
                scenario.done.append((int(words[1]), float(words[2]), int(words[3])))
            elif words[:1] == ["dying"]:
                scenario.ended_at = float(words[1])
            elif words[:1] == ["hanging"]:
                seen["hung"] = time.monotonic()
                scenario.hung_at = time.time()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        now = time.monotonic()
        if scenario.kill_after_s is not None and now - seen.get("began", now) >= (
            scenario.kill_after_s
        ):
            scenario.ended_at = time.time()
            os.kill(int(seen["pid"]), signal.SIGKILL)  # what the kernel's OOM killer sends
            scenario.kill_after_s = None
        if scenario.group_signal is not None and now - seen.get("hung", now) >= 1.0:
            scenario.ended_at = time.time()  # the timeout: a second after the step hung
            os.killpg(proc.pid, scenario.group_signal)
            scenario.group_signal = None
        time.sleep(0.01)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    scenario.returncode = proc.wait(timeout=60)
    reader.join(timeout=30)
    scenario.stderr = proc.stderr.read() if proc.stderr else ""
    return scenario


def finished_a_second_before(scenario: Scenario) -> list[int]:
    assert scenario.ended_at is not None
    return [step for step, at, _ in scenario.done if at <= scenario.ended_at - 1.0]


def check_steps_and_peaks(
    scenario: Scenario,
    report: dict,
    grew_at_the_end: bool = False,
    sampled_until: float | None = None,
) -> None:
    """Every step finished a second before the end is there; the host memory peak is no
    lower than what the script had a second before ``sampled_until`` (the end, or when
    Python stopped running: a hang holding the GIL stops the sampler too; its memory only
    grows), nor far above what it printed last (unless it ``grew_at_the_end``)."""
    indices = {
        i for s in report["steps"] for i in range(s["index"], (s["last_index"] or s["index"]) + 1)
    }
    assert set(finished_a_second_before(scenario)) <= indices
    assert indices <= {step for step, _, _ in scenario.done} | {max(indices, default=0)}
    until = sampled_until if sampled_until is not None else scenario.ended_at
    assert until is not None
    early = [rss for _, at, rss in scenario.done if at <= until - 1.0]
    peak = report["peak"]["host_rss_bytes"]
    if early:
        assert peak >= max(early)
    if scenario.done and not grew_at_the_end:
        assert peak <= 2 * max(rss for _, _, rss in scenario.done)
    assert report["categories_at_peak"]["parameters"] == scenario.parameters


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("sigkill")])
def test_a_sigkill_leaves_a_report_from_the_journal_and_exit_137(tmp_path, name):
    scenario = play(name, tmp_path)
    assert scenario.returncode == -signal.SIGKILL, scenario.stderr  # a shell says 137
    report = scenario.report()
    assert report["exit"]["status"] == "killed" and report["exit"]["code"] == 137
    assert report["exit"]["signal"] == "SIGKILL" and report["exit"]["signal_number"] == 9
    assert report["exit"]["source"] == "journal"
    assert 0 <= report["exit"]["lost_seconds"] <= 1.0
    assert "the report is made from its journal" in scenario.stderr
    assert (scenario.folder / "r.journal").exists()  # kept: `vramscope report` reads it again
    check_steps_and_peaks(scenario, report)


def test_a_segfault_leaves_a_report_and_exit_139(tmp_path):
    scenario = play("segfault", tmp_path)
    assert scenario.returncode == -signal.SIGSEGV, scenario.stderr  # a shell says 139
    report = scenario.report()
    assert report["exit"]["status"] == "crashed" and report["exit"]["code"] == 139
    assert report["exit"]["signal"] == "SIGSEGV" and "segmentation fault" in report["exit"]["error"]
    assert [s["index"] for s in report["steps"]] == list(range(6))  # the 7th had not ended
    check_steps_and_peaks(scenario, report)


def test_os_exit_leaves_a_report_and_keeps_its_code(tmp_path):
    scenario = play("os_exit", tmp_path)
    assert scenario.returncode == 5, scenario.stderr
    report = scenario.report()
    assert report["exit"]["status"] == "error" and report["exit"]["code"] == 5
    assert report["exit"]["signal"] is None and report["exit"]["source"] == "journal"
    assert "exited with code 5" in report["exit"]["error"]
    check_steps_and_peaks(scenario, report)


def test_a_host_memory_limit_leaves_a_report_of_the_allocation_that_failed(tmp_path):
    """RLIMIT_AS (the address space) set by the script: torch's allocator fails, the
    script's process writes its own report (a SIGKILL from the OOM killer is the sigkill
    scenarios' case, and test_the_kernels_oom_killer_is_named's where a cgroup can be made)."""
    scenario = play("memory_limit", tmp_path)
    assert scenario.returncode == 1, scenario.stderr
    report = scenario.report()
    assert report["exit"]["status"] == "error"
    assert "allocate memory" in report["exit"]["error"] or "MemoryError" in report["exit"]["error"]
    assert report["peak"]["host_rss_bytes"] >= max(rss for _, _, rss in scenario.done) + 128 * MIB
    check_steps_and_peaks(scenario, report, grew_at_the_end=True)


def test_a_hung_step_stopped_by_a_timeout_leaves_the_scripts_own_report(tmp_path):
    """SIGTERM to the whole group, as `timeout` sends it: the script gets it once (not once
    more from vramscope's parent), and writes its partial report."""
    scenario = play("hang", tmp_path)
    assert scenario.returncode == 143, scenario.stderr
    report = scenario.report()
    assert report["exit"]["status"] == "terminated" and report["exit"]["source"] is None
    assert [s["index"] for s in report["steps"]] == [0, 1, 2, 3, 4]  # 4: the hung one
    assert not (scenario.folder / "r.journal").exists()
    check_steps_and_peaks(scenario, report)


def test_ctrl_c_in_a_terminal_interrupts_the_script_once(tmp_path):
    """SIGINT to the whole group, as a terminal's Ctrl-C sends it: one KeyboardInterrupt in
    the script (vramscope's parent passes on nothing), its own partial report, exit 130."""
    scenario = play("ctrl_c", tmp_path)
    assert scenario.returncode == 130, scenario.stderr
    report = scenario.report()
    assert report["exit"]["status"] == "interrupted" and report["exit"]["source"] is None
    assert [s["index"] for s in report["steps"]] == [0, 1, 2, 3, 4]
    assert scenario.stderr.count("KeyboardInterrupt") <= 1
    check_steps_and_peaks(scenario, report)


def test_a_hang_holding_the_gil_killed_with_its_group_is_read_by_hand(tmp_path):
    """SIGKILL to the whole group (`timeout -s KILL`) takes vramscope's parent too: the
    journal is there, and `vramscope report` makes the report from it."""
    scenario = play("hang_holding_the_gil", tmp_path)
    assert scenario.returncode == -signal.SIGKILL
    assert not (scenario.folder / "r.json").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "report", "-q", "--json", "r.json", "r.journal"],
        cwd=scenario.folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = scenario.report()
    assert report["exit"]["status"] == "unknown" and report["exit"]["source"] == "journal"
    assert [s["index"] for s in report["steps"]] == [0, 1, 2, 3]
    check_steps_and_peaks(scenario, report, sampled_until=scenario.hung_at)


# ---- the kernel's OOM killer, where the machine lets a test make a memory cgroup ------------


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path | None]:
    """A memory cgroup of this test's, below this process's, holding at most ``limit``
    bytes (swap included); None where this machine does not let a test make one."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") or [""]:
            found[controller] = path.lstrip("/")
    name = f"vramscope-test-{os.getpid()}"
    if "memory" in found:  # cgroup v1
        base = Path("/sys/fs/cgroup/memory") / found["memory"]
        files = {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit}
    elif "" in found:  # cgroup v2, where memory is delegated to this process's children
        base = Path("/sys/fs/cgroup") / found[""]
        try:
            delegated = "memory" in (base / "cgroup.subtree_control").read_text().split()
        except OSError:
            delegated = False
        if not delegated:
            yield None
            return
        files = {"memory.max": limit, "memory.swap.max": 0}
    else:
        yield None
        return
    group = base / name
    try:
        group.mkdir()
    except OSError:
        yield None
        return
    try:
        for key, value in files.items():
            with contextlib.suppress(OSError):  # (memsw without swap accounting)
                (group / key).write_text(str(value))
        yield group
    finally:
        for _ in range(100):  # once its processes are gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_the_kernels_oom_killer_is_named(tmp_path):
    """A real OOM kill: the run (vramscope's parent and the script) in a memory cgroup of
    700 MiB, the script keeping 8 MiB a step until the kernel kills it."""
    with memory_cgroup(700 * MIB) as group:
        if group is None:
            pytest.skip("this machine does not let a test make a memory cgroup")

        def enter() -> None:  # (in the child, before it runs vramscope)
            (group / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.run(
            [*RUN, str(SCRIPT), "--leak-mib", "8"],
            cwd=tmp_path,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=enter,
        )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"]["killed_by"] == "oom-killer", report["exit"]
    assert "killed by the kernel's OOM killer" in report["exit"]["error"]
    done = [line.split() for line in proc.stdout.splitlines() if line.startswith("done")]
    assert len(report["steps"]) >= len(done) - 1 > 0
    (finding,) = [f for f in report["findings"] if f["kind"] == "journal"]
    assert finding["message"].startswith("the kernel's OOM killer ended the run")
    last = float(done[-1][2])  # (it died within a step of its last line)
    early = [int(d[3]) for d in done if float(d[2]) <= last - 1.0]
    assert report["peak"]["host_rss_bytes"] >= max(early, default=0)


QUICK_STEPS_THEN_OS_EXIT = """
import os, torch
torch.manual_seed(0)
m = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(STEPS):
    opt.zero_grad()
    m(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
os._exit(0)
"""


@pytest.mark.parametrize("steps", [5, 200])
def test_os_exit_right_after_quick_steps_leaves_every_step_that_ended(tmp_path, steps):
    """Steps of a fraction of a millisecond, each stored within STEP_WRITE_GAP_S of the last
    write, wait for the next one; os._exit (which unwinds nothing) writes them first: the
    journal's report has every step that ended (the last one was still open)."""
    script = tmp_path / "quick.py"
    script.write_text(QUICK_STEPS_THEN_OS_EXIT.replace("STEPS", str(steps)))
    proc = subprocess.run(
        [*RUN, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"]["source"] == "journal"
    covered = [
        i for s in report["steps"] for i in range(s["index"], (s["last_index"] or s["index"]) + 1)
    ]
    assert covered == list(range(steps - 1))
