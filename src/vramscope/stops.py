"""Ctrl-C and stop signals while vramscope works on its own (an estimate, a fit, a comparison):
the command stops, says so, and keeps what it had.

SIGINT raises KeyboardInterrupt, as Python's own handler does; SIGTERM and SIGHUP (a
scheduler, ``timeout``, ``kill``, a closed terminal) raise :class:`Stopped`. Each signal is
also noted, so that one swallowed on the way (Python ignores an exception raised inside an
import's clean-up) still ends the command as stopped. Code that has a partial answer attaches
it to the exception with :func:`keep_partial`; the command line writes it where ``--json``
asked. No torch here: the command line installs the handlers before it imports a verb.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

# what a scheduler, `timeout`, `kill` or a closed terminal send to stop a job
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGHUP) arrived. A BaseException, as KeyboardInterrupt is, so
    that ``except Exception`` lets it pass."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process killed by this signal: 128 + its number."""
        return 128 + self.signum


def signal_of(exc: BaseException) -> tuple[str, int]:
    """(the signal's name, the exit code) of an interruption: ``("SIGINT", 130)`` for
    Ctrl-C, ``("SIGTERM", 143)``, ``("SIGHUP", 129)``."""
    if isinstance(exc, Stopped):
        return exc.signal_name, exc.exit_code
    return "SIGINT", 128 + signal.SIGINT


def said(exc: BaseException) -> str:
    """How a report and the command line say it: ``interrupted (Ctrl-C)``, ``stopped by
    SIGTERM``."""
    name, _ = signal_of(exc)
    return "interrupted (Ctrl-C)" if name == "SIGINT" else f"stopped by {name}"


class StopHandlers:
    """While active (main thread only), SIGINT raises KeyboardInterrupt and the first
    SIGTERM or SIGHUP raises :class:`Stopped` (a second one ends the process at once); each
    is noted in ``received``. The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.received: BaseException | None = None
        self._previous: dict[int, Any] = {}
        self._unraisable: Any = None

    def __enter__(self) -> StopHandlers:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, *STOP_SIGNALS):
                self._previous[signum] = signal.signal(signum, self._handle)
            # an interruption raised where Python cannot pass it on (an import's clean-up)
            # is noted here and raised again later (``check``): no traceback for it
            self._unraisable = sys.unraisablehook
            sys.unraisablehook = self._quiet_unraisable
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._unraisable is not None:
            sys.unraisablehook = self._unraisable
            self._unraisable = None
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _quiet_unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, (KeyboardInterrupt, Stopped)):
            return
        (self._unraisable or sys.__unraisablehook__)(unraisable)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            self.received = self.received or KeyboardInterrupt()
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
        stopped = Stopped(signum)
        self.received = self.received or stopped
        raise stopped


_ACTIVE: list[StopHandlers] = []


def check() -> None:
    """Raise again an interruption that was noted but swallowed on the way (Python ignores
    an exception raised inside an import's clean-up): called before each new piece of work
    (an estimate), so that Ctrl-C stops the command even then."""
    for handlers in _ACTIVE:
        received = handlers.received
        if isinstance(received, Stopped):
            raise Stopped(received.signum)
        if received is not None:
            raise KeyboardInterrupt


def keep_partial(exc: BaseException, make: Callable[[], Any]) -> None:
    """Attach what the interrupted work had (``make()``: a partial Report, or None) to the
    exception, unless something nearer to the work attached it already."""
    if getattr(exc, "partial_report", None) is None:
        try:
            exc.partial_report = make()  # type: ignore[attr-defined]
        except Exception:  # a partial answer is a courtesy: never hide the interruption
            exc.partial_report = None  # type: ignore[attr-defined]


@contextlib.contextmanager
def partial_on_stop(make: Callable[[], Any]) -> Iterator[None]:
    """Within: Ctrl-C or a stop signal leaves ``make()`` (what was done so far, as a Report)
    on the exception on its way out."""
    try:
        yield
    except (KeyboardInterrupt, Stopped) as exc:
        keep_partial(exc, make)
        raise
