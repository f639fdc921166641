"""The pytest plugin, run by pytest's own pytester on the CPU: fixture, markers, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# pytester drops the modules imported during a test when the test ends; a torch module first
# imported there would later be imported a second time, which torch's operator registry refuses
import torch._dynamo  # noqa: F401  (tracking and estimates import it)

import vramscope
from vramscope.units import format_bytes

pytest_plugins = ["pytester"]
PLUGIN = "vramscope.integrations.pytest_plugin"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run pytest on a test file with this plugin loaded the way -p loads it (the
    installed entry point would load it a second time, so autoloading is off)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run_file(source: str, *options: str) -> pytest.RunResult:
        pytester.makepyfile(source)
        return pytester.runpytest_inprocess("-p", PLUGIN, "--strict-markers", *options)

    return run_file


TRAINING = """
import pytest, torch

def train(steps):
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model
"""


def test_the_fixture_tracks_the_test_and_its_report_shows_when_the_test_fails(run):
    result = run(
        TRAINING
        + """
def test_two_steps(vramscope):
    model = train(2)
    report = vramscope.report()
    assert [s.mode for s in report.steps] == ["train", "train"]
    assert report.categories_at_peak.parameters == (8 * 4 + 4) * 4
    assert report.categories_at_peak.optimizer_state == (8 * 4 + 4) * 4

def test_that_fails(vramscope):
    train(1)
    assert False, "wrong on purpose"
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert "Captured vramscope call" in output
    assert "What the peak is made of" in output  # the terminal report, in the failure
    assert "wrong on purpose" in output


JOURNALS = """
import os, pathlib, time

def journals(wait=0.0):
    folder = pathlib.Path(os.environ["VRAMSCOPE_STATUS_DIR"])
    deadline = time.monotonic() + wait  # (opened on the sampler's thread)
    while not list(folder.glob("*.journal")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sorted(p.name for p in folder.glob("*.journal"))

def test_journaled(vramscope):
    train(1)
    assert [name.split("-")[0] for name in journals(wait=1.0)] == [str(os.getpid())]

def test_the_journal_is_gone_after_the_test():
    assert journals() == []
"""


def test_a_tracked_test_journals_in_the_private_directory_unless_told_not_to(
    run, pytester, monkeypatch
):
    private = pytester.path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(private))
    result = run(TRAINING + JOURNALS, "-p", "no:randomly")
    result.assert_outcomes(passed=2)

    pytester.makeini("[pytest]\nvramscope_journal = false\n")
    result = run(TRAINING + JOURNALS.replace("[str(os.getpid())]", "[]"), "-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_without_cuda_the_markers_skip_with_their_reason_after_the_test_passed(run):
    result = run(
        """
import pytest

ran = []

@pytest.mark.limit_gpu_memory("2 GiB")
def test_limited():
    ran.append("limited")

@pytest.mark.check_gpu_leaks(repeat=3)
def test_leak_free():
    ran.append("leak")

def test_both_ran():
    assert ran == ["limited", "leak"]  # once each: nothing repeats without CUDA

@pytest.mark.limit_gpu_memory("2 GiB")
def test_failing_body_still_fails():
    assert False, "the body's own failure"
""",
        "-rs",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=1, skipped=2, failed=1)
    output = result.stdout.str()
    assert "limit_gpu_memory not checked: no CUDA device here (the test itself passed)" in output
    assert (
        "check_gpu_leaks not checked: no CUDA device here (the test ran once and passed)" in output
    )
    assert "the body's own failure" in output


def test_a_limit_is_checked_by_the_estimate_on_a_machine_without_cuda(run):
    estimated = vramscope.estimate("example:cnn", batch_size=8, gpu="h100-80gb")
    peak = estimated.peak.allocated_bytes
    assert 64 * 2**20 < peak < 1024**3
    result = run(
        """
import pytest

OPTIONS = dict(estimate="example:cnn", gpu="h100-80gb", batch_size=8)

@pytest.mark.limit_gpu_memory("1 GiB", **OPTIONS)
def test_fits():
    pass

@pytest.mark.limit_gpu_memory("64 MiB", **OPTIONS)
def test_does_not_fit():
    pass
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert (
        f"limit_gpu_memory: estimated peak allocated memory {format_bytes(peak)} on NVIDIA H100 "
        "80GB HBM3 (no CUDA device here) exceeds the limit of 64.00 MiB"
    ) in output
    assert "Captured vramscope estimate call" in output
    assert "vramscope · estimated" in output


def test_bad_marker_arguments_are_one_clear_line_each(run):
    result = run(
        """
import pytest

@pytest.mark.limit_gpu_memory("2 GiBs")
def test_bad_size():
    pass

@pytest.mark.limit_gpu_memory("2 GiB", gpu="h100-80gb")
def test_gpu_without_estimate():
    pass

@pytest.mark.limit_gpu_memory("2 GiB", estimate="example:cnn")
def test_estimate_without_batch_size():
    pass

@pytest.mark.limit_gpu_memory("2 GiB", estimate="example:nope", batch_size=2)
def test_unknown_workload():
    pass

@pytest.mark.check_gpu_leaks(repeat=1)
def test_one_repeat():
    pass

@pytest.mark.check_gpu_leaks(times=3)
def test_unknown_leak_option():
    pass
""",
    )
    result.assert_outcomes(errors=5, failed=1)
    output = result.stdout.str()
    for line in (
        "@pytest.mark.limit_gpu_memory on test_bad_size: cannot read '2 GiBs' as a size; "
        "write it like 24GiB, 80GB, 512MiB or 1073741824",
        "@pytest.mark.limit_gpu_memory on test_gpu_without_estimate: gpu only go with "
        "estimate=WORKLOAD",
        "@pytest.mark.limit_gpu_memory on test_estimate_without_batch_size: estimate= needs "
        "batch_size= (a whole number, 1 or more)",
        "limit_gpu_memory: cannot estimate 'example:nope'",
        "@pytest.mark.check_gpu_leaks on test_one_repeat: repeat must be a whole number, 2 or "
        "more, not 1",
        "@pytest.mark.check_gpu_leaks on test_unknown_leak_option: got an unexpected keyword "
        "argument 'times'",
    ):
        assert line in output
    assert "Traceback" not in output


def test_the_plugin_loads_without_importing_torch():
    code = f"import sys, {PLUGIN}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_pytest_finds_the_plugin_by_its_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"vramscope": PLUGIN}
