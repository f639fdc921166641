"""Host memory from psutil: this process tree's RSS and the machine's totals."""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class HostMemory:
    total_bytes: int
    available_bytes: int
    used_bytes: int


def host_memory() -> HostMemory:
    """The machine's memory as the kernel reports it."""
    vm = psutil.virtual_memory()
    return HostMemory(total_bytes=vm.total, available_bytes=vm.available, used_bytes=vm.used)


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _open_statm(pid: int) -> int | None:
    """A descriptor of ``/proc/<pid>/statm`` (Linux), or None. Held open, it keeps reading
    the process it was opened for: a reused PID is never read instead."""
    try:
        return os.open(f"/proc/{pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _statm_rss(fd: int) -> int | None:
    """The RSS in bytes from an open ``statm`` (one system call), or None once it ended."""
    try:
        fields = os.pread(fd, 256, 0).split()
        return int(fields[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


def _children_files() -> bool:
    """Whether this kernel lists each thread's children in ``/proc`` (Linux, nearly always)."""
    global _HAS_CHILDREN_FILES
    if _HAS_CHILDREN_FILES is None:
        pid = os.getpid()
        _HAS_CHILDREN_FILES = os.path.exists(f"/proc/{pid}/task/{pid}/children")
    return _HAS_CHILDREN_FILES


_HAS_CHILDREN_FILES: bool | None = None


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, from each of its threads' ``/proc`` ``children`` file.

    psutil finds children by reading the ``stat`` of every process on the machine (5-9 ms
    with a hundred processes, more on a busy node); this reads one small file per thread of
    the tree (tens of microseconds). A child that starts meanwhile shows at the next listing,
    as with psutil; one that ended is left out."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # it ended meanwhile
            continue
        for tid in threads:
            try:
                fd = os.open(f"/proc/{parent}/task/{tid}/children", os.O_RDONLY)
            except OSError:  # the thread ended meanwhile
                continue
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                continue
            finally:
                os.close(fd)
            for word in data.split():
                found.append(int(word))
                todo.append(int(word))
    return found


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class ProcessTreeRss:
    """RSS of a process and its children (DataLoader workers), read cheaply and repeatedly.

    Children are re-listed every ``relist_every`` reads and after ``relist_soon()``; a child that ended between
    two reads is skipped. Shared pages are counted once per process, as ``ps`` does.

    On Linux each process is one ``pread`` of its ``statm``, held open, so that a read on
    the sampler's thread gives the interpreter lock back once per process, not once per
    file operation (each time it takes the lock back, a busy training thread must stop),
    and the children are listed from the tree's own ``/proc`` entries. Elsewhere psutil
    lists and reads them.
    """

    def __init__(self, pid: int | None = None, relist_every: int = 50) -> None:
        self._pid = pid or os.getpid()
        self._root: psutil.Process | None = None  # psutil's, made when first needed
        self._children: list[psutil.Process] = []  # psutil's (without /proc)
        self._workers = 0
        self._relist_every = relist_every
        self._reads = 0
        self._root_fd: int | None = None
        self._child_fds: list[int] = []  # one per child still readable, in listing order
        self._fds: list[int] = []  # every descriptor held, closed with this object
        weakref.finalize(self, _close_all, self._fds)

    def relist_soon(self) -> None:
        """Children may have started (DataLoader workers): list them at the next read.

        Listing reads /proc (or, without it, walks every process of the machine), so it is
        done rarely otherwise."""
        self._reads = 0

    def _psutil_root(self) -> psutil.Process:
        if self._root is None:
            self._root = psutil.Process(self._pid)
        return self._root

    def _relist(self) -> None:
        _close_all(self._fds)
        self._child_fds = []
        self._children = []
        self._root_fd = _open_statm(self._pid)
        if self._root_fd is None:  # no /proc: psutil lists and reads them
            try:
                self._children = self._psutil_root().children(recursive=True)
            except psutil.Error:
                self._children = []
            self._workers = len(self._children)
            return
        self._fds.append(self._root_fd)
        if _children_files():
            pids = _descendants(self._pid)
        else:
            try:
                pids = [child.pid for child in self._psutil_root().children(recursive=True)]
            except psutil.Error:
                pids = []
        self._workers = len(pids)
        for pid in pids:
            fd = _open_statm(pid)
            if fd is not None:
                self._child_fds.append(fd)
                self._fds.append(fd)

    def read(self) -> int:
        if self._reads % self._relist_every == 0:
            self._relist()
        self._reads += 1
        if self._root_fd is not None:
            total = _statm_rss(self._root_fd)
            if total is not None:
                for fd in self._child_fds:
                    total += _statm_rss(fd) or 0  # a child that ended: 0
                return total
        total = self._psutil_root().memory_info().rss
        for child in self._children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                continue
        return total

    @property
    def workers(self) -> int:
        return self._workers
