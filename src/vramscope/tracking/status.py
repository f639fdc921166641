"""The status file a tracked run writes and ``vramscope watch`` reads: phase, step, memory.

A tracked process writes one small JSON file, replaced atomically a few times per second at
most; ``watch`` lists the directory. Nothing listens on a port. The directory is private to
the user (mode 0700, owned by us, never a symlink) and every file is opened with
``O_NOFOLLOW`` relative to a directory descriptor checked once, so another user can neither
read the files nor redirect a write through a symlink. When the directory is unsafe the
writer disables itself silently and the reader says why.

Where the files live, first match wins:

1. ``$VRAMSCOPE_STATUS_DIR`` (tests and unusual setups);
2. ``$XDG_RUNTIME_DIR/vramscope`` when ``$XDG_RUNTIME_DIR`` is a directory we own;
3. ``/tmp/vramscope-<uid>``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import threading
import time
from pathlib import Path
from typing import Any

import psutil

SCHEMA = "vramscope.status/1"
MAX_STATUS_BYTES = 64 * 1024  # a status is a few hundred bytes; anything larger is not ours
_NAME_RE = re.compile(r"^(\d+)-[0-9a-f]+\.json$")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted in the directory must not hang us


class StatusDirError(Exception):
    """The status directory cannot be used safely; the message says why and what to do."""


def status_dir() -> Path:
    """The directory status files live in (it may not exist yet)."""
    override = os.environ.get("VRAMSCOPE_STATUS_DIR")
    if override:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            return Path(runtime) / "vramscope"
    return Path("/tmp") / f"vramscope-{os.geteuid()}"


def open_status_dir(create: bool = False, path: Path | None = None) -> int:
    """Open the status directory and return its descriptor, after checking it is private.

    Raises ``FileNotFoundError`` when it does not exist (and ``create`` is false) and
    ``StatusDirError`` when it exists but is not safe to use.
    """
    path = status_dir() if path is None else path
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StatusDirError(f"cannot create {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            kind = "a symlink" if os.path.islink(path) else "not a directory"
            raise StatusDirError(f"{path} is {kind}; refusing to use it (remove it)") from None
        raise StatusDirError(f"cannot open {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = (
            f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
            "refusing to use it (remove it, or set VRAMSCOPE_STATUS_DIR)"
        )
    elif st.st_mode & 0o077:
        problem = (
            f"{path} has permissions {stat.S_IMODE(st.st_mode):o}, so other users could "
            f"read or replace status files; refusing to use it (run: chmod 700 {path})"
        )
    if problem is not None:
        os.close(fd)
        raise StatusDirError(problem)
    return fd


def status_dir_problem() -> str | None:
    """Why status files cannot be read here, or None when they can (or none exist yet)."""
    try:
        fd = open_status_dir(create=False)
    except FileNotFoundError:
        return None
    except StatusDirError as exc:
        return str(exc)
    os.close(fd)
    return None


class StatusWriter:
    """Publishes a tracked run's status for ``vramscope watch``; never raises to the caller.

    ``info`` holds what does not change (script or workload name, device index, ...);
    ``update(**fields)`` merges what does (phase, step, epoch, allocated_bytes, ...). Writes
    happen at most every ``min_interval`` seconds; a throttled update is kept and written by
    the next ``update`` or ``flush`` after the interval, so a periodic ``flush()`` (from a
    sampler thread) bounds how stale the file gets. ``close()`` removes the file.

    Once a second by default: each write is four system calls on the sampler's thread, and
    each gives up the interpreter lock, which a busy training thread must then hand back
    (``watch`` shows a second-old state at worst, as ``nvidia-smi -l 1`` does).
    """

    def __init__(self, info: dict[str, Any], min_interval: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()  # a forked child (DataLoader worker) must not write
        self._min_interval = min_interval
        self._last_write = 0.0
        self._pending = False
        self._closed = False
        self._dir_fd: int | None = None
        self.disabled_reason: str | None = None
        self._status: dict[str, Any] = {
            "schema": SCHEMA,
            "pid": self._owner_pid,
            "started": time.time(),
        }
        self._status.update(info)
        self._name = f"{self._owner_pid}-{secrets.token_hex(4)}.json"
        self._tmp_name = f".{self._name}.tmp"
        self.directory = status_dir()
        try:
            self._dir_fd = open_status_dir(create=True, path=self.directory)
        except (StatusDirError, OSError) as exc:
            self.disabled_reason = str(exc)
            return
        with self._lock:
            self._write()

    @property
    def path(self) -> Path | None:
        """The status file, or None when status is disabled."""
        return None if self._dir_fd is None else self.directory / self._name

    @property
    def enabled(self) -> bool:
        return self._dir_fd is not None and not self._closed

    def update(self, **fields: Any) -> None:
        """Record new values; write them now unless the last write was too recent."""
        if not self.enabled or os.getpid() != self._owner_pid:
            return
        with self._lock:
            self._status.update(fields)
            self._pending = True
            if time.monotonic() - self._last_write >= self._min_interval:
                self._write()

    def flush(self) -> None:
        """Write a throttled update now."""
        if not self.enabled or os.getpid() != self._owner_pid:
            return
        with self._lock:
            if self._pending:
                self._write()

    def close(self) -> None:
        """Remove the status file; safe to call twice."""
        if self._closed or os.getpid() != self._owner_pid:
            return
        with self._lock:
            self._closed = True
            if self._dir_fd is None:
                return
            for name in (self._name, self._tmp_name):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self._dir_fd)
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> StatusWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> None:
        """Write to a fresh temp file beside the target, then rename over it (atomic)."""
        assert self._dir_fd is not None
        self._status["updated_at"] = time.time()
        data = json.dumps(self._status, default=str, separators=(",", ":")).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        try:
            try:
                fd = os.open(self._tmp_name, flags, 0o600, dir_fd=self._dir_fd)
            except FileExistsError:  # left by a crash mid-write; the directory is ours
                os.unlink(self._tmp_name, dir_fd=self._dir_fd)
                fd = os.open(self._tmp_name, flags, 0o600, dir_fd=self._dir_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(self._tmp_name, self._name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except OSError as exc:
            self.disabled_reason = f"cannot write status file: {exc}"
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
            self._dir_fd = None
            return
        self._last_write = time.monotonic()
        self._pending = False


def read_statuses() -> list[dict[str, Any]]:
    """The status of every tracked run of this user, oldest first.

    Files of processes that ended (or whose PID was reused) are removed; files that are
    not regular, not ours, too large or not valid JSON are skipped.
    """
    try:
        dir_fd = open_status_dir(create=False)
    except (FileNotFoundError, StatusDirError):
        return []
    statuses = []
    try:
        for name in os.listdir(dir_fd):
            match = _NAME_RE.match(name)
            if match is None:
                continue
            status = _read_one(name, dir_fd)
            if status is None:
                continue
            if not _alive(status):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
                continue
            status["age_s"] = max(0.0, time.time() - float(status.get("updated_at") or 0))
            statuses.append(status)
    finally:
        os.close(dir_fd)
    statuses.sort(key=lambda s: (float(s.get("started") or 0), int(s["pid"])))
    return statuses


def _read_one(name: str, dir_fd: int) -> dict[str, Any] | None:
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    except OSError:  # a symlink (ELOOP), or replaced/removed since listing
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        if st.st_size > MAX_STATUS_BYTES:
            return None
        raw = os.read(fd, MAX_STATUS_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        status = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(status, dict) or not isinstance(status.get("pid"), int):
        return None
    return status


def _alive(status: dict[str, Any]) -> bool:
    """Whether the writing process still runs (the same process, not a reused PID)."""
    try:
        created = psutil.Process(status["pid"]).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # exists but cannot be inspected: keep it
    started = status.get("started")
    # a process created after the run started is a new process with a reused PID
    return not (isinstance(started, (int, float)) and created > started + 1.0)
