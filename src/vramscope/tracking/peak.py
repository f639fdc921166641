"""What the peak is made of: the categories at the run's peak, decided in one place from the
best evidence the run has, and written where every table and output reads them.

The evidence, best first:

1. **The recorded allocations** (:mod:`vramscope.report.modules`' analysis of the event
   log) when they hold the run's peak: every block alive at that instant, parameters,
   buffers, gradients and optimizer state by the storages the objects held (identity),
   activations, temporaries and other by lifetime. On CUDA that is the allocator's trace
   (``--detail modules``/``lines``, and with the default detail the first steps and the step
   after each new peak, which repeats it); on the CPU the dispatch mode's storages.
2. **Phase boundaries** (CUDA, when no trace holds the peak): the objects' bytes split by
   the phase and step the peak was in, activations read where the backward began, the rest
   temporaries. The note says so.
3. **The objects alone** (the CPU with the default detail: no allocator to read).

The module tree is made from the same recorded blocks at the same instant, so its columns
add up to these categories; the reconciliation at the peak, the findings, the terminal, HTML
and JSON read them from the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vramscope.report.model import Categories, Report

if TYPE_CHECKING:
    from vramscope.tracking.records import StepRecord

CPU_REASON = "no CUDA device in use: the CPU has no caching allocator to read"


@dataclass(frozen=True)
class PeakEvidence:
    """What a run knows of its peak beyond its recorded allocations and its report's own
    figures (the peak, the steps, the startup reading): the objects' bytes, the highest seen,
    and the step record that holds the peak. A live session gives one
    (:func:`vramscope.tracking.assemble.peak_evidence`), and so does a run's journal."""

    parameters: int = 0
    buffers: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    full_gradients: int = 0  # every trainable parameter's gradient, as if all existed
    had_backward: bool = False  # a step of the run ran a backward
    peak_record: StepRecord | None = None


def settle_categories(
    report: Report, evidence: PeakEvidence, analysis: dict[str, Any] | None
) -> None:
    """Set ``report.categories_at_peak`` (and the peak's reconciliation) from the best
    evidence; ``analysis``: the recorded allocations' analysis, or None. The one place the
    categories are decided: every table and output reads them from the report."""
    cuda = report.device.get("type") == "cuda"
    run_peak = report.peak.allocated_bytes
    notes: list[str] = []
    source = "objects"
    cats: Categories | None = None
    if analysis is not None:
        traced = analysis["peak"]["allocated_bytes"]
        if analysis["source"] == "cpu-dispatch" and analysis.get("census_missed"):
            # the CPU's operators are seen on the thread tracking started in: a model trained
            # on another thread made its gradients and state where none was recorded
            notes.append(
                "the model's tensors were made where the CPU's operators were not recorded "
                "(a thread other than the one tracking started in): the categories are the "
                "objects' (parameters, buffers, gradients and optimizer state), the rest not "
                "split into activations and temporaries"
            )
        elif analysis["source"] == "cpu-dispatch":
            cats, source = Categories(**analysis["categories"]), "cpu-dispatch"
            report.categories_note = (
                "tensor bytes at the highest point of the run, from every storage the CPU "
                "operators made (exact per storage); parameters, buffers, gradients and "
                "optimizer state by the storages the objects held, the rest by lifetime"
            )
        elif run_peak and traced and _same_peak(analysis["peak"], report):
            cats, source = Categories(**analysis["categories"]), "allocator-trace"
            report.categories_note = (
                f"exact at the peak, from the allocator's trace of step "
                f"{analysis['peak']['step']}: parameters, buffers, gradients and optimizer "
                "state by the storages the objects held; activations (made in a forward, "
                "alive when its backward began), temporaries and other by lifetime"
            )
        elif run_peak and traced:
            from vramscope.report.modules import unmarked_peak_note

            said = (  # the module tables (markers) describe the trace's highest point
                unmarked_peak_note(report, analysis) + "; " if "attribution" in report.extra else ""
            )
            notes.append(
                said + "the allocator's trace did not record the step of the run's peak "
                f"(step {report.peak.step}), so the categories are split at phase boundaries"
            )
    if cats is None and cuda and run_peak is not None:
        cats, source = _split_at_phase_boundaries(report, evidence), "phase-boundaries"
    if cats is None:
        cats = _objects_only(report, evidence)
        if analysis is not None and analysis.get("census_missed") and not cuda:
            report.categories_note = (
                "on the CPU, parameters, buffers, gradients and optimizer state are exact from "
                "the objects; the model ran on a thread other than the one tracking started "
                "in, whose operators were not recorded: activations and temporaries unknown"
            )
    report.categories_at_peak = cats
    report.extra["categories_source"] = source
    if source in ("allocator-trace", "cpu-dispatch"):
        report.unavailable.pop("categories_at_peak.activations", None)
    for rec in report.reconciliation:
        if rec.moment == "peak":
            rec.tensors = cats
    if notes:
        report.extra.setdefault("attribution_notes", []).extend(notes)


def _same_peak(traced: dict[str, Any], report: Report) -> bool:
    """Whether the trace's highest point is the run's peak: the same step (the trace sizes
    blocks as the allocator does, within 1 %), or a step that repeats it (the same phase and
    bytes: the run's peak moves to the latest step that reaches it again)."""
    run_peak = report.peak.allocated_bytes or 0
    gap = abs(traced["allocated_bytes"] - run_peak)
    if traced["step"] == report.peak.step:
        return gap <= 0.01 * run_peak
    return gap == 0 or (traced["phase"] == report.peak.phase and gap <= 0.001 * run_peak)


def _objects_only(report: Report, evidence: PeakEvidence) -> Categories:
    """The CPU with the default detail: what the objects held (the highest seen)."""
    cats = Categories(
        parameters=evidence.parameters,
        buffers=evidence.buffers,
        gradients=max(evidence.gradients, evidence.full_gradients)
        if evidence.had_backward
        else evidence.gradients,
        optimizer_state=evidence.optimizer_state,
    )
    report.categories_note = (
        "on the CPU, parameters, buffers, gradients and optimizer state are exact from the "
        "objects; activations and temporaries need a CUDA device (allocator counters) or "
        "--detail modules"
    )
    report.unavailable["categories_at_peak.activations"] = CPU_REASON
    return cats


def _split_at_phase_boundaries(report: Report, evidence: PeakEvidence) -> Categories:
    """No trace holds the peak: the objects' bytes split by the peak's phase and step, the
    activations from the allocator's reading where the backward began, the rest temporaries.
    Inside a backward, which gradients existed at the peak is not known: all are counted."""
    full_gradients = evidence.full_gradients
    step_index, phase_name = report.peak.step, report.peak.phase
    record = evidence.peak_record
    peak = report.peak.allocated_bytes or 0
    params, buffers = evidence.parameters, evidence.buffers
    opt_full = evidence.optimizer_state
    first_optimizer_step = min(
        (s.index for s in report.steps for p in s.phases if p.name == "optimizer"), default=None
    )
    opt_state = opt_full
    if (
        first_optimizer_step is None
        or step_index is None
        or step_index < first_optimizer_step
        or (step_index == first_optimizer_step and phase_name != "optimizer")
    ):
        opt_state = 0
    grads_live = bool(record and record.grads_live_at_start)
    if phase_name in ("backward", "optimizer"):
        grads = full_gradients
    elif phase_name == "forward":
        grads = full_gradients if grads_live or (record and record.backwards > 1) else 0
    else:
        grads = evidence.gradients if grads_live else 0
    baseline = report.startup.after_build_allocated_bytes or 0
    other = max(0, baseline - params - buffers)
    activations = 0
    if record is not None:
        backward = record.phases.get("backward")
        if backward is not None and backward.start_allocated_bytes is not None:
            held = params + buffers + other + (grads if grads_live else 0)
            held += opt_state if phase_name != "optimizer" else opt_full
            activations = max(0, backward.start_allocated_bytes - held)
    if phase_name in ("optimizer", "zero_grad", "data", "other"):
        activations = 0
    fixed = params + buffers + grads + opt_state + other
    if fixed + activations > peak:
        activations = max(0, peak - fixed)
    temporaries = max(0, peak - fixed - activations)
    where = (
        f"the {phase_name} phase of step {step_index}"
        if phase_name
        else (f"step {step_index}, which read no phase" if step_index is not None else "no step")
    )
    report.categories_note = (
        "parameters, buffers, gradients and optimizer state are the objects' bytes, split by "
        "the phase the peak was in; activations (saved for backward, read where backward "
        "began) and temporaries (the rest) come from allocator counters at phase "
        f"boundaries; the peak is in {where}, a step the allocator's trace did not record"
        + (
            " (inside a backward, every gradient is counted as existing)"
            if phase_name == "backward"
            else ""
        )
    )
    return Categories(
        parameters=params,
        buffers=buffers,
        gradients=grads,
        optimizer_state=opt_state,
        activations=activations,
        temporaries=temporaries,
        other=other,
    )
