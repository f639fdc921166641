"""What the peak is made of is decided in one place (tracking/peak.py): the recorded
allocations are the evidence when they hold the run's peak."""

from __future__ import annotations

from vramscope.report.model import Peak, Report
from vramscope.tracking.peak import _same_peak


def report_with_peak(allocated: int, step: int, phase: str | None) -> Report:
    report = Report(kind="measured")
    report.peak = Peak(allocated_bytes=allocated, step=step, phase=phase)
    return report


def test_the_trace_holds_the_peak_of_its_own_step_sized_within_one_percent() -> None:
    run = report_with_peak(1_000_000, 4, "backward")
    assert _same_peak({"allocated_bytes": 995_000, "step": 4, "phase": "backward"}, run)
    assert not _same_peak({"allocated_bytes": 980_000, "step": 4, "phase": "backward"}, run)


def test_a_traced_step_that_repeats_the_peak_holds_it() -> None:
    # the run's peak moves to the latest step that reaches it again: a traced step with
    # the same bytes, or the same phase within the allocator's sizing, is that peak
    run = report_with_peak(1_000_000, 40, "optimizer")
    assert _same_peak({"allocated_bytes": 1_000_000, "step": 2, "phase": "forward"}, run)
    assert _same_peak({"allocated_bytes": 999_500, "step": 41, "phase": "optimizer"}, run)
    # another step, another phase: an earlier highest point, not the run's peak
    assert not _same_peak({"allocated_bytes": 999_500, "step": 0, "phase": "backward"}, run)
    assert not _same_peak({"allocated_bytes": 900_000, "step": 41, "phase": "optimizer"}, run)
