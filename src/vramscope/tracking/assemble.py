"""Turn a stopped Session's records into its Report, in one pass: the peak, steps, phases,
timeline and reconciliation; the recorded allocations' analysis (module tree, peak tensors,
lines, snapshot); what the peak is made of, settled once from the best evidence
(tracking/peak.py); then the findings, which read the report like every other output."""

from __future__ import annotations

import datetime
from typing import Any

import torch

from vramscope import __version__
from vramscope.report.aggregate import epochs_of, phases_of
from vramscope.report.model import (
    AllocatorSlack,
    Categories,
    ExitInfo,
    OomInfo,
    Peak,
    Reconciliation,
    Report,
    Startup,
    Timeline,
)
from vramscope.sources import host as host_source
from vramscope.sources import nvml
from vramscope.tracking.device_info import allocator_config as _allocator_config
from vramscope.tracking.device_info import device_info as _device_info
from vramscope.tracking.peak import CPU_REASON, PeakEvidence, settle_categories
from vramscope.tracking.records import step_stats

# ``session`` below is a stopped vramscope.tracking.session.Session (not imported: the
# session imports this module to make its report)
Session = Any


def make_report(session: Session) -> Report:
    """The Report of a stopped session: its records assembled, the recorded allocations
    analysed into it, the categories at the peak settled in one place before anything reads
    them, then the findings."""
    from vramscope.report.findings import add_findings

    report = assemble_report(session)
    analysis = attach_attribution(session, report) if session._attribution else None
    settle_categories(report, peak_evidence(session), analysis)
    return add_findings(report)


def peak_evidence(session: Session) -> PeakEvidence:
    """What the session knows of its peak beyond the report's figures (tracking/peak.py)."""
    ledger = session._ledger
    seen = ledger.seen
    return PeakEvidence(
        parameters=seen.parameters,
        buffers=seen.buffers,
        gradients=seen.gradients,
        optimizer_state=seen.optimizer_state,
        full_gradients=ledger.full_gradients,
        had_backward=any(s.backwards for s in session._steps),
        peak_record=session._peak_record,
    )


def attach_attribution(session: Session, report: Report) -> dict[str, Any] | None:
    """Analyse the recorded allocations: with markers, into ``report`` (the module tree, peak
    tensors, lines; the snapshot when one was asked for); returns the analysis, from which
    the categories at the peak are settled (None when nothing could be analysed)."""
    from vramscope.report.modules import analyze, apply_to_report

    recorder = session._attribution
    options = session._attribution_options
    try:
        log = recorder.event_log()
        analysis = analyze(log, depth=options["depth"], labels=bool(options.get("snapshot")))
        if recorder.markers:
            apply_to_report(report, analysis, session.detail)
        if options.get("snapshot"):
            path = _write_snapshot(recorder, log, analysis["block_labels"], options["snapshot"])
            report.extra["snapshot"] = str(path)
        return analysis
    except Exception as exc:  # attribution must never cost the user the report
        report.extra.setdefault("attribution_notes", []).append(
            f"attribution failed: {type(exc).__name__}: {exc}"
        )
        return None


def _write_snapshot(recorder: Any, log: Any, labels: dict[int, Any], path: str) -> Any:
    """The memory_viz snapshot: the allocator's own on CUDA, the recorded storages on the CPU."""
    from vramscope.tracking import snapshot as snapshot_writer

    raw = recorder.raw_snapshot()
    if raw is not None:
        data = snapshot_writer.annotate_cuda_snapshot(raw, recorder.device_index or 0, labels)
    else:
        data = snapshot_writer.cpu_snapshot(log, labels)
    return snapshot_writer.write_snapshot(path, data)


def assemble_report(session: Session) -> Report:
    """The run's own figures (no analysis of recorded allocations, no categories yet)."""
    samples = session._sampler.samples() if session._sampler else []
    report = Report(
        kind="measured",
        vramscope_version=__version__,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        workload=dict(session.workload_info),
    )
    report.device = _device_info(session)
    report.host = _host_info()
    report.steps = [step_stats(s, session._t0, samples) for s in session._steps]
    report.epochs = epochs_of(report.steps)
    report.phases = phases_of(report.steps)
    report.timeline = _timeline(session, samples)
    report.exit = ExitInfo(**session._exit)
    cuda = session._device_index is not None
    final = session._final
    reading = final.get("reading")
    objects = final.get("objects")

    # ---- peak --------------------------------------------------------------------------
    peak = Peak()
    host_values = [s[4] for s in samples if s[4] is not None]
    peak.host_rss_bytes = max(host_values) if host_values else None
    if cuda and session._peak_allocated >= 0:
        peak.allocated_bytes = session._peak_allocated
        peak.reserved_bytes = max(session._peak_reserved, reading.reserved_bytes if reading else 0)
        peak.step, peak.phase = session._peak_where
    elif not cuda:
        for key in ("peak.allocated_bytes", "peak.reserved_bytes", "peak.device_used_bytes"):
            report.unavailable[key] = CPU_REASON
    report.peak = peak

    # ---- startup ------------------------------------------------------------------------
    first = session._first_reading
    report.startup = Startup(
        after_build_allocated_bytes=first.allocated_bytes if first else None,
        after_build_reserved_bytes=first.reserved_bytes if first else None,
        host_rss_bytes=session._first_reading_rss,
    )

    # ---- reconciliation and device used -------------------------------------------------------
    if cuda and reading is not None:
        end = _reconcile_end(session, reading, objects, final.get("nvml"))
        pools = final.get("private_pools") or _pools_from_attribution(session)
        if pools is not None:
            end.private_pools_bytes = pools["reserved_bytes"]
            end.private_pools_allocated_bytes = pools["allocated_bytes"]
        report.reconciliation.append(end)
        context = end.context_and_libraries_bytes
        report.startup.context_and_libraries_bytes = context
        used_samples = [s[3] for s in samples if s[3] is not None]
        if context is not None and peak.reserved_bytes is not None:
            peak.device_used_bytes = max(
                peak.reserved_bytes + context, max(used_samples, default=0)
            )
        elif used_samples:
            peak.device_used_bytes = max(used_samples)
        else:
            report.unavailable["peak.device_used_bytes"] = end.note or "NVML is not available"
        if peak.allocated_bytes is not None:  # its tensors: settled with the categories
            report.reconciliation.insert(0, _reconcile_peak(session, report, end))
    else:
        report.unavailable["reconciliation"] = CPU_REASON

    if session._oom is not None:
        report.oom = OomInfo(**session._oom)
    notes = _tracking_notes(session)
    if notes:
        report.extra["tracking_notes"] = notes
    if session._phase_reads is not None and session._device_index is not None:
        report.extra["phase_reads"] = session._phase_reads.summary()
    report.extra["sampler"] = {
        "interval_s": session._interval_s,
        # chosen by the steps' length (set by nobody): when it changed, to what
        "auto": session._interval_auto,
        "paces": [list(pace) for pace in session._sampler_paces],
        "effective_interval_s": session._sampler.effective_interval_s if session._sampler else None,
        "error": session._sampler.error if session._sampler else None,
    }
    if first is not None and reading is not None:
        report.extra["allocator"] = {
            "num_alloc_retries": reading.num_alloc_retries - first.num_alloc_retries,
            "num_ooms": reading.num_ooms - first.num_ooms,
            "segments": reading.segments,
            "config": _allocator_config(),
        }
    return report


def _pools_from_attribution(session: Session) -> dict[str, int] | None:
    from vramscope.sources.allocator import private_pools

    recorder = session._attribution
    raw = recorder.raw_snapshot() if recorder is not None else None
    if raw is None or session._device_index is None:
        return None
    return private_pools(raw.get("segments", []), session._device_index)


def _tracking_notes(session: Session) -> list[str]:
    from vramscope.tracking.phase_reads import EVERY_STEP_SHARE, FIRST_STEPS

    notes = list(session._notes)
    if session._unseen_forwards:
        notes.append(
            f"{session._unseen_forwards} forward pass(es) ran where no model call was visible "
            "(a compiled training step, or a model compiled with model.compile() before "
            "tracking started): what ran before each backward is counted as forward; "
            "session.watch(model) or tracking before compiling shows the forward itself"
        )
    if session._dropped_markers:
        notes.append(
            f"the timeline keeps its first {len(session._markers)} step and epoch markers; "
            f"{session._dropped_markers} later ones were dropped"
        )
    schedule = session._phase_reads
    unread = schedule.unread_steps if schedule is not None else 0
    if unread and session._device_index is not None:
        why = (
            f"vramscope's reads would have cost more than {EVERY_STEP_SHARE:.1%} of each step"
            if schedule.policy == "auto"
            else f"--phase-steps {schedule.policy}"
        )
        notes.append(
            f"after the first {FIRST_STEPS} steps, phases were read on 1 step in "
            f"{schedule.interval} ({why}); "
            + (
                f"the {unread:,} steps between read nothing and are folded"
                if unread != 1
                else "the 1 step between reads nothing and is folded"
            )
            + " into the read step before them, whose peak includes theirs exactly "
            "(count, last_index; --phase-steps all reads every step)"
        )
    if session._span_peak is not None:
        first, last = session._span_peak
        where = f"step {first}" if first == last else f"steps {first}-{last}"
        notes.append(
            f"the run's peak was reached in {where}, which read nothing phase by phase: its "
            "bytes are exact, its phase is not known; the steps after it were read phase "
            "by phase again"
        )
    if session._steps.total > len(session._steps) + unread:
        notes.append(
            f"a long run: its {session._steps.total} steps are kept as {len(session._steps)} "
            "entries, later neighbours merged in pairs with their highest peaks (count, "
            "last_index)"
        )
    return notes


def _host_info() -> dict[str, Any]:
    mem = host_source.host_memory()
    return {"total_bytes": mem.total_bytes, "available_bytes": mem.available_bytes}


def _timeline(session: Session, samples: list[tuple]) -> Timeline:
    sampler = session._sampler
    return Timeline(
        interval_s=sampler.effective_interval_s if sampler else None,
        t=[round(s[0], 6) for s in samples],
        allocated_bytes=[s[1] for s in samples],
        reserved_bytes=[s[2] for s in samples],
        device_used_bytes=[s[3] for s in samples],
        host_rss_bytes=[s[4] for s in samples],
        phases=[
            {"name": name, "step": step, "start_s": start, "end_s": end}
            for name, step, start, end in session._phase_bands
        ],
        markers=list(session._markers),
        dropped_phase_bands=session._dropped_bands,
    )


def _reconcile_end(
    session: Session, reading: Any, objects: Any, nvml_final: dict[str, Any] | None
) -> Reconciliation:
    import os

    tensors = Categories(
        parameters=objects.parameters,
        buffers=objects.buffers,
        gradients=objects.gradients,
        optimizer_state=objects.optimizer_state,
        activations=0,
        temporaries=0,
        other=max(0, reading.allocated_bytes - objects.total),
    )
    rec = Reconciliation(
        moment="end",
        tensors=tensors,
        requested_bytes=reading.requested_bytes,
        allocated_bytes=reading.allocated_bytes,
        slack=AllocatorSlack(
            cached_free_bytes=reading.reserved_bytes
            - reading.allocated_bytes
            - reading.inactive_split_bytes,
            fragmentation_bytes=reading.inactive_split_bytes,
            rounding_bytes=reading.rounding_bytes,
        ),
        reserved_bytes=reading.reserved_bytes,
    )
    if not nvml_final:
        rec.note = nvml.unavailable_reason() or "NVML could not read this device"
        free, total = torch.cuda.mem_get_info(session._device_index)
        rec.free_bytes, rec.total_bytes = int(free), int(total)
        return rec
    memory = nvml_final["memory"]
    own = nvml_final.get("own_used")
    pid = os.getpid()
    others = sum(
        p.used_bytes or 0 for p in nvml_final["processes"] if p.pid != pid and p.used_bytes
    )
    if own is not None and len(nvml_final["processes"]) == 1:
        others = 0
    rec.total_bytes = memory.total_bytes
    rec.free_bytes = memory.free_bytes
    if own is None:
        rec.note = "NVML lists no memory for this process (container PID namespace or MIG)"
        return rec
    rec.device_used_bytes = own
    rec.context_and_libraries_bytes = own - reading.reserved_bytes
    rec.other_processes_bytes = others
    rec.driver_reserved_bytes = memory.reserved_bytes
    rec.unaccounted_bytes = (
        memory.total_bytes - memory.free_bytes - own - others - memory.reserved_bytes
    )
    return rec


def _reconcile_peak(session: Session, report: Report, end: Reconciliation) -> Reconciliation:
    close = session._peak_close
    peak = report.peak
    slack_total = (peak.reserved_bytes or 0) - (peak.allocated_bytes or 0)
    fragmentation = min(close.inactive_split_bytes, slack_total) if close else None
    rounding = None
    if close is not None:
        rounding = max(0, close.allocated_bytes - close.requested_bytes)
    rec = Reconciliation(
        moment="peak",
        requested_bytes=(peak.allocated_bytes - rounding) if rounding is not None else None,
        allocated_bytes=peak.allocated_bytes,
        slack=AllocatorSlack(
            cached_free_bytes=slack_total - (fragmentation or 0),
            fragmentation_bytes=fragmentation,
            rounding_bytes=rounding,
        ),
        reserved_bytes=peak.reserved_bytes,
        private_pools_bytes=end.private_pools_bytes,
        private_pools_allocated_bytes=end.private_pools_allocated_bytes,
        context_and_libraries_bytes=end.context_and_libraries_bytes,
        device_used_bytes=peak.device_used_bytes,
        other_processes_bytes=end.other_processes_bytes,
        driver_reserved_bytes=end.driver_reserved_bytes,
        unaccounted_bytes=end.unaccounted_bytes,
        total_bytes=end.total_bytes,
        note=(
            "at the peak: allocated and reserved are the allocator's peaks; the split of the "
            "slack is read where the peak phase ended; context and other processes as at the end"
        ),
    )
    if rec.total_bytes is not None and rec.device_used_bytes is not None:
        rec.free_bytes = (
            rec.total_bytes
            - rec.device_used_bytes
            - (rec.other_processes_bytes or 0)
            - (rec.driver_reserved_bytes or 0)
            - (rec.unaccounted_bytes or 0)
        )
    return rec
