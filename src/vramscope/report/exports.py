"""Write a Report to a file in one of the export formats: html, trace (Perfetto), csv."""

from __future__ import annotations

from pathlib import Path

from vramscope.errors import VramscopeError
from vramscope.report.model import Report

KINDS = ("html", "trace", "csv")


def write(kind: str, report: Report, path: Path) -> None:
    """Write ``report`` as ``kind`` ("html", "trace" or "csv") to ``path``."""
    if kind == "html":
        from vramscope.report.html import write as writer
    elif kind == "trace":
        from vramscope.report.perfetto import write as writer
    elif kind == "csv":
        from vramscope.report.csv_export import write as writer
    else:
        raise VramscopeError(f"unknown export format {kind!r}; use one of {', '.join(KINDS)}")
    try:
        writer(report, path)
    except OSError as exc:  # disk full, no permission: the user's to fix, in one line
        raise VramscopeError(f"cannot write {path}: {exc.strerror or exc}") from None
