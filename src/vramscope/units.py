"""Sizes in binary units: parse what a person writes, format what a person reads."""

from __future__ import annotations

import re

from vramscope.errors import VramscopeError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse ``"24GiB"``, ``"24 GB"``, ``"512m"`` or ``1024`` into bytes.

    ``GiB``/``G`` are powers of 1024 and ``GB`` powers of 1000, as on a datasheet.
    """
    if isinstance(text, int):
        if text < 0:
            raise VramscopeError(f"size must not be negative: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise VramscopeError(
            f"cannot read {text!r} as a size; write it like 24GiB, 80GB, 512MiB or 1073741824"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    return round(value)


def parse_percent(text: str | float) -> float:
    """Parse ``"5%"``, ``"5"`` or ``0.05`` into a fraction (0.05)."""
    if isinstance(text, (int, float)):
        value = float(text)
        return value / 100 if value > 1 else value
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            return float(raw[:-1]) / 100
        value = float(raw)
    except ValueError:
        raise VramscopeError(f"cannot read {text!r} as a percentage; write it like 5%") from None
    return value / 100 if value > 1 else value


def format_bytes(n: int | float | None, signed: bool = False) -> str:
    """Format a byte count in binary units: ``1.50 GiB``, ``512 B``; ``n/a`` for None."""
    if n is None:
        return "n/a"
    sign = ""
    if n < 0:
        sign, n = "-", -n
    elif signed:
        sign = "+"
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def round_up(n: int, multiple: int) -> int:
    """Round ``n`` up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple
