"""Findings in plain words, computed from a Report alone (pure functions, no torch).

Each ``find_*`` takes a Report and returns a list of Findings; ``add_findings`` runs them
all. They work the same on a fresh report and on one loaded from JSON.
"""

from __future__ import annotations

import itertools
import statistics

from vramscope.report.model import Finding, Report, StepStats
from vramscope.report.words import change, plural, times
from vramscope.units import format_bytes

MIB = 1024**2


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / var


def _last(step: StepStats) -> int:
    """The last step an entry stands for (its end is that step's end)."""
    return step.last_index if step.last_index is not None else step.index


def find_leak(report: Report) -> list[Finding]:
    """Allocated at step boundaries growing steadily over the steady-state steps."""
    steps = [s for s in report.steps if s.end_allocated_bytes is not None and s.mode == "train"]
    if len(steps) < 5:
        steps = [s for s in report.steps if s.end_allocated_bytes is not None]
    steady = steps[2:] if len(steps) >= 6 else steps[1:]
    if len(steady) < 4:
        return []
    ends = [s.end_allocated_bytes for s in steady]
    growth = _slope([float(_last(s)) for s in steady], [float(v) for v in ends])
    rising = sum(1 for a, b in itertools.pairwise(ends) if b > a)
    peak = report.peak.allocated_bytes or max(ends)
    threshold = max(256 * 1024, 0.001 * peak)
    if growth < threshold or rising < 0.6 * (len(ends) - 1):
        return []
    phase_growth: dict[str, list[int]] = {}
    for step in steady:
        for p in step.phases:
            if p.start_allocated_bytes is not None and p.end_allocated_bytes is not None:
                phase_growth.setdefault(p.name, []).append(
                    p.end_allocated_bytes - p.start_allocated_bytes
                )
    where = None
    if phase_growth:
        name, deltas = max(phase_growth.items(), key=lambda kv: statistics.fmean(kv[1]))
        if statistics.fmean(deltas) > 0:
            where = name
    total = ends[-1] - ends[0]
    message = (
        f"memory grows by {format_bytes(growth)} per step "
        f"({format_bytes(total)} over steps {_last(steady[0])}–{_last(steady[-1])})"
    )
    if where:
        message += f", in the {where} phase"
    message += (
        ": something keeps tensors alive across steps (a loss kept with its graph, "
        "e.g. total += loss instead of loss.item(); outputs appended to a list)"
    )
    return [
        Finding(
            "leak",
            "warning",
            message,
            {"growth_per_step_bytes": int(growth), "phase": where, "total_bytes": int(total)},
        )
    ]


def find_cache(report: Report) -> list[Finding]:
    """How much empty_cache() would release at the end, and that the peak would not drop."""
    end = next((r for r in report.reconciliation if r.moment == "end"), None)
    if end is None or end.slack.cached_free_bytes is None:
        return []
    cached = end.slack.cached_free_bytes
    if cached < 64 * MIB:
        return []
    return [
        Finding(
            "empty_cache",
            "info",
            f"torch.cuda.empty_cache() would give {format_bytes(cached)} of cached free memory "
            "back to the driver (other processes could use it); it would not lower this run's "
            "peak, which the next step needs again",
            {"releasable_bytes": cached},
        )
    ]


def find_fragmentation(report: Report) -> list[Finding]:
    """Fragmentation and cudaMalloc retries, and what to set."""
    findings: list[Finding] = []
    allocator = report.extra.get("allocator") or {}
    config = allocator.get("config") or ""
    expandable = "expandable_segments:true" in config.replace(" ", "").lower()
    retries = int(allocator.get("num_alloc_retries") or 0)
    peak_rec = next((r for r in report.reconciliation if r.moment == "peak"), None)
    frag = peak_rec.slack.fragmentation_bytes if peak_rec else None
    reserved = report.peak.reserved_bytes
    advice = (
        ""
        if expandable
        else "; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to let "
        "segments grow instead of splitting"
    )
    if retries:
        findings.append(
            Finding(
                "retries",
                "warning",
                f"the allocator ran out of cached memory {times(retries)} and had to free its "
                f"cache and retry cudaMalloc, which stalls the step{advice}",
                {"num_alloc_retries": retries},
            )
        )
    if frag and reserved and frag > 0.1 * reserved and frag > 64 * MIB:
        findings.append(
            Finding(
                "fragmentation",
                "warning",
                f"{format_bytes(frag)} ({100 * frag / reserved:.0f}% of reserved) is free but "
                f"stuck in partly used segments (fragmentation){advice}",
                {"fragmentation_bytes": frag, "reserved_bytes": reserved},
            )
        )
    ooms = int(allocator.get("num_ooms") or 0)
    if ooms and report.oom is None:
        findings.append(
            Finding(
                "caught_oom",
                "warning",
                f"{plural(ooms, 'out-of-memory error')} "
                f"{'was' if ooms == 1 else 'were'} raised and caught by the program",
                {"num_ooms": ooms},
            )
        )
    return findings


def find_first_step(report: Report) -> list[Finding]:
    """The first step against the steady state (optimizer state, autotuning, lazy init)."""
    steps = [s for s in report.steps if s.peak_allocated_bytes is not None]
    if len(steps) < 3:
        return []
    first = steps[0].peak_allocated_bytes
    steady = statistics.median(s.peak_allocated_bytes for s in steps[1:])
    if steady == 0 or abs(first - steady) <= 0.05 * steady:
        return []
    if first > steady:
        why = "lazy initialisation or autotuning workspaces in the first step"
    else:
        why = "the optimizer creates its state in the first optimizer step, so later steps carry it"
    return [
        Finding(
            "first_step",
            "info",
            f"the first step peaks at {format_bytes(first)}, {change(first, steady)} the "
            f"steady steps' {format_bytes(steady)}: {why}",
            {"first_bytes": first, "steady_bytes": int(steady)},
        )
    ]


def find_host_growth(report: Report) -> list[Finding]:
    steps = [s for s in report.steps if s.host_rss_bytes is not None]
    if len(steps) < 8:
        return []
    tail = steps[len(steps) // 4 :]
    growth = _slope([float(s.index) for s in tail], [float(s.host_rss_bytes) for s in tail])
    if growth < 4 * MIB:
        return []
    # growth goes on: each third of the tail above the one before by a good part of what
    # the slope says. One jump and a plateau (DataLoader workers counted from their first
    # reading on, a cache filled once) fits a slope too, and is not growth
    third = len(tail) // 3
    levels = [
        statistics.median(float(s.host_rss_bytes) for s in tail[i * third : (i + 1) * third])  # type: ignore[arg-type]
        for i in range(3)
    ]
    span = growth * third / 4
    if not all(b - a >= span for a, b in itertools.pairwise(levels)):
        return []
    return [
        Finding(
            "host_growth",
            "warning",
            f"host memory (RSS of the process and its workers) grows by {format_bytes(growth)} "
            "per step",
            {"growth_per_step_bytes": int(growth)},
        )
    ]


def find_oom(report: Report) -> list[Finding]:
    oom = report.oom
    if oom is None:
        return []
    where = f"in the {oom.phase} phase" if oom.phase else "before the first step"
    if oom.step is not None:
        where += f" of step {oom.step}"
    if oom.module:
        where += f", inside {oom.module}"
    parts = [f"out of memory {where}"]
    if oom.requested_bytes is not None:
        parts.append(f"while allocating {format_bytes(oom.requested_bytes)}")
    if oom.free_bytes is not None:
        parts.append(f"with {format_bytes(oom.free_bytes)} free on the device")
    if oom.fragmentation_bytes:
        parts.append(f"and {format_bytes(oom.fragmentation_bytes)} stuck in fragments")
    return [Finding("oom", "error", " ".join(parts), {})]


def find_private_pools(report: Report) -> list[Finding]:
    """Reserved memory held by CUDA graphs' private pools (torch.compile reduce-overhead)."""
    end = next((r for r in report.reconciliation if r.moment == "end"), None)
    if end is None or not end.private_pools_bytes:
        return []
    share = end.private_pools_bytes / end.reserved_bytes if end.reserved_bytes else 0.0
    return [
        Finding(
            kind="private_pools",
            severity="info",
            message=(
                f"{format_bytes(end.private_pools_bytes)} of reserved memory ({share:.0%}) is "
                "in private pools (CUDA graphs: torch.compile's mode='reduce-overhead', "
                "torch.cuda.graph, or torch.cuda.MemPool); graph replays reuse it, the shared "
                f"cache never gets it back; {format_bytes(end.private_pools_allocated_bytes or 0)} "
                "of it holds live tensors (a graph's static inputs and outputs)"
            ),
            data={
                "private_pools_bytes": end.private_pools_bytes,
                "private_pools_allocated_bytes": end.private_pools_allocated_bytes,
            },
        )
    ]


def find_ending(report: Report) -> list[Finding]:
    """A report made from the run's journal: what it holds, what it misses, and for the OOM
    killer how much host memory the process tree held."""
    ended = report.exit
    if ended.source != "journal":
        return []
    lost = ended.lost_seconds
    message = (
        "this report is made from the run's journal, written as the run went: every step "
        "stored before the end is here"
        + (f", the last {lost:.1f} s are not" if lost is not None else "")
        + "; the reconciliation and module tree need the run's own end"
    )
    data: dict[str, object] = {"status": ended.status, "lost_seconds": lost}
    rss, total = report.peak.host_rss_bytes, report.host.get("total_bytes")
    if ended.killed_by == "oom-killer" and rss:
        share = f" ({rss / total:.0%} of the machine's {format_bytes(total)})" if total else ""
        message = (
            f"the kernel's OOM killer ended the run: its process tree held up to "
            f"{format_bytes(rss)} of host memory{share} (DataLoader workers count); " + message
        )
        data["host_rss_bytes"] = rss
    severity = "info" if ended.status == "ok" else "error"
    return [Finding("journal", severity, message, data)]


FINDERS = (
    find_ending,
    find_oom,
    find_leak,
    find_fragmentation,
    find_cache,
    find_first_step,
    find_host_growth,
    find_private_pools,
)


def add_findings(report: Report) -> Report:
    findings = [f for finder in FINDERS for f in finder(report)]
    if any(f.kind == "leak" for f in findings):  # memory that grows has no steady state
        findings = [f for f in findings if f.kind != "first_step"]
    report.findings = findings
    return report


def reword(report: Report) -> Report:
    """A saved report's findings in today's words: those the finders above write are made
    again from its numbers, where the first of them stood; the others (a verdict, a fit's
    answer, the estimator's notes) stay as saved."""
    fresh = [f for finder in FINDERS for f in finder(report)]
    kinds = {f.kind for f in fresh} | _FINDER_KINDS
    kept: list[Finding] = []
    at = None
    for f in report.findings:
        if f.kind in kinds:
            at = len(kept) if at is None else at
            continue
        kept.append(f)
    at = len(kept) if at is None else at
    report.findings = kept[:at] + fresh + kept[at:]
    return report


# every kind a finder above can write (a saved one is replaced, or dropped when it no longer
# holds)
_FINDER_KINDS = frozenset(
    {
        "oom",
        "leak",
        "retries",
        "fragmentation",
        "caught_oom",
        "empty_cache",
        "first_step",
        "host_growth",
        "private_pools",
        "journal",
    }
)
