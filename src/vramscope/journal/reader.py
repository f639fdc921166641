"""Read a journal back: every record that is intact, and what was not.

A last line cut off is what a killed process leaves (it died while writing it): it is left
out and said so, not counted as damage. A line before it that is not a record (bytes
overwritten, another program's text) is damage: it is left out too, and counted in
``problems``, so that a caller can still make the report of the rest and then say, in one
line, that the journal is damaged. A file that is not a journal at all (no journal header
on its first line), or one from a newer vramscope, raises :class:`JournalError`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from vramscope.errors import VramscopeError
from vramscope.journal import files
from vramscope.journal.format import FIELDS, HEADER, SCHEMA, BadRecord, decode_sample, decode_step
from vramscope.tracking.records import StepRecord

STATE_KINDS = ("peak", "objects", "startup", "device", "allocator")


class JournalError(VramscopeError):
    """The file is not a journal this vramscope can read; the message says why."""


@dataclass
class Journal:
    """What a journal holds, as far as it is intact."""

    path: str
    header: dict[str, Any]
    steps: list[StepRecord] = field(default_factory=list)  # by index, none covered by another
    samples: list[tuple[Any, ...]] = field(default_factory=list)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> its latest record
    script_exit: dict[str, Any] | None = None  # how the script ended, once it had
    oom: dict[str, Any] | None = None  # its out-of-memory error, when that ended it
    stopped: bool = False  # the session stopped (its ``end`` record)
    ended: dict[str, Any] | None = None  # how its process ended, as the parent saw it
    last_t: float = 0.0  # the time of its last intact line (seconds from the start)
    lines: int = 0  # intact lines
    truncated: bool = False  # its last line was cut off (the process died writing it)
    problems: list[str] = field(default_factory=list)  # damaged lines: "line N: why"

    @property
    def wall_start(self) -> float | None:
        """When the session started (seconds since the epoch), from the header."""
        wall = self.header.get("wall0")
        return float(wall) if isinstance(wall, (int, float)) else None

    @property
    def intact(self) -> bool:
        """Whether every line but a cut-off last one was a record."""
        return not self.problems


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read the journal at ``path`` (JournalError when it cannot be read or is not one)."""
    shown = os.fspath(path)
    try:
        data = files.read_bytes(path)
    except FileNotFoundError:
        raise JournalError(f"no such journal: {shown}") from None
    except OSError as exc:
        raise JournalError(f"cannot read {shown}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise JournalError(f"{shown} is not a journal: {exc}") from None
    return parse_journal(data, shown)


def looks_like_journal(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts as a journal does (its first bytes), without reading it all."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        start = os.read(fd, 64)
    except OSError:
        return False
    finally:
        os.close(fd)
    return start.startswith(b'{"k":"' + HEADER.encode() + b'"')


def parse_journal(data: bytes, path: str = "journal") -> Journal:
    """A Journal from a journal's bytes (JournalError when they are not one)."""
    if not data.strip():
        raise JournalError(f"{path} is empty: the process ended before it wrote anything")
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a line cut off
    header = _header(lines[0] if lines else tail, path, complete=bool(lines))
    fields = {**FIELDS, **{k: v for k, v in header["fields"].items() if isinstance(v, list)}}
    journal = Journal(path=path, header=header, lines=1, last_t=_t(header) or 0.0)
    by_index: dict[int, StepRecord] = {}
    bad = ended = 0  # the numbers of the last line that was no record, and of `ended`
    for number, raw in enumerate(lines[1:], start=2):
        try:
            _take(journal, by_index, json.loads(raw), fields)
        except (ValueError, RecursionError, BadRecord, KeyError, TypeError) as exc:
            why = str(exc) if isinstance(exc, BadRecord) else "not a record"
            journal.problems.append(f"line {number}: {why}")
            bad = number
            continue
        journal.lines += 1
        if journal.ended is not None and not ended:
            ended = number
    if tail.strip():
        journal.truncated = True
    elif ended == len(lines) and bad == ended - 1:
        # the run's last line, cut off, then the line `vramscope run` added once it died
        journal.problems.pop()
        journal.truncated = True
    journal.steps = _uncovered(by_index)
    return journal


def _header(raw: bytes, path: str, complete: bool) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("k") != HEADER:
        if not complete and raw.startswith(b'{"k":"' + HEADER.encode()):
            raise JournalError(
                f"{path} holds no whole line: the process ended while it began its journal"
            )
        raise JournalError(f"{path} is not a vramscope journal (its first line is no header)")
    schema = header.get("schema")
    if not isinstance(schema, str) or not schema.startswith("vramscope.journal/"):
        raise JournalError(f"{path} is not a vramscope journal (its header names no schema)")
    if schema.rsplit("/", 1)[-1].split(".")[0] != SCHEMA.rsplit("/", 1)[-1]:
        raise JournalError(
            f"{path} was written by a newer vramscope ({schema[:40]}; this one reads "
            f"{SCHEMA}.x): upgrade vramscope"
        )
    if not isinstance(header.get("fields"), dict):
        raise JournalError(f"{path} is not a vramscope journal (its header names no fields)")
    for key in ("workload", "device", "host"):
        if not isinstance(header.get(key), dict):
            header[key] = {}
    return header


def _t(record: dict[str, Any]) -> float | None:
    t = record.get("t")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def _take(
    journal: Journal,
    by_index: dict[int, StepRecord],
    record: Any,
    fields: dict[str, list[str]],
) -> None:
    """Count one line's record into ``journal`` (BadRecord when it is not one)."""
    if not isinstance(record, dict) or not isinstance(record.get("k"), str):
        raise BadRecord("not a record")
    kind = record["k"]
    t = _t(record) if kind != "ended" else 0.0
    if t is None:
        raise BadRecord("a record without its time")
    if kind == "step":
        step = decode_step(record.get("v"), fields)
        by_index[step.index] = step
    elif kind == "samples":
        values = record.get("v")
        if not isinstance(values, list):
            raise BadRecord("samples should be a list")
        journal.samples.extend([decode_sample(v, fields) for v in values])
    elif kind in STATE_KINDS:
        journal.state[kind] = record
    elif kind in ("exit", "end"):
        if not isinstance(record.get("exit"), dict):
            raise BadRecord(f"an {kind} record without its exit")
        oom = record.get("oom")
        journal.script_exit = record["exit"]
        journal.oom = oom if isinstance(oom, dict) else None
        journal.stopped = journal.stopped or kind == "end"
    elif kind == "ended":  # appended by `vramscope run` once the process died
        journal.ended = record
        return  # (written after the run: no time of the run's own)
    elif kind == HEADER:  # a compaction's header cannot come twice
        raise BadRecord("a second header")
    # other kinds: written by a newer minor version; nothing to read in them here
    journal.last_t = max(journal.last_t, t)


def _uncovered(by_index: dict[int, StepRecord]) -> list[StepRecord]:
    """The step entries by index, leaving out those inside a wider entry (a long run's
    neighbours merged after they were written)."""
    kept: list[StepRecord] = []
    last = -1
    for index in sorted(by_index):
        if index <= last:
            continue
        record = by_index[index]
        kept.append(record)
        last = record.last_index if record.last_index is not None else index
    return kept
