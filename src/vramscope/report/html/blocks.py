"""The data behind the page's building blocks: a section card, a table, a chart box."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    """One card of the page: its template under ``templates/sections/`` and what fills it.

    ``title`` and ``lead`` head the card, ``nav`` is its link in the table of contents;
    ``data`` holds what the template reads (tables, chart boxes, notes), as plain values.
    """

    template: str
    anchor: str
    nav: str
    title: str
    lead: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chart:
    """A box the page's script draws a figure into (``figures[id]``), at a fixed height."""

    id: str
    height: int


@dataclass
class Cell:
    """A table cell: its text, its class names, and a colour swatch drawn before the text."""

    text: str
    classes: str = ""
    swatch: str = ""


@dataclass
class Row:
    cells: list[Cell]
    classes: str = ""


@dataclass
class Table:
    """Header cells and rows; a ``None`` row is drawn as an elision across every column."""

    headers: list[Cell]
    rows: list[Row | None]


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str] | None],
    left: int = 1,
    row_classes: Sequence[str] | None = None,
    text_columns: Sequence[int] = (),
    cell_classes: Sequence[Sequence[str]] | None = None,
) -> Table:
    """A table of text; a ``None`` row is drawn as an elision.

    The first ``left`` columns and those in ``text_columns`` (negative counts from the
    end) are left-aligned and wrap; ``cell_classes`` adds class names cell by cell.
    """

    def is_text(i: int) -> bool:
        return i < left or i in text_columns or (i - len(headers)) in text_columns

    head = [Cell(str(h), "l" if is_text(i) else "") for i, h in enumerate(headers)]
    body: list[Row | None] = []
    for n, row in enumerate(rows):
        if row is None:
            body.append(None)
            continue
        extra = cell_classes[n] if cell_classes else ()
        cells = []
        for i, text in enumerate(row):
            names = ["l"] if is_text(i) else []
            if i < len(extra) and extra[i]:
                names.append(extra[i])
            cells.append(Cell(text, " ".join(names)))
        body.append(Row(cells, row_classes[n] if row_classes and row_classes[n] else ""))
    return Table(head, body)
