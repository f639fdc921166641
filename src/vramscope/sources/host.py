"""Host memory from psutil: this process tree's RSS and the machine's totals."""

from __future__ import annotations

import os
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


class ProcessTreeRss:
    """RSS of a process and its children (DataLoader workers), read cheaply and repeatedly.

    Children are re-listed every ``relist_every`` reads and after ``relist_soon()``; a child that ended between
    two reads is skipped. Shared pages are counted once per process, as ``ps`` does.
    """

    def __init__(self, pid: int | None = None, relist_every: int = 50) -> None:
        self._root = psutil.Process(pid or os.getpid())
        self._children: list[psutil.Process] = []
        self._relist_every = relist_every
        self._reads = 0

    def relist_soon(self) -> None:
        """Children may have started (DataLoader workers): list them at the next read.

        Listing walks every process of the machine, so it is done rarely otherwise."""
        self._reads = 0

    def read(self) -> int:
        if self._reads % self._relist_every == 0:
            try:
                self._children = self._root.children(recursive=True)
            except psutil.Error:
                self._children = []
        self._reads += 1
        total = self._root.memory_info().rss
        for child in self._children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                continue
        return total

    @property
    def workers(self) -> int:
        return len(self._children)
