"""Runs the zoo sweep's workloads in forked child processes: a timeout per workload, several children at a time.

The parent imports the heavy libraries once; each child is forked from it (fast, and a
crash, a hang or a leak stays in the child). A child runs one or several workloads one
after the other and sends each result through a pipe as soon as it has it; a workload that
runs past its timeout, or kills its child, is recorded as such and the child's remaining
workloads go to a new child. ``admit`` lets the caller hold a workload back until it fits
(GPU memory shared by the children).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

Item = dict[str, Any]
Result = dict[str, Any]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _child(
    target: Callable[[Item, Callable[[Result], None]], Result], items: list[Item], conn: Any
) -> None:
    """In the child: each item in turn, its messages and its result sent as they come."""
    os.setpgrp()  # its own group: a kill reaches what it starts too

    def note(partial: Result) -> None:
        conn.send(("note", partial))

    for item in items:
        conn.send(("start", item["id"]))
        try:
            result = target(item, note)
        except BaseException as exc:  # the harness's own failure: say where
            result = {"harness_error": f"{type(exc).__name__}: {first_line(exc)}"[:300]}
            result["traceback"] = traceback.format_exc(limit=6)[-2000:]
        conn.send(("done", result))
    conn.close()


def run_child(
    target: Callable[[Item, Callable[[Result], None]], Result],
    items: list[Item],
    timeout: float,
    on_result: Callable[[Item, Result], None],
) -> list[Item]:
    """Run ``items`` in one forked child; returns the items it did not reach (after one
    timed out or the child died). ``on_result(item, result)`` is called for every item
    finished, timed out or lost with its child; notes sent before (``note(partial)``) are
    merged into the result."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(target, items, send), daemon=False)
    proc.start()
    send.close()
    by_id = {item["id"]: item for item in items}
    done: set[str] = set()
    current: str | None = None
    partial: Result = {}
    started = time.monotonic()
    failure = None
    while len(done) < len(items):
        left = timeout - (time.monotonic() - started) if current else timeout
        if left <= 0 or not receive.poll(max(left, 0)):
            failure = f"timeout after {timeout:.0f} s"
            break
        try:
            kind, payload = receive.recv()
        except (EOFError, OSError):
            failure = "crashed"
            break
        if kind == "start":
            current, partial, started = payload, {}, time.monotonic()
        elif kind == "note":
            partial.update(payload)
        elif kind == "done" and current is not None:
            on_result(by_id[current], {**partial, **payload})
            done.add(current)
            current, partial = None, {}
    if failure is not None:
        _stop(proc)
    proc.join(30)
    if proc.is_alive():
        _stop(proc)
        proc.join()
    receive.close()
    if failure is not None and current is not None:
        if failure == "crashed":
            code = proc.exitcode
            failure = (
                f"crashed (exit {code})"
                if code is None or code >= 0
                else (f"crashed ({signal.Signals(-code).name})")
            )
        on_result(by_id[current], {**partial, "lost": failure})
        done.add(current)
    return [item for item in items if item["id"] not in done]


def _stop(proc: Any) -> None:
    """Kill a child and what it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def run_all(
    target: Callable[[Item, Callable[[Result], None]], Result],
    items: list[Item],
    on_result: Callable[[Item, Result], None],
    jobs: int = 2,
    timeout: float = 600,
    per_child: int = 1,
    admit: Callable[[list[Item], bool], bool] | None = None,
    release: Callable[[list[Item]], None] | None = None,
    deadline: float | None = None,
) -> list[Item]:
    """Every item through forked children, ``jobs`` at a time, ``per_child`` items each.
    ``admit(chunk, force)`` says whether a chunk may start now, and books it when it may
    (``force``: nothing else runs, it must), else it waits for a running one to end;
    ``release(chunk)`` says that it ended. No chunk starts after ``deadline``
    (``time.monotonic()``); returns the items never started."""
    queue = collections.deque(items)
    lock = threading.Condition()
    running = 0

    def take() -> list[Item] | None:
        nonlocal running
        with lock:
            while True:
                if not queue or (deadline is not None and time.monotonic() > deadline):
                    return None
                chunk = [queue[i] for i in range(min(per_child, len(queue)))]
                if admit is None or admit(chunk, running == 0):
                    for _ in chunk:
                        queue.popleft()
                    running += 1
                    return chunk
                lock.wait(5)

    def worker() -> None:
        nonlocal running
        while True:
            chunk = take()
            if chunk is None:
                return
            try:
                rest = run_child(target, chunk, timeout, on_result)
            finally:
                with lock:
                    running -= 1
                    if release is not None:
                        release(chunk)
                    lock.notify_all()
            if rest:
                with lock:
                    queue.extendleft(reversed(rest))
                    lock.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(jobs, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return list(queue)
