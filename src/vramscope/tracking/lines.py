"""Line markers for ``--detail lines``: which line of the profiled code runs, and host RSS there.

Only the profiled code pays: with ``sys.monitoring`` (Python 3.12+) every other code
location is disabled at its first event; older Pythons use ``sys.settrace``, whose global
function returns at once for code that is not profiled. Each profiled line appends one
marker (``["l", code, line, rss, maxrss]``) to the recorder's log; the analysis turns the
markers and the allocations between them into memory_profiler-style tables.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import sys
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vramscope.tracking.events import CALL, LINE, RETURN

MAX_SOURCE_LINES = 2000


def _rss_reader() -> Callable[[], int]:
    """This process's RSS in bytes, read as cheaply as the platform allows."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        page = os.sysconf("SC_PAGE_SIZE")

        def read_statm() -> int:
            return int(os.pread(fd, 128, 0).split()[1]) * page

        read_statm()
        return read_statm
    except (OSError, ValueError, AttributeError):
        import psutil

        process = psutil.Process()
        return lambda: process.memory_info().rss


def _maxrss_reader() -> Callable[[], int]:
    """The process's peak RSS so far (bytes); 0 where the platform has no getrusage."""
    try:
        import resource
    except ImportError:  # Windows
        return lambda: 0
    scale = 1 if sys.platform == "darwin" else 1024

    def read() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale

    return read


def _nested_codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested_codes(const)


class LineTargets:
    """What to profile: functions (and the functions nested in them), files, or names."""

    def __init__(self, targets: Iterable[Any]) -> None:
        self.codes: set[types.CodeType] = set()
        self.files: set[str] = set()
        self.names: set[str] = set()
        for target in targets:
            self.add(target)

    def add(self, target: Any) -> None:
        if isinstance(target, types.CodeType):
            self.codes.update(_nested_codes(target))
            return
        if callable(target) and not isinstance(target, str):
            fn = inspect.unwrap(target)
            fn = getattr(fn, "__func__", fn)
            code = getattr(fn, "__code__", None)
            if code is None and isinstance(fn, type):
                for member in vars(fn).values():
                    member = getattr(member, "__func__", member)
                    if isinstance(member, types.FunctionType):
                        self.codes.update(_nested_codes(member.__code__))
                return
            if code is not None:
                self.codes.update(_nested_codes(code))
            return
        text = str(target)
        if text.endswith(".py") or os.sep in text or Path(text).is_file():
            self.files.add(os.path.realpath(text))
        else:
            self.names.add(text)

    def __bool__(self) -> bool:
        return bool(self.codes or self.files or self.names)

    def matches(self, code: types.CodeType) -> bool:
        if not code.co_flags & inspect.CO_NEWLOCALS and code.co_name != "<module>":
            return False  # a class body: its lines are the method definitions
        if code in self.codes:
            return True
        if self.names and (
            code.co_name in self.names or getattr(code, "co_qualname", code.co_name) in self.names
        ):
            return True
        if self.files:
            filename = code.co_filename
            if filename in self.files:
                return True
            if not filename.startswith("<") and os.path.realpath(filename) in self.files:
                return True
        return False


class LineTracer:
    """Appends line markers for the target code through ``mark`` while started."""

    def __init__(self, mark: Callable[[list[Any]], None], targets: LineTargets) -> None:
        self._mark = mark
        self.targets = targets
        self.codes: list[types.CodeType] = []
        self._index: dict[types.CodeType, int] = {}
        self._verdict: dict[types.CodeType, bool] = {}
        self._rss = _rss_reader()
        self._maxrss = _maxrss_reader()
        self._main = threading.get_ident()
        self._tool: int | None = None
        self._previous_trace: Any = None
        self._running = False
        self.mode = "sys.monitoring" if hasattr(sys, "monitoring") else "sys.settrace"

    # ---- which code counts ----------------------------------------------------------------
    def _code_index(self, code: types.CodeType) -> int | None:
        verdict = self._verdict.get(code)
        if verdict is None:
            verdict = self._verdict[code] = self.targets.matches(code)
            if verdict:
                self._index[code] = len(self.codes)
                self.codes.append(code)
        return self._index[code] if verdict else None

    # ---- start and stop -------------------------------------------------------------------
    def start(self) -> LineTracer:
        if self._running or not self.targets:
            return self
        if self.mode == "sys.monitoring":
            self._start_monitoring()
        else:
            self._previous_trace = sys.gettrace()
            sys.settrace(self._global_trace)
        self._running = True
        return self

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        if self.mode == "sys.monitoring":
            self._stop_monitoring()
        else:
            sys.settrace(self._previous_trace)

    # ---- sys.monitoring (3.12+) ---------------------------------------------------------------
    def _start_monitoring(self) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        tool = next((i for i in (4, 3, 5, 2, 1, 0) if mon.get_tool(i) is None), None)
        if tool is None:
            raise RuntimeError("every sys.monitoring tool id is taken; cannot profile lines")
        mon.use_tool_id(tool, "vramscope")
        self._tool = tool
        disable = mon.DISABLE
        ev = mon.events
        code_index = self._code_index
        mark, rss, maxrss, main = self._mark, self._rss, self._maxrss, self._main
        get_ident = threading.get_ident

        def on_line(code: types.CodeType, line: int) -> Any:
            index = code_index(code)
            if index is None:
                return disable
            if get_ident() == main:
                mark([LINE, index, line, rss(), maxrss()])
            return None

        def on_start(code: types.CodeType, offset: int) -> Any:
            index = code_index(code)
            if index is None:
                return disable
            if get_ident() == main:
                mark([CALL, index])
            return None

        def on_return(code: types.CodeType, offset: int, value: Any) -> Any:
            index = code_index(code)
            if index is None:
                return disable
            if get_ident() == main:
                mark([RETURN, index, rss(), maxrss()])
            return None

        mon.restart_events()  # locations a previous session disabled count again
        mon.register_callback(tool, ev.LINE, on_line)
        mon.register_callback(tool, ev.PY_START, on_start)
        mon.register_callback(tool, ev.PY_RETURN, on_return)
        mon.set_events(tool, ev.LINE | ev.PY_START | ev.PY_RETURN)

    def _stop_monitoring(self) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        tool = self._tool
        if tool is None:
            return
        with contextlib.suppress(Exception):
            mon.set_events(tool, 0)
        for event in (mon.events.LINE, mon.events.PY_START, mon.events.PY_RETURN):
            with contextlib.suppress(Exception):
                mon.register_callback(tool, event, None)
        with contextlib.suppress(Exception):
            mon.free_tool_id(tool)
        self._tool = None

    # ---- sys.settrace (3.10, 3.11) --------------------------------------------------------------
    def _global_trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        index = self._code_index(frame.f_code)
        if index is None or threading.get_ident() != self._main:
            return None
        self._mark([CALL, index])
        return self._local_trace

    def _local_trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            index = self._index.get(frame.f_code)
            if index is not None:
                self._mark([LINE, index, frame.f_lineno, self._rss(), self._maxrss()])
        elif event == "return":
            index = self._index.get(frame.f_code)
            if index is not None:
                self._mark([RETURN, index, self._rss(), self._maxrss()])
        return self._local_trace

    # ---- what the report needs ---------------------------------------------------------------
    def code_table(self) -> list[dict[str, Any]]:
        """For each profiled code object: its file, name, first line and source lines."""
        table = []
        for code in self.codes:
            filename = code.co_filename
            name = getattr(code, "co_qualname", code.co_name)
            first = code.co_firstlineno
            lines: dict[str, str] = {}
            if name == "<module>":
                source = linecache.getlines(filename)
                span = range(1, min(len(source), MAX_SOURCE_LINES) + 1)
            else:
                try:
                    block, start = inspect.getsourcelines(code)
                    source = linecache.getlines(filename)
                    span = range(start, min(start + len(block), start + MAX_SOURCE_LINES))
                except (OSError, TypeError):
                    source, span = [], range(0)
            for n in span:
                if 0 < n <= len(source):
                    lines[str(n)] = source[n - 1].rstrip("\n")
            table.append({"file": filename, "function": name, "first_line": first, "source": lines})
        return table
