"""The CUDA path of tracking, on a real GPU: phase peaks, reconciliation, OOM, user peaks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vramscope
from vramscope.examples import build_gpt
from vramscope.workload import StepRunner

from .windows import manual_phase_peaks

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "train_loop.py"


def test_phase_peaks_equal_max_memory_allocated_windows() -> None:
    device = torch.device("cuda")
    w = build_gpt(8, device)
    runner = StepRunner(w, device)
    for _ in range(2):  # warm: optimizer state, cuBLAS workspaces
        runner()
    expected = manual_phase_peaks(runner)
    with vramscope.track() as session:
        w.optimizer.zero_grad(set_to_none=True)
        manual_phase_peaks(runner)
    report = session.report()
    step = report.steps[-1]
    got = {p.name: p.peak_allocated_bytes for p in step.phases}
    for name in ("forward", "backward", "optimizer"):
        assert got[name] == expected[name], (name, got, expected)
    assert report.peak.allocated_bytes == max(expected.values())


def test_steps_read_on_a_schedule_keep_every_peak_exact() -> None:
    """``phase_steps=4``: after the first steps, 1 step in 4 reads at its phase boundaries;
    the others are folded into the read step before them. Each record's peak is the highest
    max_memory_allocated of its steps, and a peak inside unread steps is exact and said."""
    device = torch.device("cuda")
    w = build_gpt(8, device)
    runner = StepRunner(w, device)
    for _ in range(2):
        runner()
    peaks = []
    with vramscope.track(phase_steps=4) as session:
        for i in range(48):
            torch.cuda.reset_peak_memory_stats()
            extra = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if i == 21 else None
            runner()
            del extra
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
    report = session.report()
    steps = report.steps
    assert sum(s.count for s in steps) == 48 and len(steps) < 48
    for s in steps:
        last = s.last_index if s.last_index is not None else s.index
        assert s.peak_allocated_bytes == max(peaks[s.index : last + 1]), (s.index, last)
    # the read steps: the first ones, then every 4th from the last of them; step 21 lies in
    # the unread steps after the read step before it
    from vramscope.tracking.phase_reads import AGAIN_STEPS, FIRST_STEPS

    read = FIRST_STEPS - 1 + 4 * ((21 - (FIRST_STEPS - 1)) // 4)
    first, last = read + 1, read + 3
    assert report.peak.allocated_bytes == max(peaks) == peaks[21]
    assert report.peak.phase is None and first <= report.peak.step <= last
    assert report.extra["phase_reads"]["interval"] == 4
    notes = " ".join(report.extra["tracking_notes"])
    assert "phases were read on 1 step in 4" in notes
    assert f"the run's peak was reached in steps {first}-{last}" in notes
    # read phase by phase again after it: one record per step
    assert {s.index for s in steps if s.count == 1} >= set(range(last + 1, last + AGAIN_STEPS))
    assert all(s.micro_batches == 1 for s in steps)


def test_unread_steps_counted_at_once_or_late_give_the_same_records(monkeypatch) -> None:
    """An unread step only logs what it did; the log is counted into the records when the
    next step reads, or sooner when it grows long (``UNREAD_LOG_LIMIT``). Counted after every
    entry or at the read, the records are the same: steps, counts and phases, and every
    entry's peak is the highest of its steps' own ``max_memory_allocated``. (Each run is held
    to its own steps: two runs in one process need not allocate alike to the byte; on an H200
    one run's third step took 121.8 MiB more than the other's, both measured exactly.)"""
    from vramscope.tracking import boundaries

    device = torch.device("cuda")
    w = build_gpt(8, device)
    runner = StepRunner(w, device)
    for _ in range(2):
        runner()

    def records(limit: int) -> list[tuple]:
        monkeypatch.setattr(boundaries, "UNREAD_LOG_LIMIT", limit)
        peaks = []
        with vramscope.track(phase_steps=5) as session:
            for _ in range(40):
                torch.cuda.reset_peak_memory_stats()
                runner()
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated())
        report = session.report()
        assert sum(s.count for s in report.steps) == 40
        assert len(report.timeline.markers) >= 40
        for s in report.steps:
            last = s.last_index if s.last_index is not None else s.index
            assert s.peak_allocated_bytes == max(peaks[s.index : last + 1]), (limit, s.index)
        return [
            (s.index, s.count, s.last_index, sorted((p.name, p.count) for p in s.phases))
            for s in report.steps
        ]

    at_the_read = records(4096)
    assert len(at_the_read) < 40  # unread steps were folded
    assert records(1) == at_the_read


def test_the_sampler_slows_once_phases_are_read_on_a_sample_of_the_steps() -> None:
    """Steps read 1 in 4: from the first unread step the sampler ticks every 0.5 s (its turns
    at the interpreter lock cost a short step more than its samples show); an interval the
    user set is kept."""
    device = torch.device("cuda")
    w = build_gpt(8, device)
    runner = StepRunner(w, device)
    for _ in range(2):
        runner()
    with vramscope.track(phase_steps=4) as session:
        for _ in range(24):
            runner()
    sampler = session.report().extra["sampler"]
    assert sampler["auto"] is True and sampler["interval_s"] == 0.1
    assert [pace[1] for pace in sampler["paces"]] == [0.5]
    assert sampler["effective_interval_s"] == 0.5
    with vramscope.track(phase_steps=4, interval_s=0.1) as session:
        for _ in range(24):
            runner()
    sampler = session.report().extra["sampler"]
    assert sampler["auto"] is False and sampler["paces"] == []
    assert sampler["effective_interval_s"] == 0.1


def test_reconciliation_sums_exactly() -> None:
    report = vramscope.measure("example:gpt", batch_size=8, steps=3)
    end = next(r for r in report.reconciliation if r.moment == "end")
    assert end.tensors.total() == end.allocated_bytes
    s = end.slack
    assert end.allocated_bytes + s.cached_free_bytes + s.fragmentation_bytes == end.reserved_bytes
    if end.device_used_bytes is not None:
        assert end.reserved_bytes + end.context_and_libraries_bytes == end.device_used_bytes
        assert end.context_and_libraries_bytes > 100 * 2**20  # a CUDA context is hundreds of MiB
        assert (
            end.device_used_bytes
            + end.other_processes_bytes
            + end.driver_reserved_bytes
            + end.unaccounted_bytes
            + end.free_bytes
            == end.total_bytes
        )
    peak = next(r for r in report.reconciliation if r.moment == "peak")
    assert peak.tensors.total() == report.peak.allocated_bytes
    assert (
        peak.allocated_bytes + peak.slack.cached_free_bytes + peak.slack.fragmentation_bytes
        == peak.reserved_bytes
    )


def test_measure_peak_is_max_memory_allocated_of_the_same_steps() -> None:
    torch.cuda.reset_peak_memory_stats()
    report = vramscope.measure("example:cnn", batch_size=64, steps=3)
    # the user's view is untouched by vramscope's resets (the peak ledger)
    assert torch.cuda.max_memory_allocated() >= report.peak.allocated_bytes
    assert report.peak.allocated_bytes == max(s.peak_allocated_bytes for s in report.steps)
    cats = report.categories_at_peak
    assert cats.total() == report.peak.allocated_bytes
    assert cats.parameters > 0 and cats.optimizer_state > 0


def test_user_max_memory_allocated_unchanged_by_tracking() -> None:
    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with vramscope.track():
        big = torch.empty(256 * 2**20, device=device, dtype=torch.uint8)
        del big
        w = build_gpt(2, device)
        StepRunner(w, device)()  # phase resets happen here
        seen_inside = torch.cuda.max_memory_allocated()
    assert seen_inside >= base + 256 * 2**20
    assert torch.cuda.max_memory_allocated() >= base + 256 * 2**20


def test_a_users_reset_holds_after_tracking_reads() -> None:
    """After the user's reset_peak_memory_stats(), max_memory_allocated() is the peak since
    then, also once vramscope has read at its phase boundaries: the peak the reset wiped goes
    into vramscope's own phase, not back into the user's figure."""
    device = torch.device("cuda")
    runner = StepRunner(build_gpt(2, device), device)
    runner()
    with vramscope.track():
        runner()  # vramscope reads and resets at its phase boundaries
        big = torch.empty(2 * 2**30, device=device, dtype=torch.uint8)
        del big
        torch.cuda.reset_peak_memory_stats()
        after = torch.cuda.memory_allocated()
        runner()  # and again, after the user's reset
        seen = torch.cuda.max_memory_allocated()
    assert after < seen < after + 2 * 2**30


def test_run_script_reports_phases_steps_epochs(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramscope",
            "run",
            "-q",
            "--json",
            str(out),
            str(SCRIPT),
            "--epochs",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert len(report["epochs"]) == 2
    # 8 training steps, short ones: the first read phase by phase, the rest folded into
    # entries that stand for several (count)
    train = [s for s in report["steps"] if s["mode"] == "train"]
    assert sum(s.get("count", 1) for s in train) == 8
    assert report["peak"]["allocated_bytes"] > 0
    assert report["peak"]["device_used_bytes"] > report["peak"]["reserved_bytes"]


def test_oom_inside_run_leaves_an_oom_report(tmp_path: Path) -> None:
    out = tmp_path / "oom.json"
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "-q", "--json", str(out), str(SCRIPT), "--oom"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "OutOfMemoryError" in proc.stderr
    report = json.loads(out.read_text())
    assert report["exit"]["status"] == "oom"
    assert report["oom"]["phase"] == "forward"
    assert report["oom"]["module"] == "Net"
    assert report["oom"]["requested_bytes"] == 1 << 46
    assert report["oom"]["total_bytes"] > 0
    assert any(f["kind"] == "oom" for f in report["findings"])


def test_side_stream_allocations_count_in_the_peak() -> None:
    model = torch.nn.Linear(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with vramscope.track() as session:
        x = torch.randn(256, 1024, device="cuda")
        with torch.cuda.stream(side):
            staged = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
            staged.fill_(1)
        side.synchronize()
        del staged
        model(x).sum().backward()
    report = session.report()
    assert report.peak.allocated_bytes == torch.cuda.max_memory_allocated()
    assert report.peak.allocated_bytes >= 64 * 2**20


LEAK = ROOT / "tests" / "scripts" / "leak_steps.py"


@pytest.mark.parametrize("end", ["normal", "oom", "sigterm", "sigint"])
def test_every_step_entry_is_exact_however_the_run_ends(end: str, tmp_path: Path) -> None:
    """Memory grows 64 MiB a step, an evaluation step comes in between, phases are read on 1
    step in 8: every entry's peak is the highest of the script's own per-step
    max_memory_allocated among the steps it stands for, the step the run ended in included,
    whether it ends normally, out of memory, by SIGTERM or by Ctrl-C. The script bounds its
    steps as vramscope does (docs/tracking.md): the 64 MiB kept after an optimizer step and
    the next batch are the next step's."""
    peaks_path, report_path = tmp_path / "peaks.json", tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "--phase-steps", "8", "--json",
         str(report_path), str(LEAK), "--end", end, "--peaks", str(peaks_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    peaks = json.loads(peaks_path.read_text())
    report = json.loads(report_path.read_text())
    assert report["exit"]["status"] == {
        "normal": "ok", "oom": "oom", "sigterm": "terminated", "sigint": "interrupted"
    }[end]  # fmt: skip
    steps = report["steps"]
    assert sum(s["count"] for s in steps) == len(peaks)
    assert len(steps) < len(peaks)  # steps were folded
    for s in steps:
        last = s["last_index"] if s["last_index"] is not None else s["index"]
        assert s["peak_allocated_bytes"] == max(peaks[s["index"] : last + 1]), (s, peaks)
    assert report["peak"]["allocated_bytes"] == max(peaks)
