"""Reports made from a journal: ``run``'s, when its script's process died without writing one,
and ``report JOURNAL``'s, by hand. No torch: the journal holds everything."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import click

from vramscope.cli.common import emit
from vramscope.errors import VramscopeError
from vramscope.journal import files
from vramscope.journal.ending import Ending
from vramscope.journal.reader import Journal, JournalError, read_journal
from vramscope.journal.rebuild import report_from_journal, report_without_journal
from vramscope.report.model import Report


def damage(journal: Journal) -> str | None:
    """One line saying that a journal is damaged, or None when it is intact."""
    if journal.intact:
        return None
    count = len(journal.problems)
    return (
        f"{journal.path} is damaged: {count} line{'s' if count != 1 else ''} left out "
        f"({journal.problems[0]}); the report is made from the rest"
    )


def load_journal_report(path: str) -> tuple[Report, str | None]:
    """The report a journal makes, and the line that says it is damaged (None: intact);
    VramscopeError when the file is not a journal."""
    journal = read_journal(path)
    return report_from_journal(journal), damage(journal)


def report_on_death(
    journal_path: Path, script: str, ending: Ending, outputs: dict[str, Any]
) -> None:
    """``run``'s script's process ended without its report: make it from the journal (or,
    with no journal, from how the process ended alone), write it where ``run`` was asked to
    (``outputs``: :func:`emit`'s paths and ``quiet``), and say so in one line."""
    shown = str(journal_path)
    damaged = None
    if ending.signal is None and not journal_path.exists():
        return  # ended before its script ran (an option it refused): it said why itself
    try:
        journal = read_journal(journal_path)
        with contextlib.suppress(OSError):  # `report JOURNAL` later says how it ended too
            files.append(journal_path, (json.dumps(ending.to_record()) + "\n").encode())
    except JournalError as exc:
        report = report_without_journal(script, ending, str(exc))
        where = f"no journal to make it from ({exc})"
    else:
        report = report_from_journal(journal, ending)
        damaged = damage(journal)
        lost = report.exit.lost_seconds
        where = f"made from its journal {shown}" + (
            f", which misses its last {lost:.1f} s" if lost is not None else ""
        )
    try:
        emit(report, **outputs)
    except VramscopeError as exc:
        click.echo(f"vramscope: error: {exc}", err=True)
    click.echo(f"vramscope: {script}: {report.exit.error}; the report is {where}", err=True)
    if damaged:
        click.echo(f"vramscope: {damaged}", err=True)
