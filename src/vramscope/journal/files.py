"""Where journals live, and the one file a journal is: private, appended, never reached
through a symbolic link.

- ``vramscope run --json NAME.json``, ``vramscope measure --json NAME.json``:
  ``NAME.journal`` beside the report;
- a trainer callback (Lightning, Hugging Face): ``vramscope.journal`` beside its
  ``vramscope.json`` (see :func:`vramscope.integrations.output.journal_file`);
- a rank under torchrun: ``rank-N.journal`` in the job's private rank directory (beside its
  ``rank-N.json``);
- otherwise (``track()``, ``measure()``, ``run`` without a report file): the user's private
  directory, the one ``vramscope watch`` reads (mode 0700: ``$XDG_RUNTIME_DIR/vramscope``
  or ``/tmp/vramscope-<uid>``), as ``<pid>-<random>.journal``; one left there by a process
  that died is listed and pruned by :mod:`vramscope.journal.leftovers`.

The file is made with mode 0600, ``O_EXCL`` and ``O_NOFOLLOW`` through a descriptor of its
directory held open (a file or link already there under the name is removed first, never
written through); a compaction writes a new file beside it and renames it over the old one,
so a reader always finds one whole journal.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from vramscope.tracking.status import StatusDirError, open_status_dir, status_dir

SUFFIX = ".journal"
MAX_JOURNAL_BYTES = 256 * 1024 * 1024  # read at most this much (a journal is a few MiB)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def beside(report_path: str | os.PathLike[str]) -> Path:
    """The journal of a report written to ``report_path``: ``NAME.journal`` beside it."""
    path = Path(report_path)
    return path.with_name(path.stem + SUFFIX)


def private_path() -> Path:
    """A new journal's path in the user's private directory (made, mode 0700, when missing);
    ``StatusDirError`` when that directory is not safe to use."""
    fd = open_status_dir(create=True)
    os.close(fd)
    return status_dir() / f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"


class JournalFile:
    """An append-only file, made new at ``path`` (OSError when it cannot be)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = self.path.name
        parent = str(self.path.parent) or "."
        self._dir = os.open(parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        try:
            self._fd = self._create(self.name)
        except BaseException:
            os.close(self._dir)
            raise
        self.size = 0

    def _create(self, name: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _NOFOLLOW | _CLOEXEC
        try:
            return os.open(name, flags, 0o600, dir_fd=self._dir)
        except FileExistsError:  # an earlier run's (or a planted link): removed, not followed
            os.unlink(name, dir_fd=self._dir)
            return os.open(name, flags, 0o600, dir_fd=self._dir)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self.size += len(data)

    def replace(self, data: bytes) -> None:
        """The journal is now ``data``: written beside it, then renamed over it."""
        temp = f".{self.name}.{secrets.token_hex(4)}.tmp"
        fd = self._create(temp)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.rename(temp, self.name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self._dir)
            raise
        os.close(self._fd)
        self._fd = fd
        self.size = len(data)

    def close(self, remove: bool = False) -> None:
        """Close the file (and remove it: ``remove``); safe to call twice."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = -1
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.name, dir_fd=self._dir)
        with contextlib.suppress(OSError):
            os.close(self._dir)

    def forget(self) -> None:
        """In a forked child (a DataLoader worker): never write to the parent's file."""
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._dir)
        self._fd = -1


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_JOURNAL_BYTES) -> bytes:
    """A journal's bytes, opened without following a symbolic link; OSError (or a
    ValueError saying why) when it is not a regular file that can be read."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        if info.st_size > limit:
            raise ValueError(f"it is larger ({info.st_size:,} bytes) than a journal gets")
        return source.read(limit + 1)


def append(path: str | os.PathLike[str], data: bytes) -> None:
    """Append a line to an existing journal (never through a symbolic link); a last line
    cut off stays a line of its own."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{os.fspath(path)} is not a regular file")
        if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
    finally:
        os.close(fd)


def remove(path: str | os.PathLike[str]) -> None:
    """Remove a journal (nothing when it is gone)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = [
    "JournalFile",
    "StatusDirError",
    "append",
    "beside",
    "private_path",
    "read_bytes",
    "remove",
]
