"""Ranks that sent no report, read from their journals: a rank's row in the job's report,
and the job's whole report when rank 0 itself made none (it was killed). No torch: the
launcher of ``vramscope run --nproc`` uses it after torchrun has ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramscope.distributed import exchange, gather
from vramscope.errors import VramscopeError
from vramscope.report.model import RankEntry, Report


def journal_row(
    directory: exchange.PrivateDir, row: RankEntry, section: dict[str, Any], kept: bool
) -> tuple[RankEntry, Report] | None:
    """The row of a rank that sent no report (``row``: its exit and where it ran), made from
    its journal when it left one in ``directory`` (its process was killed, crashed, or
    hangs): its numbers up to the journal's last line, and the report made from it. None
    without a journal; VramscopeError when it is not one."""
    name = exchange.journal_file(row.rank)
    raw = directory.read(name)
    if raw is None:
        return None
    from vramscope.journal.reader import parse_journal
    from vramscope.journal.rebuild import report_from_journal

    journal = parse_journal(raw, str(directory.path / name))
    report = report_from_journal(journal)
    report.extra["distributed"] = {
        **section,
        "rank": row.rank,
        "host": row.host,
        "pid": row.pid,
        "local_rank": None,
    }
    made = gather.row_of(report)
    made.exit, made.reported, made.source = row.exit, False, "journal"
    made.exit.error = (
        f"{row.exit.error}; its row is made from its journal, which ends "
        f"{journal.last_t:.1f} s after it started"
    )
    made.report_file = str(directory.path / name) if kept else None
    return made, report


def job_report_from_files(folder: Path, world_size: int) -> Report | None:
    """The job's report when rank 0 made none (it was killed): from the ranks' report files
    and journals in ``folder`` (``NAME.ranks`` beside ``--json``). None when no rank left
    anything there."""
    try:
        directory = exchange.PrivateDir(folder)
    except exchange.UnsafeDirectory:
        return None
    rows: dict[int, RankEntry] = {}
    reports: dict[int, Report] = {}
    try:
        for rank in range(world_size):
            raw = directory.read(exchange.rank_file(rank))
            try:
                if raw is not None:
                    reports[rank] = exchange.load_report(raw)
                    rows[rank] = gather.row_of(reports[rank])
                    rows[rank].report_file = str(folder / exchange.rank_file(rank))
                    continue
                lost = gather.missing_row(
                    rank, "lost", "its process ended without a report (killed, or it crashed)"
                )
                made = journal_row(directory, lost, {"world_size": world_size}, kept=True)
            except VramscopeError:
                made = None
            if made is not None:
                rows[rank], reports[rank] = made
            else:
                rows[rank] = gather.missing_row(rank, "lost", "no report and no journal")
    finally:
        directory.close()
    top = gather.heaviest(list(rows.values()), gather.measure_of(list(rows.values())))
    if top is None:
        return None
    gathered = {
        "via": ["files"],
        "missing": sorted(r for r, row in rows.items() if not row.reported),
        "dir": str(folder),
        "notes": ["rank 0 ended without the job's report: made from the ranks' files"],
    }
    return gather.job_report(reports[top.rank], list(rows.values()), gathered, world_size)
