"""Journals left over in the user's private directory: found, listed and pruned.

A journal in the private directory (``<pid>-<random>.journal``: ``track()``, ``measure()``,
``@vramscope.profile``, the pytest plugin, ``%%vramscope``, ``vramscope run`` without
``--json``) is removed when its session stops; one that is still there after its process
ended is a **left-over**: that process died (SIGKILL, a segfault, ``os._exit``) and
``vramscope report PATH`` makes its report. ``vramscope report --list`` lists them.

Pruned so that the directory stays bounded, each time a session opens a new journal there
(``Session.start``, ``vramscope run``) and each time they are listed: a left-over last written more than ``KEEP_DAYS`` days ago is
removed, and beyond the ``KEEP_COUNT`` newest left-overs the older ones are. A journal whose
process still runs is never removed, nor is anything that is not a regular file of ours
named as a journal is.

The directory is the one ``vramscope watch`` reads, checked private (mode 0700, ours, not a
symbolic link) before use; every file in it is opened with ``O_NOFOLLOW`` relative to a
descriptor of that directory. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.journal.files import MAX_JOURNAL_BYTES
from vramscope.tracking.status import StatusDirError, open_status_dir, status_dir

KEEP_DAYS = 7  # a left-over last written longer ago than this is removed
KEEP_COUNT = 20  # at most this many left-overs are kept (the newest)
_NAME = re.compile(r"^(\d+)-[0-9a-f]+\.journal$")
# a compaction's file beside the journal, left when the process died while writing it
_TEMP = re.compile(r"^\.(\d+)-[0-9a-f]+\.journal\.[0-9a-f]+\.tmp$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


@dataclass
class Leftover:
    """A journal in the private directory, as ``vramscope report --list`` shows it."""

    path: Path
    pid: int
    size: int
    modified: float  # when it was last written (seconds since the epoch)
    alive: bool  # its process still runs: a run in progress, not a left-over
    started: float | None = None  # when its session started, from its header
    command: list[str] = field(default_factory=list)
    name: str | None = None  # the session's name (a test's node id, a function's name)
    steps: int | None = None  # the steps it holds (None: it could not be read)
    ended: str | None = None  # how its process ended, when `vramscope run` saw it
    problem: str | None = None  # why it cannot be read, or what is damaged

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "pid": self.pid,
            "alive": self.alive,
            "started_at": self.started,
            "modified_at": self.modified,
            "size_bytes": self.size,
            "steps": self.steps,
            "name": self.name,
            "command": self.command,
            "ended": self.ended,
            "problem": self.problem,
        }


def _alive(pid: int, written: float) -> bool:
    """Whether the process ``pid`` that last wrote a file at ``written`` still runs: a
    process of that pid created after the write is another one (the pid was reused)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - a dependency
        return True
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # it exists and cannot be inspected: keep it
    return created <= written + 1.0


def _stat(name: str, dir_fd: int) -> os.stat_result | None:
    """A regular file of ours under ``name``, never reached through a link (else None)."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        return None
    return info


def _read(name: str, dir_fd: int) -> bytes:
    """A journal's bytes, opened with ``O_NOFOLLOW`` beside ``dir_fd`` (OSError, or
    ValueError saying why it is no journal file)."""
    fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError("it is not a regular file of yours")
        if info.st_size > MAX_JOURNAL_BYTES:
            raise ValueError(f"it is larger ({info.st_size:,} bytes) than a journal gets")
        return source.read(MAX_JOURNAL_BYTES + 1)


def _entries(dir_fd: int) -> list[tuple[str, int, os.stat_result]]:
    """The journals in the directory: (name, pid, stat), regular files of ours only."""
    found = []
    for name in os.listdir(dir_fd):
        match = _NAME.match(name)
        if match is None:
            continue
        info = _stat(name, dir_fd)
        if info is not None:
            found.append((name, int(match.group(1)), info))
    return found


def _prune(dir_fd: int, now: float, keep_days: float, keep_count: int) -> list[str]:
    """Remove the left-overs the rule says (see the module); the names removed."""
    dead = [
        (info.st_mtime, name)
        for name, pid, info in _entries(dir_fd)
        if not _alive(pid, info.st_mtime)
    ]
    dead.sort(reverse=True)  # newest first
    cutoff = now - keep_days * 86400
    removed = []
    for rank, (modified, name) in enumerate(dead):
        if rank >= keep_count or modified < cutoff:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
                removed.append(name)
    for name in os.listdir(dir_fd):  # a compaction's file its process never renamed
        match = _TEMP.match(name)
        info = _stat(name, dir_fd) if match else None
        if match and info is not None and not _alive(int(match.group(1)), info.st_mtime):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
                removed.append(name)
    return removed


def prune(
    keep_days: float = KEEP_DAYS, keep_count: int = KEEP_COUNT, now: float | None = None
) -> list[str]:
    """Prune the private directory's left-over journals (see the module); the names
    removed. Nothing when the directory is missing or not safe to use."""
    try:
        dir_fd = open_status_dir(create=False)
    except (FileNotFoundError, StatusDirError):
        return []
    try:
        return _prune(dir_fd, time.time() if now is None else now, keep_days, keep_count)
    except OSError:
        return []
    finally:
        os.close(dir_fd)


def directory() -> Path:
    """The private directory journals are written to when no path is given."""
    return status_dir()


def list_journals(prune_first: bool = True) -> list[Leftover]:
    """The journals in the private directory, oldest first, each read as far as it is
    intact (left-overs pruned first, by the rule); ``StatusDirError`` when the directory is
    not safe to use, [] when it does not exist."""
    from vramscope.journal.reader import JournalError, parse_journal

    try:
        dir_fd = open_status_dir(create=False)
    except FileNotFoundError:
        return []
    found: list[Leftover] = []
    try:
        if prune_first:
            with contextlib.suppress(OSError):
                _prune(dir_fd, time.time(), KEEP_DAYS, KEEP_COUNT)
        base = status_dir()
        for name, pid, info in _entries(dir_fd):
            entry = Leftover(
                path=base / name,
                pid=pid,
                size=info.st_size,
                modified=info.st_mtime,
                alive=_alive(pid, info.st_mtime),
            )
            found.append(entry)
            try:
                journal = parse_journal(_read(name, dir_fd), str(entry.path))
            except (OSError, ValueError, JournalError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                entry.problem = f"not readable: {why}".replace(f"{entry.path} ", "")
                continue
            header = journal.header
            entry.started = journal.wall_start
            command = header.get("command")
            if isinstance(command, list):
                entry.command = [str(word) for word in command]
            name_said = header.get("name")
            entry.name = name_said if isinstance(name_said, str) else None
            entry.steps = 1 + max(
                (s.last_index if s.last_index is not None else s.index for s in journal.steps),
                default=-1,
            )
            if journal.ended is not None:
                entry.ended = _ended_words(journal.ended)
            if journal.problems:
                count = len(journal.problems)
                entry.problem = f"damaged: {count} line{'s' if count != 1 else ''} left out"
    finally:
        os.close(dir_fd)
    found.sort(key=lambda e: (e.started or e.modified, e.pid))
    return found


def _ended_words(record: dict[str, Any]) -> str | None:
    """How ``vramscope run``'s parent saw the process end, in a few words."""
    import signal

    number = record.get("signal")
    if isinstance(number, int) and not isinstance(number, bool):
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"
    code = record.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        return f"exit {code}"
    return None


__all__ = ["KEEP_COUNT", "KEEP_DAYS", "Leftover", "directory", "list_journals", "prune"]
