"""The words a report is written in: counts, plurals, ranges, changes and times, each made in
one place so that every sentence that states a fact states it the same way.

Pure functions of numbers; no torch, no report. Sizes are :func:`vramscope.units.format_bytes`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

DASH = "–"  # between the ends of a range: 0–2, 10–19


def count(n: int | float | None) -> str:
    """A whole number as a person reads it: ``1,024``; ``?`` for None."""
    if n is None:
        return "?"
    return f"{int(n):,}"


def plural(n: int | float, singular: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``, ``1,024 batch sizes``; ``many`` for irregular plurals."""
    word = singular if n == 1 else (many if many is not None else singular + "s")
    return f"{count(n)} {word}"


def a(phrase: str) -> str:
    """``phrase`` with its indefinite article, as a number in it is read aloud: ``a 2.00 GiB
    budget``, ``an 8.00 GiB budget``, ``an 11 GiB budget``, ``an 800 MiB cap``."""
    number = re.match(r"\s*([\d,]+)", phrase)
    if number:  # eight, eighty, eight hundred, eleven, eighteen, eleven thousand …
        digits = number.group(1).replace(",", "")
        vowel = digits[:1] == "8" or (len(digits) % 3 == 2 and digits[:2] in ("11", "18"))
    else:
        vowel = phrase.lstrip()[:1].lower() in "aeio"  # not "u": a user
    return f"{'an' if vowel else 'a'} {phrase}"


def times(n: int) -> str:
    """``once``, ``twice``, ``3 times``."""
    return {1: "once", 2: "twice"}.get(n, f"{count(n)} times")


def listing(items: Sequence[str], conjunction: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = [str(i) for i in items]
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def spans(numbers: Iterable[int]) -> list[list[int]]:
    """Whole numbers as sorted ``[first, last]`` runs: 0, 1, 2, 4 → [[0, 2], [4, 4]]."""
    out: list[list[int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def ranges(
    runs: Iterable[Sequence[int]] | None = None, limit: int = 6, numbers: Iterable[int] = ()
) -> str:
    """Runs of whole numbers for a sentence: ``0–2, 4, 6, 8 and 10–19``; past ``limit``
    runs, ``0–2, 4, … and 3 more runs``. ``runs`` are ``[first, last]`` pairs; ``numbers``
    are single numbers (grouped into runs)."""
    pairs = [list(r) for r in runs] if runs is not None else spans(numbers)
    parts = [count(a) if a == b else f"{count(a)}{DASH}{count(b)}" for a, b in pairs]
    if len(parts) > limit:
        rest = len(parts) - limit
        return ", ".join(parts[:limit]) + f" and {plural(rest, 'more run')}"
    return listing(parts)


def change(value: float, reference: float) -> str:
    """How ``value`` compares with ``reference``, in words that carry the direction:
    ``9% below``, ``26% above``, ``the same as``, ``slightly above``."""
    if value == reference:
        return "the same as"
    if not reference or round(100 * (value - reference) / reference) == 0:
        return "slightly above" if value > reference else "slightly below"
    pct = 100 * (value - reference) / reference
    return f"{abs(pct):.0f}% {'above' if pct > 0 else 'below'}"


def signed_pct(value: float | None, digits: int = 1) -> str:
    """A change in percent with its sign, for a column headed by what it is a change of
    (``vs baseline``): ``-54.4%``, ``+0.9%``, ``0%``; blank for None."""
    if value is None:
        return ""
    if round(value, digits) == 0:
        return "0%"
    return f"{value:+.{digits}f}%"


def duration(seconds: float | None) -> str:
    """A time as a person reads it: ``850 µs``, ``12.4 ms``, ``3.2 s``, ``4 min 05 s``;
    blank for None (not timed)."""
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 0.1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


# words a field name abbreviates
_SPELLED = {"rss": "RSS", "pct": "%", "oom": "OOM", "gpu": "GPU", "cuda": "CUDA"}


def field_label(key: str) -> str:
    """A report field's name in words: ``peak.host_rss_bytes`` → ``peak host RSS``,
    ``headroom_pct`` → ``headroom %``."""
    words = key.replace(".", "_").removesuffix("_bytes").split("_")
    return " ".join(_SPELLED.get(w, w) for w in words if w)
