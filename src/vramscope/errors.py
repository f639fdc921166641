"""Errors vramscope raises for the user to act on; the CLI turns them into one line and exit 2."""

from __future__ import annotations


class VramscopeError(Exception):
    """A problem the user can fix (bad input, missing file, unknown name).

    The message is one sentence that says what is wrong and what to do.
    """


class WorkloadError(VramscopeError):
    """A workload spec that cannot be resolved or whose build function raised."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
