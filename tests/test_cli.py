"""The command line: bad input gives one line and exit 2; scripts keep their exit code."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "train_loop.py"


def vramscope(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vramscope", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def vramscope_here(*args: str) -> subprocess.CompletedProcess:
    """The command line run in this process: what ``main`` writes and its exit code. For the
    many ways input can be bad, which ``main`` turns into one line; a fresh interpreter's
    start-up (several seconds of imports each) is checked by the tests that start one."""
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        pytest.raises(SystemExit) as exit_info,
    ):
        main(list(args))
    code = int(exit_info.value.code or 0)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("vramscope: error:")
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "missing.py"], "no such script"),
        (["measure", "missing.py:build"], "no such file"),
        (["measure", f"{ROOT / 'src/vramscope/examples.py'}:missing"], "has no function 'missing'"),
        (["measure", "example:cnn", "--batch-size", "0"], "0 is not in the range"),
        (["measure", "example:cnn", "--batch-size", "abc"], "'abc' is not a valid integer"),
        (["measure", "example:nope"], "no built-in example"),
        (["measure", "example:cnn", "--json", "/nonexistent/dir/r.json"], "does not exist"),
        (["report", "missing.json"], "no such report file"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    assert_one_line_error(vramscope_here(*args), needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "missing.py"], "no such script"),
        (["measure", "example:nope"], "no built-in example"),
    ],
)
def test_bad_input_to_the_command_itself_is_one_line_and_exit_2(args, needle):
    """The same in a fresh ``python -m vramscope``: nothing its imports print gets in."""
    assert_one_line_error(vramscope(*args), needle)


def test_build_that_raises_shows_its_error(tmp_path):
    wl = tmp_path / "wl.py"
    wl.write_text("def build(batch_size, device):\n    return 1 / 0\n")
    assert_one_line_error(
        vramscope_here("measure", f"{wl}:build"), "ZeroDivisionError: division by zero (at wl.py:2)"
    )


def test_report_of_a_file_that_is_not_a_report(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(vramscope("report", str(bad)), "not valid JSON")


def test_run_keeps_the_scripts_exit_code_and_saves_a_partial_report(tmp_path):
    out = tmp_path / "r.json"
    proc = vramscope(
        "run", "-q", "--json", str(out), str(SCRIPT), "--epochs", "1", "--exit-code", "3"
    )
    assert proc.returncode == 3
    report = json.loads(out.read_text())
    assert report["exit"] == {
        "status": "error",
        "code": 3,
        "error": "exited with 3",
        "signal": None,
        "signal_number": None,
        "killed_by": None,
        "lost_seconds": None,
        "source": None,  # written by the script's process, not made from its journal
    }
    assert not (tmp_path / "r.journal").exists()  # the report is written: no journal left
    assert len(report["steps"]) == 4


def test_run_of_a_failing_script_prints_its_traceback_and_exits_1(tmp_path):
    out = tmp_path / "r.json"
    proc = vramscope("run", "-q", "--json", str(out), str(SCRIPT), "--fail-at", "2")
    assert proc.returncode == 1
    assert "RuntimeError: failing on purpose" in proc.stderr
    assert "vramscope/tracking" not in proc.stderr  # only the user's frames
    report = json.loads(out.read_text())
    assert report["exit"]["status"] == "error"
    assert len(report["steps"]) == 3


def test_ctrl_c_leaves_a_partial_report(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters())\n"
        "for i in range(3):\n    m(torch.randn(2, 4)).sum().backward()\n    opt.step()\n"
        "raise KeyboardInterrupt\n"
    )
    out = tmp_path / "r.json"
    proc = vramscope("run", "-q", "--json", str(out), str(script))
    assert proc.returncode == 130
    report = json.loads(out.read_text())
    assert report["exit"]["status"] == "interrupted"
    assert len(report["steps"]) == 3


def test_script_arguments_after_the_script_are_the_scripts(tmp_path):
    out = tmp_path / "r.json"
    proc = vramscope(
        "run", "-q", "--json", str(out), str(SCRIPT), "--epochs", "2", "--batches", "3"
    )
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1 loss" in proc.stdout
    report = json.loads(out.read_text())
    assert [e["steps"] for e in report["epochs"]] == [3, 3]


def test_measure_writes_json_and_report_rerenders_it(tmp_path):
    out = tmp_path / "m.json"
    proc = vramscope("measure", "example:cnn", "-b", "2", "--steps", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "What the peak is made of" in proc.stdout
    report = json.loads(out.read_text())
    assert report["schema"] == "vramscope.report/1" and len(report["steps"]) == 2
    again = vramscope("report", str(out))
    assert again.returncode == 0 and "example:cnn" in again.stdout


def test_run_passes_stdin_stdout_and_stderr_through_to_the_script(tmp_path):
    script = tmp_path / "echo.py"
    script.write_text(
        "import sys\nline = sys.stdin.readline()\nprint('out:', line.strip())\n"
        "print('err:', line.strip(), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "-q", str(script)],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "out: hello\n"
    assert proc.stderr == "err: hello\n"


def test_report_refuses_an_output_it_cannot_write_before_printing_anything(capsys):
    from cli_run import run_cli

    code, out, err = run_cli(
        capsys,
        "report",
        str(Path(__file__).parent / "data" / "report_h200_gpt.json"),
        "--html",
        "/nonexistent_dir/x.html",
    )
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "vramscope: error: cannot write /nonexistent_dir/x.html: folder /nonexistent_dir does "
        "not exist"
    ]
