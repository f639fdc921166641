"""Reading the free-form sections of a report (modules, peak tensors, line tables, fit) as
renderers need them: a saved file may hold anything there, and a value of the wrong type
reads as missing instead of failing."""

from __future__ import annotations

from typing import Any

LARGEST = 2**63  # no byte count or index in a report comes near it


def records(value: Any) -> list[dict[str, Any]]:
    """The dicts of a list (modules, tensors, lines, trials); anything else is skipped."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def number(value: Any) -> int | float | None:
    """A number, or None when the field holds something else (text, a bool, a huge value)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok and abs(value) < LARGEST else None


def text(value: Any) -> str:
    """Text for a cell: "" for None, ``str()`` of anything else."""
    return value if isinstance(value, str) else "" if value is None else str(value)


def mapping(value: Any) -> dict[str, Any]:
    """A section that should be an object (``distributed``), or an empty dict."""
    return value if isinstance(value, dict) else {}
