"""Join the ranks' reports into the job's report (pure functions over Reports, no torch).

The job's report is the heaviest rank's own report (by peak allocated; by host RSS when
no rank used CUDA) with ``ranks``, a row per rank; its ``exit`` is the job's: the first
rank that failed. The ``distributed`` section names the heaviest rank, the imbalance
and how the reports were gathered.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vramscope.report.model import (
    Categories,
    ExitInfo,
    Finding,
    Peak,
    RankEntry,
    RankExit,
    Report,
    _build,
)
from vramscope.units import format_bytes

FAILED_ON_ITS_OWN = ("error", "oom", "interrupted")  # a rank's own failure, not a stop
IMBALANCE_WORTH_SAYING = 1.10  # the heaviest rank at least 10% above the lightest
IMBALANCE_WARNING = 1.25


def row_of(report: Report) -> RankEntry:
    """A rank's row from its own report (its ``distributed`` section says which rank)."""
    last = report.steps[-1] if report.steps else None
    return row_from_data(
        {
            "distributed": report.extra.get("distributed"),
            "device": report.device,
            "peak": dataclasses.asdict(report.peak),
            "categories_at_peak": dataclasses.asdict(report.categories_at_peak),
            "exit": dataclasses.asdict(report.exit),
            "steps": [{"count": s.count} for s in report.steps[:-1]]
            + ([dataclasses.asdict(last)] if last is not None else []),
        }
    )


def row_from_data(data: dict[str, Any]) -> RankEntry:
    """A rank's row from its report's JSON form, without reading the whole report (rank 0
    reads every rank's file, and only the heaviest one in full); VramscopeError, naming the
    field, when a part is not what a report holds."""
    section = data.get("distributed")
    section = section if isinstance(section, dict) else {}
    rank = _whole(section.get("rank"))
    device = data.get("device") if isinstance(data.get("device"), dict) else {}
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    duration = None
    if steps and _number(steps[-1].get("start_s")) is not None:
        duration = round(steps[-1]["start_s"] + (_number(steps[-1].get("duration_s")) or 0), 3)
    memory = section.get("memory")
    row = {
        "rank": rank if rank is not None else -1,
        "host": _text(section.get("host")),
        "peak": data.get("peak") or {},
        "categories_at_peak": data.get("categories_at_peak") or {},
        "exit": data.get("exit") or {},
        "reported": True,
        "local_rank": _whole(section.get("local_rank")),
        "pid": _whole(section.get("pid")),
        "device": {k: device[k] for k in ("type", "name", "index", "total_bytes") if k in device},
        "steps": sum(max(1, _whole(s.get("count")) or 1) for s in steps),
        "duration_s": duration,
        "memory": [m for m in memory if isinstance(m, dict)] if isinstance(memory, list) else [],
        "report_file": _text(section.get("report_file")),
        "ended_at": _text(section.get("ended_at")),
    }
    return _build(RankEntry, row, f"ranks[{rank}]")


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def row_to_dict(row: RankEntry) -> dict[str, Any]:
    return dataclasses.asdict(row)


def row_from_dict(data: dict[str, Any], rank: int) -> RankEntry:
    """A row sent by rank ``rank`` (VramscopeError, naming the field, when it is not one)."""
    return _build(RankEntry, data, f"ranks[{rank}]")


def missing_row(rank: int, status: str, error: str) -> RankEntry:
    """The row of a rank that sent no report."""
    return RankEntry(
        rank=rank,
        peak=Peak(),
        categories_at_peak=Categories(),
        exit=RankExit(status=status, code=None, error=error),
        reported=False,
    )


def measured(row: RankEntry) -> bool:
    """Whether a row holds numbers: the rank reported, or its journal was read."""
    return row.reported or row.source == "journal"


def measure_of(rows: list[RankEntry]) -> str:
    """What ranks the ranks by: peak allocated when a rank used CUDA, else host RSS."""
    if any(r.peak.allocated_bytes is not None for r in rows if measured(r)):
        return "peak_allocated_bytes"
    return "host_rss_bytes"


def _value(row: RankEntry, by: str) -> int | None:
    field = "allocated_bytes" if by == "peak_allocated_bytes" else "host_rss_bytes"
    return getattr(row.peak, field)


def heaviest(rows: list[RankEntry], by: str) -> RankEntry | None:
    """The rank with the highest peak (the lowest rank among equals)."""
    weighed = [r for r in rows if measured(r) and _value(r, by) is not None]
    if not weighed:
        return None
    return max(weighed, key=lambda r: (_value(r, by), -r.rank))


def imbalance(rows: list[RankEntry], by: str) -> dict[str, Any] | None:
    """Heaviest against lightest rank: max/min and the spread, over the ranks that reported."""
    weighed = [r for r in rows if measured(r) and _value(r, by) is not None]
    if not weighed:
        return None
    top = max(weighed, key=lambda r: (_value(r, by), -r.rank))
    low = min(weighed, key=lambda r: (_value(r, by), r.rank))
    high_bytes, low_bytes = _value(top, by) or 0, _value(low, by) or 0
    return {
        "by": by,
        "heaviest_rank": top.rank,
        "lightest_rank": low.rank,
        "max_bytes": high_bytes,
        "min_bytes": low_bytes,
        "spread_bytes": high_bytes - low_bytes,
        "max_over_min": round(high_bytes / low_bytes, 4) if low_bytes else None,
    }


def _ended_key(row: RankEntry) -> tuple[str, int]:
    return (row.ended_at or "~", row.rank)  # unknown times last


def job_exit(rows: list[RankEntry]) -> ExitInfo:
    """How the job ended: the first rank that failed on its own (an error, OOM, Ctrl-C),
    else the first one stopped by a signal; ``incomplete`` when all that reported ended
    well but a rank sent no report."""
    reported = [r for r in rows if r.reported]
    own = sorted(
        (r for r in reported if r.exit.status in FAILED_ON_ITS_OWN or (r.exit.code or 0)),
        key=lambda r: (r.exit.status not in FAILED_ON_ITS_OWN, *_ended_key(r)),
    )
    if own:
        first = own[0]
        what = first.exit.error or f"exited with {first.exit.code}"
        return ExitInfo(
            status=first.exit.status if first.exit.status != "ok" else "error",
            code=first.exit.code or 1,
            error=f"rank {first.rank}: {what}",
            signal=first.exit.signal,
        )
    missing = [r for r in rows if not r.reported]
    if missing:
        return ExitInfo(
            status="incomplete",
            code=0,
            error="no report from rank " + ", ".join(str(r.rank) for r in missing),
        )
    return ExitInfo()


def _where(row: RankEntry) -> str:
    return f"rank {row.rank}" + (f" ({row.host})" if row.host else "")


def rank_findings(rows: list[RankEntry], spread: dict[str, Any] | None) -> list[Finding]:
    """What the ranks say together: failed and missing ranks, an uneven job."""
    found = []
    for row in rows:
        if not row.reported:
            found.append(
                Finding(
                    "rank_missing",
                    "error",
                    f"{_where(row)} sent no report ({row.exit.error})"
                    + ("" if row.source == "journal" else "; its row is empty"),
                    {"rank": row.rank, "status": row.exit.status},
                )
            )
        elif row.exit.status != "ok" or row.exit.code:
            error = f": {row.exit.error}" if row.exit.error else ""
            found.append(
                Finding(
                    "rank_failed",
                    "error" if row.exit.status in FAILED_ON_ITS_OWN else "warning",
                    f"{_where(row)} ended {row.exit.status} (exit code {row.exit.code}){error};"
                    " its row is from its partial report",
                    {"rank": row.rank, "status": row.exit.status, "code": row.exit.code},
                )
            )
    ratio = spread.get("max_over_min") if spread else None
    if spread and (ratio is None or ratio >= IMBALANCE_WORTH_SAYING) and spread["spread_bytes"]:
        what = "peak allocated" if spread["by"] == "peak_allocated_bytes" else "peak host RSS"
        times = f"{ratio:.2f}×" if ratio else "far above"
        found.append(
            Finding(
                "rank_imbalance",
                "warning" if ratio is None or ratio >= IMBALANCE_WARNING else "info",
                f"rank {spread['heaviest_rank']} is the heaviest: {what} "
                f"{format_bytes(spread['max_bytes'])}, {times} rank {spread['lightest_rank']}'s "
                f"{format_bytes(spread['min_bytes'])} ({format_bytes(spread['spread_bytes'])} "
                "more); every device of the job needs room for the heaviest rank",
                dict(spread),
            )
        )
    return found


def job_report(
    base: Report, rows: list[RankEntry], gather: dict[str, Any], world_size: int
) -> Report:
    """The job's report: ``base`` (the heaviest rank's own report, or rank 0's when the
    heaviest one's could not be read) with a row per rank, the job's exit, the heaviest rank
    and the imbalance. ``gather`` describes how the rows came."""
    rows = sorted(rows, key=lambda r: r.rank)
    by = measure_of(rows)
    top = heaviest(rows, by)
    spread = imbalance(rows, by)
    section = base.extra.get("distributed")
    section = dict(section) if isinstance(section, dict) else {}
    if top is not None and section.get("rank") != top.rank:
        # the heaviest rank's own report was not readable: its numbers, rank 0's details
        base.peak = dataclasses.replace(top.peak)
        base.categories_at_peak = dataclasses.replace(top.categories_at_peak)
        base.categories_note = (
            f"peak and categories are rank {top.rank}'s (the heaviest); the rest of this "
            f"report is rank {section.get('rank')}'s, whose own report is below"
        )
        section["memory"] = list(top.memory)
    section.update(
        world_size=world_size,
        gathered=True,
        heaviest_rank=top.rank if top is not None else None,
        ranks_reported=sum(1 for r in rows if r.reported),
        imbalance=spread,
        gather=gather,
    )
    base.extra["distributed"] = section
    base.ranks = rows
    base.exit = job_exit(rows)
    base.findings = rank_findings(rows, spread) + list(base.findings)
    return base
