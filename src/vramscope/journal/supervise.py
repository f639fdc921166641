"""``vramscope run``'s two processes: the script runs in a child, forked before torch is
imported (a millisecond or two, nothing loaded twice); the parent waits for it, passes on the
signals meant for it, and when it dies without writing its report (SIGKILL, the kernel's OOM
killer, a segfault, ``os._exit``), makes the report from its journal. Then the parent ends
as the child did: with its exit code, or killed by the same signal (a shell shows 137 for
SIGKILL, 139 for a segfault), so that ``vramscope run`` still stands in for ``python``.

Signals: a terminal's Ctrl-C, and a scheduler or ``timeout`` signalling the process group,
reach both processes; ``kill PID``, ``docker stop`` and most job launchers reach the parent
alone. The parent cannot tell these apart, so the child tells it: the child's interpreter
writes each signal it receives to a pipe (``signal.set_wakeup_fd``, done by the interpreter's
own C handler the moment the signal arrives, whatever the script's handlers do), and the
parent passes a signal on only when the child did not get it within ``ACK_WAIT_S``. A
script never sees one signal twice, and a second Ctrl-C or SIGTERM is still a second one.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from vramscope.journal import files
from vramscope.journal.ending import CORE_DUMPING, Ending, OomCounter, oom_kill_counter

REPORTED = 0xFF  # sent by the child once its report is written (no signal has this number)
OWN = 0xFE  # sent by the child before a signal it sends itself (no signal has this number)
ACK_WAIT_S = 0.25  # how long a signal the parent got waits for the child's word that it got it
MATCH_S = 1.0  # a signal both got is acknowledged within this long of the parent's
FORWARDED = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def why_not_supervised() -> str | None:
    """Why the script cannot run in a child here (None: it can): no ``fork`` (Windows), or
    this process already runs threads or torch (a test calling the command line in-process),
    which a fork would copy half-made."""
    if not hasattr(os, "fork") or sys.platform == "win32":
        return "this system has no fork()"
    if "torch" in sys.modules or threading.active_count() > 1:
        return "vramscope runs inside another program"
    return None


class Child:
    """The script's side of the two processes."""

    def __init__(self, journal: Path, ack: int) -> None:
        self.journal = journal
        self._ack = ack

    def reported(self) -> None:
        """The report is written: the parent leaves the journal alone (and removes it)."""
        with contextlib.suppress(OSError):
            os.write(self._ack, bytes([REPORTED]))


def supervise(journal: Path, on_death: Callable[[Ending], None]) -> Child:
    """Fork. In the child, return (it runs the script, writing ``journal``); the parent
    never returns: it waits, calls ``on_death`` when the child ended without writing its
    report (to make it from the journal), and ends as the child did."""
    before = oom_kill_counter()
    ack_r, ack_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(ack_r)
        _become_child(ack_w, parent)
        return Child(journal, ack_w)
    os.close(ack_w)
    waited = _wait(pid, ack_r)
    ending = Ending.from_wait_status(waited.status, waited.at, before, oom_kill_counter())
    if waited.reported:
        files.remove(journal)
    else:
        try:
            on_death(ending)
        except Exception as exc:  # the exit code is the script's, whatever happens here
            print(f"vramscope: no report was made from the journal: {exc}", file=sys.stderr)
    end_as(ending)


_own_ack: list[int] = []  # in the child: the pipe its signals are told through


def send_to_self(signum: int) -> None:
    """Send this process ``signum`` again (a signal put off until the user's code runs). In
    ``vramscope run``'s child the parent is told first that it is the child's own, so that
    it is not taken for a signal from outside: one that came late would make the parent
    take the user's next signal for this one, and not pass it on."""
    for ack in _own_ack:
        with contextlib.suppress(OSError):
            os.write(ack, bytes([OWN, signum]))
    os.kill(os.getpid(), signum)


def _become_child(ack: int, parent: int) -> None:
    """The child's start: every signal it gets is told to the parent through ``ack``."""
    os.set_blocking(ack, False)
    _own_ack.append(ack)
    signal.set_wakeup_fd(ack, warn_on_full_buffer=False)

    def forget() -> None:  # a process the script forks (a DataLoader worker) tells nothing
        _own_ack.clear()
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        with contextlib.suppress(OSError):
            os.close(ack)

    os.register_at_fork(after_in_child=forget)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the parent gone: stop, writing the report
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl (False elsewhere, or when it fails)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@dataclass
class _Waited:
    status: int
    at: float
    reported: bool


def _drain(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except (BlockingIOError, InterruptedError):
            return data
        if not chunk:
            return data
        data += chunk


def _nothing(_signum: int, _frame: object) -> None:
    """The parent's handler: the signal is read from the wakeup pipe instead."""


def _wait(pid: int, ack: int) -> _Waited:
    """Wait for the child, passing on the signals it did not get."""
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w, ack):
        os.set_blocking(fd, False)
    caught = [*FORWARDED, signal.SIGCHLD]
    previous = {signum: signal.signal(signum, _nothing) for signum in caught}
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    relay = _Relay(lambda signum: os.kill(pid, signum))
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            timeout = relay.next_decision(time.monotonic())
            with contextlib.suppress(InterruptedError):
                select.select([wake_r, ack], [], [], timeout)
            now = time.monotonic()
            relay.got(now, [s for s in _drain(wake_r) if s != signal.SIGCHLD])
            relay.acknowledged(now, _drain(ack))
            relay.decide(now)
        at = time.time()
        relay.acknowledged(time.monotonic(), _drain(ack))
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for fd in (wake_r, wake_w, ack):
            os.close(fd)
        # the report may still be made: signals now wait until the parent ends
        for signum in caught:
            if signum != signal.SIGCHLD:
                signal.signal(signum, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, previous[signal.SIGCHLD] or signal.SIG_DFL)
    return _Waited(status=status, at=at, reported=relay.reported)


class _Relay:
    """Which signals the parent got must be passed on to the child: those the child did
    not acknowledge within ``ACK_WAIT_S`` (pure bookkeeping, times from the caller)."""

    def __init__(self, send: Callable[[int], None]) -> None:
        self.send = send
        self.reported = False
        self.pending: list[tuple[float, int]] = []  # signals the parent got, undecided
        self.direct: list[tuple[float, int]] = []  # the child's, not matched yet
        self.sent: list[tuple[float, int]] = []  # passed on, not acknowledged yet
        # when a signal passed on was acknowledged: the same number again within half of
        # ACK_WAIT_S is the same burst (the script's processes, a handler raising it again),
        # not a new signal the child got by itself
        self.burst: dict[int, float] = {}
        self.own: dict[int, int] = {}  # signals the child said it sends itself, not seen yet
        self._announced = False  # the last byte read was OWN: a signal number follows

    def got(self, now: float, signums: list[int] | bytes) -> None:
        self.pending += [(now, s) for s in signums]

    def acknowledged(self, now: float, data: bytes) -> None:
        for value in data:
            if self._announced:  # the child sends itself this one: not from outside
                self._announced = False
                self.own[value] = self.own.get(value, 0) + 1
                continue
            if value == OWN:
                self._announced = True
                continue
            if value == REPORTED:
                self.reported = True
                continue
            if self.own.get(value):
                self.own[value] -= 1
                continue
            sent = next((i for i, (_, s) in enumerate(self.sent) if s == value), None)
            if sent is not None:
                del self.sent[sent]  # the child got what was passed on
                self.burst[value] = now
            elif now - self.burst.get(value, -1.0) < ACK_WAIT_S / 2:
                continue  # more of the burst of what was passed on
            else:
                self.direct.append((now, value))

    def next_decision(self, now: float) -> float | None:
        """Seconds until a pending signal must be decided (None: nothing pending)."""
        if not self.pending:
            return None
        return max(0.0, min(t for t, _ in self.pending) + ACK_WAIT_S - now)

    def decide(self, now: float) -> None:
        recent = now - MATCH_S
        self.direct = [(t, s) for t, s in self.direct if t >= recent]
        self.sent = [(t, s) for t, s in self.sent if t >= recent]
        undecided = []
        for t, signum in self.pending:
            match = next(
                (i for i, (ta, s) in enumerate(self.direct) if s == signum and ta >= t - MATCH_S),
                None,
            )
            if match is not None:  # the child got it too (and its workers: one burst)
                at = self.direct[match][0]
                self.direct = [
                    (ta, s)
                    for ta, s in self.direct
                    if s != signum or abs(ta - at) >= ACK_WAIT_S / 2
                ]
            elif now - t >= ACK_WAIT_S:
                with contextlib.suppress(ProcessLookupError):
                    self.send(signum)
                self.sent.append((now, signum))
            else:
                undecided.append((t, signum))
        self.pending = undecided


def end_as(ending: Ending) -> NoReturn:
    """End this process as the child ended: its exit code, or killed by its signal (without
    a core dump of this process)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signum = ending.signal
    if signum is None:
        sys.exit(ending.code or 0)
    if signum in CORE_DUMPING and not _prctl(_PR_SET_DUMPABLE, 0):
        sys.exit(ending.exit_code)
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(0.5)  # a signal whose default is to be ignored: exit as a shell would say
    sys.exit(ending.exit_code)


__all__ = ["Child", "Ending", "OomCounter", "supervise", "why_not_supervised"]
