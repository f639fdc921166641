"""Line tables (--detail lines, @vramscope.profile(lines=True)) from real CPU runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import vramscope

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def rows_of(report, function: str) -> dict[str, dict]:
    table = next(t for t in report.extra["lines"] if t["function"] == function)
    return {r["contents"].strip(): r for r in table["lines"]}


@vramscope.profile(lines=True, print_report=False)
def allocate_and_free(steps: int) -> float:
    keep = []
    for _ in range(steps):
        big = torch.ones(1024, 1024)  # 4 MiB, freed on the next line
        del big
        keep.append(torch.zeros(256, 1024))  # 1 MiB kept per step
    return float(len(keep))


def test_line_table_has_peak_and_increment_per_line():
    allocate_and_free(3)
    report = allocate_and_free.last_report
    rows = rows_of(report, "allocate_and_free")
    big = rows["big = torch.ones(1024, 1024)  # 4 MiB, freed on the next line"]
    assert big["hits"] == 3
    assert big["increment_bytes"] == 3 * 4 * MIB
    assert big["peak_bytes"] >= 4 * MIB
    freed = rows["del big"]
    assert freed["increment_bytes"] == -3 * 4 * MIB
    kept = rows["keep.append(torch.zeros(256, 1024))  # 1 MiB kept per step"]
    assert kept["increment_bytes"] == 3 * MIB
    assert kept["end_bytes"] == 3 * MIB
    assert rows["for _ in range(steps):"]["hits"] == 4
    assert "host_rss_bytes" in kept and kept["host_rss_bytes"] > 0


def test_lines_that_never_ran_are_listed_without_numbers():
    allocate_and_free(0)
    rows = rows_of(allocate_and_free.last_report, "allocate_and_free")
    assert "hits" not in rows["del big"]
    assert rows["return float(len(keep))"]["hits"] == 1


def test_a_line_that_calls_a_profiled_function_includes_its_peak():
    def inner():
        x = torch.ones(2 * 1024, 1024)  # 8 MiB
        return x.sum()

    @vramscope.profile(lines=True, print_report=False)
    def outer():
        total = inner()
        return total

    outer()
    rows = rows_of(
        outer.last_report,
        "test_a_line_that_calls_a_profiled_function_includes_its_peak.<locals>.outer",
    )
    assert rows["total = inner()"]["peak_bytes"] >= 8 * MIB
    assert rows["total = inner()"]["increment_bytes"] < MIB


def test_track_with_lines_of_a_name():
    def step(n):
        a = torch.randn(n, 1024)
        return a.mean()

    with vramscope.track(detail="lines", device="cpu", lines_of=["step"]) as session:
        for _ in range(2):
            step(512)
    report = session.report()
    rows = rows_of(report, "test_track_with_lines_of_a_name.<locals>.step")
    assert rows["a = torch.randn(n, 1024)"]["increment_bytes"] == 2 * 2 * MIB


def test_run_detail_lines_profiles_the_script_itself(tmp_path):
    out = tmp_path / "r.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramscope",
            "run",
            "-q",
            "--detail",
            "lines",
            "--json",
            str(out),
            str(ROOT / "tests" / "scripts" / "train_loop.py"),
            "--epochs",
            "1",
            "--batches",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = vramscope.Report.load(out) if hasattr(vramscope, "Report") else None
    import json

    data = json.loads(out.read_text())
    functions = {t["function"] for t in data["lines"]}
    assert {"<module>", "Net.forward"} <= functions
    module = next(t for t in data["lines"] if t["function"] == "<module>")
    backward = next(r for r in module["lines"] if r["contents"].strip() == "loss.backward()")
    assert backward["hits"] == 2 and backward["peak_bytes"] > 0
    assert report is None or report.extra["lines"]


def test_terminal_prints_familiar_line_tables():
    from rich.console import Console

    allocate_and_free(1)
    console = Console(width=160, record=True)
    from vramscope.report.terminal import print_report

    print_report(allocate_and_free.last_report, console=console)
    text = console.export_text()
    for header in ("Line #", "Mem usage", "Increment", "Line Contents"):
        assert header in text
    assert "del big" in text
