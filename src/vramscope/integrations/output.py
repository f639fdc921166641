"""Where a trainer integration leaves its files: the report as JSON and HTML, epoch lines,
the run's journal."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vramscope.report.model import Report


def file_stem(stem: str, rank: int, world_size: int) -> str:
    """``vramscope`` for a single process, ``vramscope.rank1`` for rank 1 of a job."""
    return f"{stem}.rank{rank}" if world_size > 1 else stem


def journal_file(
    journal: str | os.PathLike[str] | bool | None,
    directory: str | Path,
    stem: str,
    rank: int = 0,
    world_size: int = 1,
) -> Path | None:
    """Where a training run writes its journal: ``True``, ``STEM.journal`` beside its report
    (``STEM`` already names the rank); a path, that file (``NAME.rankN.journal`` for each
    rank of a job); None or False, nowhere."""
    if journal is None or journal is False:
        return None
    if journal is True:
        return Path(directory) / f"{stem}.journal"
    path = Path(os.fspath(journal))
    return path.with_name(file_stem(path.stem, rank, world_size) + path.suffix)


def save_report(report: Report, directory: str | Path, stem: str, html: bool = True) -> list[Path]:
    """Write ``STEM.json`` (and ``STEM.html``) into ``directory``; the paths written."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = [report.save(target / f"{stem}.json")]
    if html:
        from vramscope.report.html import write

        written.append(write(report, target / f"{stem}.html"))
    return written


def append_epoch(
    directory: str | Path, stem: str, summary: dict[str, Any], first: bool = False
) -> Path:
    """Add one epoch's summary as a JSON line to ``STEM.epochs.jsonl`` (kept if the job dies);
    the ``first`` epoch of a run starts the file afresh."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{stem}.epochs.jsonl"
    with path.open("w" if first else "a", encoding="utf-8") as out:
        out.write(json.dumps(summary) + "\n")
    return path
