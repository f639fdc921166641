"""Sizes in binary units: parse what a person writes, format what a person reads."""

from __future__ import annotations

import math
import re
from fractions import Fraction

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
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"  # 24, 1.5, 2., .5 (ASCII digits only)
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*$", re.ASCII)
_PERCENT_RE = re.compile(rf"^\s*{_NUMBER}\s*(%?)\s*$", re.ASCII)
MAX_BYTES = 2**63  # 8 EiB: no memory is larger; beyond it a size is a typo


def _shown(text: object) -> str:
    """``text`` quoted for a one-line message, cut when long."""
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:36] + "…" + shown[-3:]


def parse_size(text: str | int) -> int:
    """Parse ``"24GiB"``, ``"24 GB"``, ``"512m"``, ``"1.5 TiB"`` or ``1024`` into bytes.

    ``GiB``/``G`` are powers of 1024 and ``GB`` powers of 1000, as on a datasheet; the
    result is exact (``"1.1GB"`` is 1,100,000,000) and rounded to a whole byte.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise VramscopeError(f"cannot read {_shown(text)} as a size; write it like 24GiB")
    if isinstance(text, int):
        if not 0 <= text < MAX_BYTES:
            raise VramscopeError(f"size must be between 0 and 8 EiB, not {_shown(text)}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise VramscopeError(
            f"cannot read {_shown(text)} as a size; write it like 24GiB, 80GB, 512MiB or 1073741824"
        )
    number, unit = match.groups()
    if len(number) > 40:
        raise VramscopeError(f"cannot read {_shown(text)} as a size: too many digits")
    value = round(Fraction(number) * _UNITS[unit.lower()])
    if value >= MAX_BYTES:
        raise VramscopeError(f"{_shown(text)} is larger than any memory (8 EiB at most)")
    return value


def parse_percent(text: str | float) -> float:
    """Parse ``"5%"``, ``"5"`` or ``0.05`` into a fraction (0.05).

    A number of 1 or more is a percentage (``"1"`` is 1%); below 1, a fraction.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise VramscopeError(f"cannot read {_shown(text)} as a percentage; write it like 5%")
    if isinstance(text, (int, float)):
        value = float(text)
        if not math.isfinite(value):
            raise VramscopeError(f"cannot read {_shown(text)} as a percentage; write it like 5%")
        return value / 100 if abs(value) >= 1 else value
    match = _PERCENT_RE.match(text)
    if not match or len(match.group(1)) > 40:
        raise VramscopeError(f"cannot read {_shown(text)} as a percentage; write it like 5%")
    value = float(match.group(1))
    return value / 100 if match.group(2) or value >= 1 else value


def format_percent(fraction: float) -> str:
    """A fraction as the percentage it was given as: ``0.05`` → ``5%``, ``0.015`` → ``1.5%``."""
    return f"{round(100 * fraction, 2):g}%"


def format_bytes(n: int | float | None, signed: bool = False) -> str:
    """Format a byte count in binary units: ``1.50 GiB``, ``512 B``; ``n/a`` for None."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "n/a"
    sign = ""
    if n < 0:
        sign, n = "-", -n
    elif signed:
        sign = "+"
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            shown = f"{n / scale:.2f}" if n < 2**1000 else str(int(n) // scale)  # no float overflow
            return f"{sign}{shown} {unit}"
    return f"{sign}{int(n)} B"


def round_up(n: int, multiple: int) -> int:
    """Round ``n`` up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple
