"""What the peak is made of is decided in one place (tracking/peak.py): the recorded
allocations are the evidence when they hold the run's peak."""

from __future__ import annotations

from dataclasses import asdict

from vramscope.report.model import Peak, PhaseStats, Report, Startup
from vramscope.report.modules import apply_to_report
from vramscope.tracking.peak import PeakEvidence, _same_peak, settle_categories
from vramscope.tracking.records import StepRecord

MIB = 1 << 20


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


def traced(allocated: int, step: int, phase: str, categories: dict[str, int]) -> dict:
    """The analysis of a recording whose highest point is ``allocated`` in ``step``."""
    return {
        "source": "cuda-trace",
        "peak": {"allocated_bytes": allocated, "step": step, "phase": phase},
        "module_peak": None,
        "module_steps": None,
        "categories": categories,
        "modules": [],
        "peak_tensors": [],
        "lines": [],
        "notes": [],
        "stats": {},
    }


def cuda_report(allocated: int, step: int, phase: str) -> Report:
    report = report_with_peak(allocated, step, phase)
    report.device = {"type": "cuda"}
    report.startup = Startup(after_build_allocated_bytes=10 * MIB)
    return report


TRACE_CATEGORIES = dict(
    parameters=10 * MIB, buffers=0, gradients=10 * MIB, optimizer_state=20 * MIB,
    activations=50 * MIB, temporaries=10 * MIB, other=0,
)  # fmt: skip


def test_a_trace_that_holds_the_peak_gives_the_categories_every_table_reads() -> None:
    report = cuda_report(100 * MIB, 2, "forward")
    analysis = traced(100 * MIB, 2, "forward", TRACE_CATEGORIES)
    apply_to_report(report, analysis, "modules")
    settle_categories(report, PeakEvidence(parameters=10 * MIB), analysis)
    assert report.extra["categories_source"] == "allocator-trace"
    assert asdict(report.categories_at_peak) == TRACE_CATEGORIES
    assert report.extra["attribution"]["categories"] == TRACE_CATEGORIES


def test_a_trace_without_the_peak_leaves_one_truth_split_at_phase_boundaries() -> None:
    # the run's peak (step 9, backward) is in a step the trace did not record: the categories
    # are the objects' bytes split by its phase, and the attribution section says the same
    # numbers; what the trace's highest point held is its module peak's
    report = cuda_report(160 * MIB, 9, "backward")
    record = StepRecord(index=9, epoch=0, start_s=0.0, start_allocated=None, backwards=1)
    record.phases["backward"] = PhaseStats(name="backward", start_allocated_bytes=90 * MIB)
    report.steps = []
    evidence = PeakEvidence(
        parameters=10 * MIB, gradients=10 * MIB, optimizer_state=20 * MIB,
        full_gradients=10 * MIB, had_backward=True, peak_record=record,
    )  # fmt: skip
    analysis = traced(100 * MIB, 2, "forward", TRACE_CATEGORIES)
    apply_to_report(report, analysis, "modules")
    settle_categories(report, evidence, analysis)
    cats = report.categories_at_peak
    assert report.extra["categories_source"] == "phase-boundaries"
    assert cats.total() == 160 * MIB
    assert (cats.parameters, cats.gradients, cats.other) == (10 * MIB, 10 * MIB, 0)
    attribution = report.extra["attribution"]
    assert attribution["categories"] == asdict(cats)
    assert attribution["module_peak"]["categories"] == TRACE_CATEGORIES
    assert attribution["peak_bytes"] == 160 * MIB and attribution["peak_step"] == 9
