"""Answers a user can act on: one `fit` answer whatever the cap or the start, exit codes a
script can rely on, Ctrl-C and stop signals, options that conflict resolved out loud, and
sentences that read right, the same figure everywhere: each on real output (CPU estimates of
the built-in examples, the commands run as a user runs them)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_cli import vramscope_here
from vramscope.fit import wording
from vramscope.fit.search import Estimator, fit, fit_section, largest_batch, make_target
from vramscope.fit.strategies import get_strategy
from vramscope.report.words import a, change, count, duration, plural, ranges, signed_pct, times
from vramscope.units import format_bytes

GiB = 2**30
MiB = 2**20
# one worker runs this module (`--dist loadgroup`): its estimates of the CNN are made once
pytestmark = pytest.mark.xdist_group("answers")


def vramscope(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramscope", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"COLUMNS": "200", "NO_COLOR": "1", **_env()},
    )


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}


def one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error: "), proc.stderr
    assert needle in lines[0]


# ---- the words ---------------------------------------------------------------------------------


def test_counts_plurals_and_ranges_read_as_a_person_writes_them():
    assert count(1024) == "1,024" and count(None) == "?"
    assert plural(1, "step") == "1 step" and plural(1024, "batch size") == "1,024 batch sizes"
    assert times(1) == "once" and times(2) == "twice" and times(170) == "170 times"
    assert a("2.00 GiB budget") == "a 2.00 GiB budget" and a("8.00 GiB budget").startswith("an ")
    assert a("11.00 GiB").startswith("an ") and a("110.00 GiB").startswith("a ")
    assert ranges([[0, 2], [4, 4], [6, 6], [8, 8], [10, 19]]) == "0–2, 4, 6, 8 and 10–19"
    assert ranges(numbers=[1670, 1671, 1672, 1680]) == "1,670–1,672 and 1,680"
    assert ranges([[i, i] for i in range(9)], limit=3) == "0, 1, 2 and 6 more runs"


def test_a_change_carries_its_direction_in_words():
    # 701.87 MiB against 774.47 MiB: below, never "(-9%)" after the larger figure
    assert change(701.87, 774.47) == "9% below"
    assert change(774.47, 701.87) == "10% above"
    assert change(5, 5) == "the same as" and change(1000, 999) == "slightly above"
    assert signed_pct(-54.4) == "-54.4%" and signed_pct(0.9) == "+0.9%"
    assert signed_pct(0.0) == "0%" and signed_pct(None) == ""


def test_times_have_units_that_fit_them():
    assert duration(0.0004) == "400 µs" and duration(0.0124) == "12.4 ms"
    assert duration(0.307) == "307 ms" and duration(3.21) == "3.2 s"
    assert duration(245) == "4 min 05 s" and duration(None) == ""


# ---- fit: one answer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cnn_2g() -> Estimator:
    """The example CNN under a 2 GiB budget, no margin: where the H200 ran 217, ran out at
    218 and 219 and ran again from 220 to 224 (tests/data/fit_edges_h200.json)."""
    return Estimator(
        "example:cnn", make_target(None, 2 * GiB, 0), get_strategy("baseline"), None, None, None
    )


def test_the_answer_is_the_same_whatever_the_cap_or_the_start(cnn_2g):
    limit = cnn_2g.target.usable_bytes
    answers = {
        (cap, start): largest_batch(cnn_2g, limit, cap, start=start)[1]
        for cap, start in ((4096, None), (65536, None), (65536, 100), (65536, 300), (1024, 220))
    }
    assert set(answers.values()) == {217}, answers
    # every batch up to the answer fits, and the one above it does not
    assert cnn_2g.fits(217) and not cnn_2g.fits(218)
    assert all(cnn_2g.fits(b) for b in range(217 - 8, 218))


def test_batches_that_fit_above_the_answer_are_named(cnn_2g):
    limit = cnn_2g.target.usable_bytes
    for b in range(218, 226):  # what the search estimates when it lands at 225 first
        cnn_2g.fits(b, limit)
    from vramscope.fit.search import BatchSearch

    section = fit_section(cnn_2g, BatchSearch(runs=224, best=217), 4096)
    assert section["max_batch_size"] == 217
    assert [220, 224] in section["fits_above"] and section["largest_running"] >= 224
    line = wording.not_monotone_line(section)
    assert line.startswith("memory is not monotone in the batch size here: batch size 218 runs out")
    assert "220–224" in line
    assert "the answer is the largest batch size that fits with every smaller one" in line


def test_a_cap_that_binds_says_at_least():
    proc = vramscope("fit", "example:gpt", "--gpu", "h200", "--max-batch-size", "8")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first == (
        "Largest batch size: at least 8 (the search's cap; --max-batch-size to look further)"
    )


# ---- options that conflict ---------------------------------------------------------------------


def test_a_budget_with_a_gpu_is_the_limit_and_the_headline_says_so():
    report = fit("example:gpt", budget="1GiB", gpu="rtx4090", max_batch_size=2)
    target = wording.target_line(report.extra["fit"])
    assert target == (
        "fits a 1.00 GiB budget: reserved ≤ 972.80 MiB (5% margin kept free); the budget is "
        "the limit, not the 23.99 GiB of NVIDIA GeForce RTX 4090, which gives the kernels and "
        "the CUDA context"
    )
    assert report.device["name"] == "NVIDIA GeForce RTX 4090"  # its kernels and context
    alone = fit("example:gpt", budget="1GiB", max_batch_size=2).extra["fit"]
    assert wording.target_line(alone).endswith(
        "kernels and CUDA context of NVIDIA H200, the default GPU (--gpu to choose)"
    )


@pytest.mark.parametrize(
    ("budget", "needle"),
    [
        ("0", "--budget must be more than 0 bytes, not '0'"),
        ("0GiB", "--budget must be more than 0 bytes"),
        ("-4GiB", "cannot read '-4GiB' as a size"),
    ],
)
def test_a_budget_of_nothing_is_bad_input(budget, needle):
    one_line_error(vramscope_here("fit", "example:gpt", "--budget", budget), needle)


def test_a_budget_larger_than_the_gpu_is_bad_input():
    one_line_error(
        vramscope_here("fit", "example:gpt", "--budget", "40GiB", "--gpu", "rtx4090"),
        "--budget 40.00 GiB is more than NVIDIA GeForce RTX 4090 can give the allocator",
    )


def test_compare_says_which_gpu_it_judges_by_when_none_is_named(tmp_path):
    proc = vramscope(
        "compare", "example:gpt", "-b", "2", "--strategies", "sgd", "--json", "c.json", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "A row fits NVIDIA H200, the default GPU (--gpu to choose): device used ≤" in (
        proc.stdout
    )
    rows = json.loads((tmp_path / "c.json").read_text())["fit"]["strategies"]
    sgd = next(r for r in rows if r["name"] == "sgd")
    # the change column: sgd keeps no AdamW state, so less reserved memory, with a minus
    shown = next(line for line in proc.stdout.splitlines() if line.strip().startswith("sgd"))
    assert wording.reserved_change(sgd) in shown and wording.reserved_change(sgd).startswith("-")


# ---- exit codes --------------------------------------------------------------------------------


def test_an_estimate_that_does_not_fit_says_what_it_needs_and_exits_1(tmp_path):
    proc = vramscope(
        *("estimate", "example:gpt", "-b", "4", "--memory", "1GiB"),
        *("--json", "e.json", "--html", "e.html"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    data = json.loads((tmp_path / "e.json").read_text())
    verdict = data["verdict"]
    needs = verdict["needs"]["device_used_bytes"]
    assert needs > GiB  # what it needs, not the bytes held when it ran out
    assert verdict["needs"]["allocated_bytes"] >= data["peak"]["allocated_bytes"]
    sentence = (
        f"does not fit on NVIDIA H200: it needs {format_bytes(needs)} (device used on a GPU "
        f"large enough), {format_bytes(needs - GiB)} more than its 1.00 GiB; it runs "
        "out in the "
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("vramscope: " + sentence), last
    # the same sentence in the JSON's findings and on the HTML page
    assert data["findings"][0]["message"] == last.removeprefix("vramscope: ")
    page = (tmp_path / "e.html").read_text()
    assert sentence[0].upper() + sentence[1:] in page.replace("&#x27;", "'")


def test_compare_exits_1_when_no_strategy_fits():
    proc = vramscope(
        "compare", "example:gpt", "-b", "2", "--budget", "24MiB", "--strategies", "sgd"
    )
    assert proc.returncode == 1, proc.stderr
    assert "nothing here fits" in " ".join(proc.stdout.split())


def test_measure_exits_2_when_the_workload_raises(tmp_path):
    workload = tmp_path / "broken.py"
    workload.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    m = torch.nn.Linear(4, 4).to(device)\n"
        "    def loss(m, x):\n"
        "        raise ValueError('the loss is broken')\n"
        "    return vramscope.Workload(model=m, optimizer=torch.optim.SGD(m.parameters(), 0.1),\n"
        "        batch=lambda: torch.randn(batch_size, 4, device=device), loss=loss)\n"
    )
    proc = vramscope("measure", f"{workload}:build", "-b", "2", "--steps", "1", "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "vramscope: the workload failed: ValueError: the loss is broken; the report is partial"
    )


def test_a_loss_that_becomes_nan_is_null_in_the_reports(tmp_path):
    """An fp16 run whose loss overflows: the JSON report (no NaN in JSON) and the HTML one
    are written, the loss null."""
    workload = tmp_path / "nan.py"
    workload.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    m = torch.nn.Linear(4, 4).to(device)\n"
        "    return vramscope.Workload(model=m, optimizer=torch.optim.SGD(m.parameters(), 0.1),\n"
        "        batch=lambda: torch.randn(batch_size, 4, device=device),\n"
        "        loss=lambda m, x: m(x).sum() * float('nan'))\n"
    )
    out = tmp_path / "r.json"
    proc = vramscope(
        "measure", f"{workload}:build", "-b", "2", "--steps", "2", "-q", "--json", str(out),
        "--html", str(tmp_path / "r.html"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["losses"] == [None, None]
    assert (tmp_path / "r.html").stat().st_size > 0


# ---- Ctrl-C and stop signals -------------------------------------------------------------------


def stop_after(args: list[str], marker: str, signum: int, cwd: Path) -> tuple[int, str]:
    """Start ``vramscope ARGS``, send ``signum`` once ``marker`` shows on stderr; (exit code,
    stderr after the marker)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramscope", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            if marker in line:
                proc.send_signal(signum)
                break
        rest = proc.stderr.read()
        proc.wait()
    finally:
        watchdog.cancel()
    return proc.returncode, rest


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_fit_stopped_by_sigterm_says_so_and_keeps_its_estimates(tmp_path):
    code, err = stop_after(
        ["fit", "example:cnn", "--gpu", "rtx4090", "--json", "f.json"],
        "estimated batch 16",
        signal.SIGTERM,
        tmp_path,
    )
    assert code == 143, err
    lines = [line for line in err.splitlines() if not line.startswith("vramscope fit: ")]
    assert lines == [
        "vramscope: stopped by SIGTERM; what it had is written, marked partial: f.json"
    ]
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["exit"] == {
        "status": "terminated",
        "code": 143,
        "error": "stopped by SIGTERM",
        "signal": "SIGTERM",
        "signal_number": 15,
        "killed_by": None,
        "lost_seconds": None,
        "source": None,
    }
    section = data["fit"]
    assert section["interrupted"] and section["max_batch_size"] is None
    assert {p["batch_size"] for p in section["curve"]} >= {1, 16}
    assert section["fits_so_far"] >= 16


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_stops_a_comparison_with_the_rows_it_finished(tmp_path):
    code, err = stop_after(
        ["compare", "example:gpt", "-b", "2", "--json", "c.json"],
        "vramscope compare: baseline:",
        signal.SIGINT,
        tmp_path,
    )
    # 130, or killed by SIGINT when the interruption landed inside torch's own start-up
    # code (a shell reports 130 both ways)
    assert code in (130, -signal.SIGINT), err
    assert "vramscope: interrupted (Ctrl-C); what it had is written, marked partial: c.json" in err
    assert "Traceback" not in err
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["exit"]["status"] == "interrupted" and data["exit"]["code"] == 130
    assert data["fit"]["strategies"][0]["name"] == "baseline"


# ---- sentences on real output ------------------------------------------------------------------

WRONG = [
    (r"\(s\)", "a plural written as (s)"),
    (r"\(-[\d.]+ ?[KMGT]?i?B over\)", "a negative amount over"),
    (r"\d+ ?[KMGT]iB \([+-]\d+%\)", "a change whose sign reads against the figure before it"),
    (r"\b0\.0 ms\b", "a time column where nothing was timed"),
    (r"one in every 1\b", "one in every 1"),
    (r"\b1 (steps|batches|estimates|trials|times)\b", "a singular written as a plural"),
    (r"\b(headroom pct|device used bytes|total bytes|oom at)\b", "a raw key"),
    (r"\w+_(bytes|pct)\b", "a field name in a sentence"),
    (r"\ba (8|11\b|18\b)", "'a' where the number is read with a vowel"),
]


def wrong_phrases(text: str) -> list[str]:
    return [f"{why}: {m.group(0)!r}" for rx, why in WRONG for m in re.finditer(rx, text)]


def test_an_estimate_reads_right_and_says_the_context_as_list_gpus_does(tmp_path):
    proc = vramscope(
        *("estimate", "example:cnn", "--gpu", "rtx4090", "-b", "8"),
        *("--json", "e.json", "--html", "e.html"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert wrong_phrases(proc.stdout) == []
    assert not re.search(r"\btime\b", proc.stdout.split("What the peak")[0])  # no times
    page = (tmp_path / "e.html").read_text()
    verdict = page[page.index('id="verdict"') :][:3000]
    assert wrong_phrases(verdict) == [], verdict
    data = json.loads((tmp_path / "e.json").read_text())
    context = data["startup"]["context_and_libraries_bytes"]
    listed = vramscope_here("estimate", "--list-gpus").stdout
    base = next(line for line in listed.splitlines() if line.startswith("rtx4090 "))
    # the list's context and the estimate's are one figure, and the estimate says how it
    # grows from it (a CNN's training step: cuDNN's kernels)
    assert format_bytes(480 * MiB) in base
    note = next(f["message"] for f in data["findings"] if f["kind"] == "uncalibrated")
    assert f"{format_bytes(context)} (480.00 MiB a training step with cuBLAS, +10.00 MiB" in note
    assert format_bytes(context) in proc.stdout


def test_a_fit_reads_right_in_the_terminal_and_on_the_page(tmp_path):
    proc = vramscope(
        *("fit", "example:cnn", "--budget", "256MiB", "--max-batch-size", "64"),
        *("--json", "f.json", "--html", "f.html"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert wrong_phrases(proc.stdout) == []
    section = json.loads((tmp_path / "f.json").read_text())["fit"]
    lines = wording.headline_lines(section)
    for line in lines[:3]:  # the same words in the terminal and on the page
        assert " ".join(line.split()) in " ".join(proc.stdout.split())
    page = (tmp_path / "f.html").read_text().replace("&#x27;", "'")
    assert lines[0] in page and lines[1] in page
    assert lines[0] == f"Largest batch size: {count(section['answer']['max_batch_size'])}"
