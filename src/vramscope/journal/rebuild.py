"""Make the Report of a run from its journal, with the same analysis a live session's report
goes through: the step table folded as it folds, each step's row, the epochs and phases
summed from the steps, the categories at the peak settled from the same evidence, the same
findings. What only the end of a run gives (the reconciliation of the device's memory, the
module tree, the allocator's trace) is marked unavailable, with why.
"""

from __future__ import annotations

import datetime
from typing import Any

from vramscope import __version__
from vramscope.journal.ending import Ending, cuda_error, exit_info
from vramscope.journal.reader import Journal
from vramscope.report.aggregate import epochs_of, phases_of
from vramscope.report.findings import add_findings
from vramscope.report.model import OomInfo, Peak, Report, Startup, Timeline
from vramscope.tracking.peak import CPU_REASON, PeakEvidence, settle_categories
from vramscope.tracking.records import StepHistory, StepRecord, step_stats
from vramscope.tracking.sampler import SampleBuffer

TIMELINE_CAPACITY = 4096  # as the session's sampler keeps it
DIED = "the run's process died before its end readings: a report made from its journal has none"


def lost_seconds(journal: Journal, ending: Ending | None) -> float | None:
    """How long before the process's end the journal's last line was written (None when
    the end was not seen)."""
    start = journal.wall_start
    if ending is None or ending.at is None or start is None:
        return None
    return round(max(0.0, ending.at - (start + journal.last_t)), 3)


def report_from_journal(journal: Journal, ending: Ending | None = None) -> Report:
    """The report of the run ``journal`` records; ``ending``: how its process ended, when
    the caller saw it (``vramscope run``), else the journal says what it can."""
    header = journal.header
    if ending is None and journal.ended is not None:  # `vramscope run` saw it end
        ending = Ending.from_record(journal.ended)
    report = Report(
        kind="measured",
        vramscope_version=__version__,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        workload=dict(header["workload"]),
    )
    device = dict(header["device"])
    device.update(_dict(journal.state.get("device", {}).get("device")))
    report.device = device
    report.host = dict(header["host"])
    cuda = device.get("type") == "cuda"

    history = StepHistory()
    for record in journal.steps:
        history.append(record)
    records = list(history)
    samples = _samples(journal.samples)
    report.steps = [step_stats(r, 0.0, samples) for r in records]
    report.epochs = epochs_of(report.steps)
    report.phases = phases_of(report.steps)
    report.timeline = _timeline(header, samples, report)

    peak_record = journal.state.get("peak", {})
    peak = Peak(
        host_rss_bytes=max((s[4] for s in samples if s[4] is not None), default=None),
        device_used_bytes=max((s[3] for s in samples if s[3] is not None), default=None),
    )
    notes: list[str] = []
    if cuda:
        peak.allocated_bytes = _int(peak_record.get("allocated_bytes"))
        peak.reserved_bytes = _int(peak_record.get("reserved_bytes"))
        peak.step = _int(peak_record.get("step"))
        phase = peak_record.get("phase")
        peak.phase = phase if isinstance(phase, str) else None
        notes += _peak_from_samples(peak, samples, records)
    else:
        for key in ("peak.allocated_bytes", "peak.reserved_bytes", "peak.device_used_bytes"):
            report.unavailable[key] = CPU_REASON
    report.peak = peak
    startup = journal.state.get("startup", {})
    report.startup = Startup(
        after_build_allocated_bytes=_int(startup.get("after_build_allocated_bytes")),
        after_build_reserved_bytes=_int(startup.get("after_build_reserved_bytes")),
        host_rss_bytes=_int(startup.get("host_rss_bytes")),
    )
    report.unavailable["reconciliation"] = DIED if cuda else CPU_REASON

    lost = lost_seconds(journal, ending)
    report.exit = exit_info(ending, journal.script_exit, lost, journal.stopped)
    if journal.oom is not None:
        try:
            report.oom = OomInfo(**{k: v for k, v in journal.oom.items() if k in _OOM_KEYS})
        except TypeError:
            report.oom = None
    allocator = journal.state.get("allocator")
    if allocator:
        report.extra["allocator"] = {
            k: allocator.get(k) for k in ("num_ooms", "num_alloc_retries", "config")
        }
    settle_categories(report, _peak_evidence(journal, records, report), None)
    report.extra["journal"] = _journal_section(journal, lost)
    report.extra["tracking_notes"] = _notes(journal, lost) + notes
    return add_findings(report)


def _peak_from_samples(
    peak: Peak, samples: list[tuple[Any, ...]], records: list[StepRecord]
) -> list[str]:
    """The allocator's peaks are read where a phase ends: the phase open when the process
    died was never read, but the timeline sampled it. A sample above the peaks read is the
    run's peak (a lower bound of it), in the step it fell in, its phase unknown."""
    top = max((s for s in samples if s[1] is not None), key=lambda s: s[1], default=None)
    if top is None or top[1] <= (peak.allocated_bytes or 0):
        return []
    peak.allocated_bytes = top[1]
    peak.reserved_bytes = max(peak.reserved_bytes or 0, max(s[2] or 0 for s in samples))
    peak.phase = None
    peak.step = next(
        (r.index for r in records if r.start_s <= top[0] <= (r.end_s or r.start_s)),
        (records[-1].last_index or records[-1].index) + 1 if records else 0,
    )
    return [
        f"the run's peak is a timeline sample of step {peak.step}, whose phase had not ended "
        "when the process died (the allocator's peaks are read where a phase ends): the true "
        "peak may be higher"
    ]


def report_without_journal(script: str, ending: Ending, why: str) -> Report:
    """The report of a run whose process died before its journal held anything (while
    torch was imported, say): how it ended, and nothing measured."""
    report = Report(
        kind="measured",
        vramscope_version=__version__,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        workload={"spec": script, "script": script},
    )
    report.exit = exit_info(ending, None, None)
    for key in ("peak", "categories_at_peak", "steps", "reconciliation"):
        report.unavailable[key] = f"the process ended before its journal held anything: {why}"
    report.extra["journal"] = {"error": why}
    return add_findings(report)


_OOM_KEYS = set(OomInfo.__dataclass_fields__)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _samples(raw: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The timeline, bounded as the session's sampler bounds it (peaks kept)."""
    buffer = SampleBuffer(capacity=TIMELINE_CAPACITY)
    for sample in sorted(raw, key=lambda s: s[0]):
        buffer.add(sample)  # type: ignore[arg-type]
    return buffer.snapshot()


def _timeline(header: dict[str, Any], samples: list[tuple[Any, ...]], report: Report) -> Timeline:
    markers: list[dict[str, Any]] = []
    epoch = 0
    for step in report.steps:
        if step.epoch != epoch:
            epoch = step.epoch
            markers.append({"kind": "epoch", "index": epoch, "t": step.start_s})
        markers.append({"kind": "step", "index": step.index, "t": step.start_s})
    interval = header.get("interval_s")
    return Timeline(
        interval_s=float(interval) if isinstance(interval, (int, float)) else None,
        t=[round(s[0], 6) for s in samples],
        allocated_bytes=[s[1] for s in samples],
        reserved_bytes=[s[2] for s in samples],
        device_used_bytes=[s[3] for s in samples],
        host_rss_bytes=[s[4] for s in samples],
        markers=markers,
    )


def _peak_evidence(journal: Journal, records: list[StepRecord], report: Report) -> PeakEvidence:
    """What :func:`settle_categories` needs beyond the report's figures, from the journal."""
    objects = journal.state.get("objects", {})
    peak_step = report.peak.step
    record = next(
        (
            r
            for r in records
            if peak_step is not None
            and r.index <= peak_step <= (r.last_index if r.last_index is not None else r.index)
        ),
        None,
    )
    return PeakEvidence(
        parameters=_int(objects.get("parameters")) or 0,
        buffers=_int(objects.get("buffers")) or 0,
        gradients=_int(objects.get("gradients")) or 0,
        optimizer_state=_int(objects.get("optimizer_state")) or 0,
        full_gradients=_int(objects.get("full_gradients")) or 0,
        had_backward=any(r.backwards for r in records),
        peak_record=record,
    )


def _journal_section(journal: Journal, lost: float | None) -> dict[str, Any]:
    header = journal.header
    said = (journal.script_exit or {}).get("error")
    return {
        "path": journal.path,
        "pid": header.get("pid"),
        "command": header.get("command"),
        "started_at": header.get("started_at"),
        "ends_at_s": round(journal.last_t, 3),
        "lost_seconds": lost,
        "lines": journal.lines,
        "truncated_last_line": journal.truncated,
        "damaged_lines": len(journal.problems),
        "problems": journal.problems[:5],
        "compactions": header.get("compactions", 0),
        "script_ended": journal.script_exit is not None,
        "cuda_error": cuda_error(said if isinstance(said, str) else None),
    }


def _notes(journal: Journal, lost: float | None) -> list[str]:
    notes = [
        "made from the run's journal: steps, phases, peaks and the timeline as they were "
        "written while it ran; no end readings (reconciliation), module tree or traced "
        "categories" + (f"; its last {lost:.1f} s are not in it" if lost is not None else "")
    ]
    if journal.truncated:
        notes.append(
            "the journal's last line was cut off (the process ended while writing it) and is "
            "left out"
        )
    if journal.problems:
        notes.append(
            f"{len(journal.problems)} damaged line(s) of the journal were left out "
            f"({journal.problems[0]})"
        )
    return notes
