"""Tables that fit the width they are printed at: the full layout when it fits, a narrower one
otherwise (a log file is 80 columns), and never a cell cut short with "…"."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

_UNBOUNDED = 10_000  # columns: wide enough that nothing is squeezed when measuring


def folded(renderable: RenderableType) -> RenderableType:
    """``renderable`` with every table column free to wrap, and a word longer than its
    column broken over lines ("fold") instead of cut with "…"."""
    if isinstance(renderable, Table):
        table = copy.copy(renderable)
        table.columns = [
            dataclasses.replace(column, no_wrap=False, overflow="fold")
            for column in renderable.columns
        ]
        return table
    if isinstance(renderable, Group):
        return Group(*(folded(part) for part in renderable.renderables))
    if isinstance(renderable, Padding):
        padded = copy.copy(renderable)
        padded.renderable = folded(renderable.renderable)
        return padded
    if isinstance(renderable, Text) and renderable.overflow == "ellipsis":
        text = renderable.copy()
        text.overflow, text.no_wrap = "fold", False
        return text
    return renderable


def natural_width(console: Console, options: ConsoleOptions, renderable: RenderableType) -> int:
    """How wide ``renderable`` is when nothing wraps."""
    return Measurement.get(console, options.update_width(_UNBOUNDED), renderable).maximum


class FirstThatFits:
    """Renders the first layout whose natural width fits the space it is given; when none
    does, the last one, folded so that it wraps instead of cutting."""

    def __init__(self, layouts: Iterable[RenderableType]) -> None:
        self.layouts = list(layouts)

    def choose(self, console: Console, options: ConsoleOptions) -> RenderableType:
        for layout in self.layouts:
            if natural_width(console, options, layout) <= options.max_width:
                return layout
        return folded(self.layouts[-1])

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.choose(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.choose(console, options))


def fitting(*layouts: RenderableType) -> FirstThatFits:
    """The widest of ``layouts`` (give them widest first) that fits, else the narrowest folded."""
    return FirstThatFits(layouts)
