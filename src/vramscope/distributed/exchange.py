"""How each rank's report reaches rank 0: the job's key-value store, or private files.

Every rank publishes its row (a few hundred bytes) and its full report (compressed) to
each channel it can reach; rank 0 polls every channel it can reach until each rank has
published or the time is up. Nothing here blocks on a rank that never comes, and nothing
listens on a port: the stores are the job's own (the store of the process group the
script left initialised, or torchrun's, reached as a client the way its workers reach it),
and the files live in a directory only this user can enter, written atomically and
opened without following symbolic links.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any

from vramscope.errors import VramscopeError
from vramscope.report.model import Report

MAX_REPORT_BYTES = 256 * 1024 * 1024  # a rank's report, uncompressed: far above a real one
MAX_ROW_BYTES = 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
STORE_PREFIX = "vramscope"


class UnsafeDirectory(VramscopeError):
    """A directory for rank files exists but is not this user's private directory."""


def _uid() -> int:
    """The user files are made as (the owner a private directory must have)."""
    return os.geteuid() if hasattr(os, "geteuid") else 0


class PrivateDir:
    """A directory only this user can use, held open so that every file in it is reached
    through the directory itself (no path re-resolved, no symbolic link followed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        try:
            self.fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
        except OSError as exc:
            raise UnsafeDirectory(f"cannot use {path} for rank files: {exc.strerror}") from None
        info = os.fstat(self.fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != _uid() or info.st_mode & 0o077:
            os.close(self.fd)
            raise UnsafeDirectory(
                f"{path} is not a private directory of this user (owner, or mode "
                f"{stat.filemode(info.st_mode)}); rank files are not written there"
            )

    @classmethod
    def inside(cls, parent: PrivateDir, name: str) -> PrivateDir:
        """A private directory ``name`` inside ``parent``, made through its descriptor."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent.fd)
        self = cls.__new__(cls)
        self.path = parent.path / name
        try:
            self.fd = os.open(
                name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=parent.fd
            )
        except OSError as exc:
            raise UnsafeDirectory(f"cannot use {self.path}: {exc.strerror}") from None
        info = os.fstat(self.fd)
        if info.st_uid != _uid() or info.st_mode & 0o077:
            os.close(self.fd)
            raise UnsafeDirectory(f"{self.path} is not a private directory of this user")
        return self

    def write(self, name: str, data: bytes) -> Path:
        """Write ``name`` atomically: a new file beside it, then renamed over it."""
        temp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=self.fd
        )
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.rename(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.fd)
            raise
        return self.path / name

    def read(self, name: str, limit: int = MAX_REPORT_BYTES) -> bytes | None:
        """The bytes of ``name`` when it is a regular file of this user (None otherwise)."""
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != _uid() or info.st_size > limit:
                return None
            return source.read(limit + 1)[:limit]

    def names(self) -> list[str]:
        try:
            return [entry.name for entry in os.scandir(self.fd)]
        except OSError:
            return []

    def remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self.fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def rank_dir(json_path: str | None, job: str) -> tuple[PrivateDir, bool]:
    """Where this job's ranks write their reports: ``NAME.ranks/`` beside ``--json NAME.json``
    (kept: a report per rank), else a private temporary directory for the job (removed
    once gathered). Returns the directory and whether it is kept."""
    if json_path and json_path != "-":
        target = Path(json_path)
        with contextlib.suppress(UnsafeDirectory, OSError):
            if target.parent.is_dir():
                return PrivateDir(target.parent / f"{target.stem}.ranks"), True
    base = PrivateDir(Path(tempfile.gettempdir()) / f"vramscope-{_uid()}")
    try:
        return PrivateDir.inside(base, job), False
    finally:
        base.close()


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


def journal_file(rank: int) -> str:
    """A rank's journal, written as it runs, beside where its report goes."""
    return f"rank-{rank}.journal"


def encode_report(report: Report) -> bytes:
    return zlib.compress(report.to_json(indent=None).encode("utf-8"), 6)


def decode_report(data: bytes) -> Report:
    """A report from ``encode_report``'s bytes (VramscopeError when it is not one)."""
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(data, MAX_REPORT_BYTES)
    except zlib.error as exc:
        raise VramscopeError(f"a rank's report is not readable: {exc}") from None
    if inflate.unconsumed_tail:
        raise VramscopeError("a rank's report is larger than vramscope reads")
    return load_report(raw)


def load_report(raw: bytes) -> Report:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise VramscopeError(f"a rank's report is not valid JSON: {exc}") from None
    return Report.from_dict(data)


def _small_json(raw: bytes) -> dict[str, Any] | None:
    """A small JSON object (a hello or a row), or None."""
    if len(raw) > MAX_ROW_BYTES:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class StoreChannel:
    """Reports through a c10d key-value store (TCPStore, FileStore, a PrefixStore of them).

    A rank sets ``<prefix>/<rank>/report`` (compressed JSON), then ``<prefix>/<rank>/row``
    and adds 1 to ``<prefix>/count``; rank 0 reads the counter (one round trip) and looks
    for new rows only when it grew.
    """

    def __init__(self, store: Any, job: str, name: str) -> None:
        self.store = store
        self.prefix = f"{STORE_PREFIX}/{job}"
        self.name = name
        self._count_seen = 0

    def _key(self, rank: int, part: str) -> str:
        return f"{self.prefix}/{rank}/{part}"

    def hello(self, rank: int, data: dict[str, Any]) -> None:
        self.store.set(self._key(rank, "hello"), json.dumps(data).encode())

    def hellos(self, ranks: set[int]) -> dict[int, dict[str, Any]]:
        found = {}
        for rank in ranks:
            key = self._key(rank, "hello")
            if self.store.check([key]):
                found[rank] = _small_json(bytes(self.store.get(key)))
        return {rank: value for rank, value in found.items() if value}

    def publish(self, rank: int, row: dict[str, Any], report: Report) -> None:
        self.store.set(self._key(rank, "report"), encode_report(report))
        self.store.set(self._key(rank, "row"), json.dumps(row, allow_nan=False).encode())
        self.store.add(f"{self.prefix}/count", 1)

    def arrived(self, pending: set[int]) -> set[int]:
        """Those of ``pending`` whose row is in the store now (never waits)."""
        count = int(self.store.add(f"{self.prefix}/count", 0))
        if count <= self._count_seen:
            return set()
        self._count_seen = count
        return {r for r in pending if self.store.check([self._key(r, "row")])}

    def row(self, rank: int) -> dict[str, Any] | None:
        value = _small_json(bytes(self.store.get(self._key(rank, "row"))))
        if value is None:
            raise VramscopeError("not a row")
        return value

    def report(self, rank: int) -> Report | None:
        key = self._key(rank, "report")
        if not self.store.check([key]):
            return None
        return decode_report(bytes(self.store.get(key)))

    def forget(self, ranks: list[int]) -> None:
        """Delete what the ranks published, so the store does not keep it."""
        for rank in ranks:
            for part in ("hello", "row", "report"):
                with contextlib.suppress(Exception):
                    self.store.delete_key(self._key(rank, part))
        with contextlib.suppress(Exception):
            self.store.delete_key(f"{self.prefix}/count")


class FileChannel:
    """Reports as files ``rank-N.json`` (each rank's full report) in a private directory;
    a file from another job (its ``distributed.job`` differs) is left alone."""

    name = "files"

    def __init__(self, directory: PrivateDir, job: str) -> None:
        self.dir = directory
        self.job = job
        self._data: dict[int, dict[str, Any]] = {}  # rank -> its report's JSON form
        self._seen: dict[str, tuple[int, int]] = {}  # name -> (mtime_ns, size) read

    def hello(self, rank: int, data: dict[str, Any]) -> None:
        self.dir.write(f"hello-{rank}.json", json.dumps({**data, "job": self.job}).encode())

    def hellos(self, ranks: set[int]) -> dict[int, dict[str, Any]]:
        found = {}
        for rank in ranks:
            raw = self.dir.read(f"hello-{rank}.json", limit=MAX_ROW_BYTES)
            value = _small_json(raw) if raw is not None else None
            if value and value.get("job") == self.job:
                found[rank] = value
        return found

    def publish(self, rank: int, row: dict[str, Any], report: Report) -> None:
        del row  # the file is the report; its row is derived from it
        self.dir.write(rank_file(rank), report.to_json().encode("utf-8") + b"\n")
        self.dir.remove(f"hello-{rank}.json")

    def arrived(self, pending: set[int]) -> set[int]:
        found = set()
        names = set(self.dir.names())
        for rank in pending:
            name = rank_file(rank)
            if name not in names:
                continue
            try:
                info = os.stat(name, dir_fd=self.dir.fd, follow_symlinks=False)
            except OSError:
                continue
            mark = (info.st_mtime_ns, info.st_size)
            if self._seen.get(name) == mark:
                continue  # read before: another job's
            self._seen[name] = mark
            raw = self.dir.read(name)
            try:
                data = json.loads(raw.decode("utf-8")) if raw is not None else None
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            section = data.get("distributed") if isinstance(data, dict) else None
            ours = isinstance(section, dict) and section.get("job") == self.job
            if ours and section.get("rank") == rank:
                self._data[rank] = data
                found.add(rank)
        return found

    def row(self, rank: int) -> dict[str, Any] | None:
        from vramscope.distributed.gather import row_from_data, row_to_dict

        return row_to_dict(row_from_data(self._data[rank]))

    def report(self, rank: int) -> Report | None:
        data = self._data.get(rank)
        return Report.from_dict(data) if data is not None else None

    def forget(self, ranks: list[int]) -> None:
        """Drop the reports read, and the hellos of ranks that never reported."""
        self._data.clear()
        for rank in ranks:
            self.dir.remove(f"hello-{rank}.json")


def group_store() -> Any | None:
    """The store of the default process group, when the script left one initialised."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def agent_store(address: tuple[str, int], timeout_s: float = 3.0) -> Any | None:
    """torchrun's store, as a client (what its workers connect to when they make a group)."""
    try:
        import torch.distributed as dist

        return dist.TCPStore(
            address[0],
            address[1],
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except Exception:
        return None
