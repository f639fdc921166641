"""A script under `vramscope run` sees what it sees under `python SCRIPT`: its `__file__`
absolute, `__builtins__` the module (`sys.argv[0]` is absolute too, where Python keeps it as
typed: argparse's program name, its base name, is the same); and a process it forks keeps
the signal handlers it had before vramscope's (a multiprocessing pool ends its workers
with SIGTERM: they end as they would without vramscope, not as a stopped run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

RUN = [sys.executable, "-m", "vramscope", "run", "-q"]

PROBE = """
import os, sys
print("file", __file__)
print("argv0", sys.argv[0])
print("builtins", type(__builtins__).__name__, __builtins__.len([1, 2]))
os.chdir("/")
print("here", os.path.isfile(__file__))
"""

FORK_TERM = """
import os, signal, time
pid = os.fork()
if pid == 0:
    while True:
        time.sleep(0.01)
time.sleep(0.5)
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
print("child", f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "exit")
"""


def run(tmp_path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "script.py").write_text(source)
    return subprocess.run(
        [*RUN, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_the_script_sees_what_python_gives_it(tmp_path):
    proc = run(tmp_path, PROBE)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["file"] == str((tmp_path / "script.py").resolve())
    assert lines["argv0"].endswith("script.py")
    assert lines["builtins"] == "module 2"
    assert lines["here"] == "True"  # still found after os.chdir


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and Linux signals")
def test_a_forked_child_ends_on_sigterm_as_without_vramscope(tmp_path):
    proc = run(tmp_path, FORK_TERM)
    assert proc.returncode == 0, proc.stderr
    assert "child signal 15" in proc.stdout
    assert "stopped by SIGTERM" not in proc.stderr  # the run itself was not stopped


@pytest.mark.parametrize(("code", "status"), [("True", 1), ("256", 0), ("-1", 255), ("'no'", 1)])
def test_sys_exit_keeps_the_status_the_shell_would_see(tmp_path, code, status):
    import json

    (tmp_path / "script.py").write_text(f"import sys\nsys.exit({code})\n")
    proc = subprocess.run(
        [*RUN, "--json", "r.json", "script.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == status, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["exit"]["code"] == status
