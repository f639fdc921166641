"""The process tree's RSS as the sampler reads it: the same bytes psutil gives, children
counted while they live, no descriptor left behind."""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import time

import psutil
import pytest

from vramscope.sources.host import ProcessTreeRss

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _hold(megabytes: int, ready, done) -> None:  # type: ignore[no-untyped-def]
    block = bytearray(megabytes << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    ready.set()
    done.wait(30)


def _statm_fds() -> int:
    """Descriptors of this process open on some process's ``statm``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        count += target.endswith("/statm")
    return count


def test_rss_of_this_process_is_what_psutil_reads() -> None:
    reader = ProcessTreeRss()
    before = psutil.Process().memory_info().rss
    read = reader.read()
    after = psutil.Process().memory_info().rss
    assert min(before, after) - (1 << 20) <= read <= max(before, after) + (1 << 20)


@linux_only
def test_a_child_counts_while_it_lives_and_not_after() -> None:
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    child = context.Process(target=_hold, args=(64, ready, done))
    child.start()
    try:
        assert ready.wait(60)
        reader = ProcessTreeRss()
        me = psutil.Process()
        with_child = reader.read()
        # the child, and the start method's own helper process
        tree = [me, *me.children(recursive=True)]
        expected = sum(process.memory_info().rss for process in tree)
        child_rss = psutil.Process(child.pid).memory_info().rss
        assert reader.workers == len(tree) - 1 >= 1
        assert child_rss > 64 << 20
        assert abs(with_child - expected) < 8 << 20
        done.set()
        child.join(30)
        # not listed again yet: the ended child reads as nothing, never as another process
        without = reader.read()
        assert without < with_child - (48 << 20)
    finally:
        done.set()
        child.join(30)


@linux_only
def test_reads_hold_no_descriptor_beyond_the_reader() -> None:
    gc.collect()  # readers left by earlier tests close theirs
    baseline = _statm_fds()
    reader = ProcessTreeRss(relist_every=3)
    for _ in range(20):  # relisting closes what the last listing opened
        reader.read()
    # this process's statm and one per child (a helper left by another test)
    children = len(psutil.Process().children(recursive=True))
    assert baseline < _statm_fds() <= baseline + 1 + children
    del reader
    gc.collect()
    assert _statm_fds() == baseline


@linux_only
def test_children_and_grandchildren_are_listed_as_psutil_lists_them() -> None:
    # a shell whose own child sleeps: a grandchild of this process
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        me = psutil.Process()
        for _ in range(100):  # until the shell has started its child
            tree = me.children(recursive=True)
            if any(p.ppid() == shell.pid for p in tree):
                break
            time.sleep(0.05)
        reader = ProcessTreeRss()
        reader.read()
        expected = {p.pid for p in me.children(recursive=True)}
        assert shell.pid in expected and len(expected) >= 2
        assert reader.workers == len(expected)
    finally:
        for p in psutil.Process(shell.pid).children(recursive=True):
            p.kill()
        shell.kill()
        shell.wait(10)
