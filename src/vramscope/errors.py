"""Errors vramscope raises for the user to act on; the CLI turns them into one line and exit 2."""

from __future__ import annotations


class VramscopeError(Exception):
    """A problem the user can fix (bad input, missing file, unknown name).

    The message is one sentence that says what is wrong and what to do; text it quotes from
    the user (a spec, a path) keeps it on one line: line breaks show as ``\\n``.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        if isinstance(message, str):
            message = message.replace("\r", "\\r").replace("\n", "\\n")
        super().__init__(message, *args)


class WorkloadError(VramscopeError):
    """A workload spec that cannot be resolved or whose build function raised."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
