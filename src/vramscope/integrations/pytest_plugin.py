"""pytest plugin: the ``vramscope`` fixture and the ``limit_gpu_memory``/``check_gpu_leaks`` markers.

Loaded through the ``pytest11`` entry point. It imports torch only for a test that uses
one of them, so installing vramscope costs other test suites nothing.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest

MARKERS = (
    "limit_gpu_memory(limit, estimate=None, gpu=None, batch_size=None, precision=None, "
    "accumulate=None): fail when the test's peak allocated CUDA memory exceeds limit "
    "(like '2 GiB'); on a machine without CUDA, check vramscope's estimate of the workload "
    "`estimate` on the GPU `gpu` instead, or skip",
    "check_gpu_leaks(repeat=3, tolerance='0 B'): run the test `repeat` times; fail when "
    "CUDA memory allocated after the last run exceeds that after the first by more than "
    "`tolerance`; skip on a machine without CUDA",
)
ESTIMATE_OPTIONS = ("estimate", "gpu", "batch_size", "precision", "accumulate")


@dataclass(frozen=True)
class MemoryLimit:
    limit_bytes: int
    estimate: dict[str, Any] | None  # vramscope.estimate() arguments when no CUDA


@dataclass(frozen=True)
class LeakCheck:
    repeat: int
    tolerance_bytes: int


SESSION = pytest.StashKey[Any]()
LIMIT = pytest.StashKey[MemoryLimit]()
LEAKS = pytest.StashKey[LeakCheck]()
SHOWN = pytest.StashKey[bool]()
ESTIMATES = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "vramscope_journal",
        type="bool",
        default=True,
        help="vramscope: write each tracked test's journal in the user's private directory "
        "(removed when the test ends; `vramscope report --list` lists those of a test "
        "process that died); false: none",
    )


def _journal(config: pytest.Config) -> bool | None:
    """What a tracked test's Session journals: True (the private directory) or None."""
    return True if config.getini("vramscope_journal") else None


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[ESTIMATES] = {}


@pytest.fixture(name="vramscope")
def vramscope_session(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A vramscope Session tracking the test; ``vramscope.report()`` gives its Report.

    Tracking ends with the test's body, and the report goes into the test's output (pytest
    shows it when the test fails, or for every test with ``-rP``). The test's journal is
    written as it runs, in the user's private directory (removed when the test ends): when
    the test's process dies (a segfault, SIGKILL), ``vramscope report --list`` lists it and
    ``vramscope report JOURNAL`` makes its report (the ini option ``vramscope_journal =
    false``: none).
    """
    from vramscope.tracking.session import Session

    node = request.node
    session = Session(
        name=node.nodeid,
        workload={"spec": node.nodeid},
        status=False,
        journal=_journal(request.config),
    )
    node.stash[SESSION] = session
    session.start()
    try:
        yield session
    finally:
        session.stop()  # the test's call already made the report; a failed setup did not


# ---- markers: read and checked before the test runs -------------------------------------
def _marker_error(item: pytest.Item, marker: str, message: str) -> NoReturn:
    pytest.fail(f"@pytest.mark.{marker} on {item.name}: {message}", pytrace=False)


def _read_size(item: pytest.Item, marker: str, text: Any) -> int:
    from vramscope.errors import VramscopeError
    from vramscope.units import parse_size

    try:
        return parse_size(text)
    except VramscopeError as exc:
        message = str(exc)
    _marker_error(item, marker, message)  # outside the except: one line, no chained traceback


def _read_limit(item: pytest.Item, mark: pytest.Mark) -> MemoryLimit:
    name = "limit_gpu_memory"
    kwargs = dict(mark.kwargs)
    args = list(mark.args)
    if "limit" in kwargs:
        args.insert(0, kwargs.pop("limit"))
    if len(args) != 1:
        _marker_error(item, name, 'give one limit, like limit_gpu_memory("2 GiB")')
    unknown = sorted(set(kwargs) - set(ESTIMATE_OPTIONS))
    if unknown:
        _marker_error(
            item, name, f"unknown option {unknown[0]!r}; known: {', '.join(ESTIMATE_OPTIONS)}"
        )
    limit = _read_size(item, name, args[0])
    if limit <= 0:
        _marker_error(item, name, f"the limit must be more than 0, not {args[0]!r}")
    estimate = None
    if "estimate" in kwargs:
        if not isinstance(kwargs.get("batch_size"), int) or kwargs["batch_size"] < 1:
            _marker_error(item, name, "estimate= needs batch_size= (a whole number, 1 or more)")
        estimate = {key: value for key, value in kwargs.items() if value is not None}
    elif kwargs:
        _marker_error(item, name, f"{', '.join(sorted(kwargs))} only go with estimate=WORKLOAD")
    return MemoryLimit(limit, estimate)


def _read_leaks(item: pytest.Item, mark: pytest.Mark) -> LeakCheck:
    name = "check_gpu_leaks"
    signature = inspect.signature(lambda repeat=3, tolerance="0 B": None)
    try:
        bound = signature.bind(*mark.args, **mark.kwargs)
    except TypeError as exc:
        message = f"{exc}; use check_gpu_leaks(repeat=3, tolerance='1 MiB')"
    else:
        message = ""
    if message:
        _marker_error(item, name, message)
    bound.apply_defaults()
    repeat, tolerance = bound.arguments["repeat"], bound.arguments["tolerance"]
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 2:
        _marker_error(item, name, f"repeat must be a whole number, 2 or more, not {repeat!r}")
    return LeakCheck(repeat, _read_size(item, name, tolerance))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    limit = item.get_closest_marker("limit_gpu_memory")
    if limit is not None:
        item.stash[LIMIT] = _read_limit(item, limit)
    leaks = item.get_closest_marker("check_gpu_leaks")
    if leaks is not None:
        item.stash[LEAKS] = _read_leaks(item, leaks)
        if inspect.iscoroutinefunction(getattr(item, "obj", None)):
            _marker_error(item, "check_gpu_leaks", "an async test cannot be repeated here")


# ---- running the test -------------------------------------------------------------------
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _call_test(item: pytest.Function) -> None:
    function = item.obj
    names = inspect.signature(function).parameters
    function(**{name: item.funcargs[name] for name in names if name in item.funcargs})


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """``check_gpu_leaks`` on CUDA: run the test ``repeat`` times, reading allocated memory
    after each run (after a garbage collection, so cycles waiting for it are not leaks)."""
    check = pyfuncitem.stash.get(LEAKS, None)
    if check is None or not _cuda_available():
        return None
    import torch

    allocated: list[int] = []
    for _ in range(check.repeat):
        _call_test(pyfuncitem)
        gc.collect()
        allocated.append(torch.cuda.memory_allocated())
    growth = allocated[-1] - allocated[0]
    if growth > check.tolerance_bytes:
        from vramscope.units import format_bytes

        runs = ", ".join(format_bytes(n) for n in allocated)
        pytest.fail(
            f"check_gpu_leaks: CUDA memory allocated grew by {format_bytes(growth)} from the "
            f"first run to run {check.repeat} (more than the tolerance of "
            f"{format_bytes(check.tolerance_bytes)}); allocated after each run: {runs}",
            pytrace=False,
        )
    return True


@pytest.hookimpl(wrapper=True, specname="pytest_pyfunc_call")
def pytest_pyfunc_call_tracked(pyfuncitem: pytest.Function) -> Iterator[Any]:
    """Track the test's body with the fixture's Session (or one of its own for
    ``limit_gpu_memory`` on CUDA); then check the limit, by measurement or by estimate."""
    limit = pyfuncitem.stash.get(LIMIT, None)
    leaks = pyfuncitem.stash.get(LEAKS, None)
    session = pyfuncitem.stash.get(SESSION, None)
    if limit is None and leaks is None and session is None:
        return (yield)
    cuda = _cuda_available()
    if session is None and limit is not None and cuda:
        from vramscope.tracking.session import Session

        name = pyfuncitem.nodeid
        session = Session(
            name=name, workload={"spec": name}, status=False, journal=_journal(pyfuncitem.config)
        ).start()
    if session is None:
        result = yield
    else:
        try:
            with session.phase("test"):  # so a test made of tensor operations has a peak
                result = yield
        except BaseException as exc:
            session.record_exception(exc)
            _show_report(pyfuncitem, session.report(), "vramscope")
            raise
        report = session.report()
        _show_report(pyfuncitem, report, "vramscope")
        if limit is not None and cuda:
            _check_measured(pyfuncitem, limit, report)
    if limit is not None and not cuda:
        if limit.estimate is None:
            pytest.skip(
                f"limit_gpu_memory not checked: no CUDA device here (the test itself passed); "
                f"give estimate=WORKLOAD, gpu=NAME, batch_size=N to check "
                f"{_size(limit.limit_bytes)} against vramscope's estimate"
            )
        _check_estimated(pyfuncitem, limit)
    if leaks is not None and not cuda:
        pytest.skip(
            "check_gpu_leaks not checked: no CUDA device here (the test ran once and passed)"
        )
    return result


def _size(n: int) -> str:
    from vramscope.units import format_bytes

    return format_bytes(n)


def _check_measured(item: pytest.Function, limit: MemoryLimit, report: Any) -> None:
    peak = report.peak.allocated_bytes or 0  # None: the test never used CUDA
    if peak > limit.limit_bytes:
        where = f" (step {report.peak.step}, {report.peak.phase})" if report.peak.phase else ""
        pytest.fail(
            f"limit_gpu_memory: peak allocated CUDA memory {_size(peak)}{where} exceeds the "
            f"limit of {_size(limit.limit_bytes)}; the report is below",
            pytrace=False,
        )


def _check_estimated(item: pytest.Function, limit: MemoryLimit) -> None:
    import vramscope
    from vramscope.errors import VramscopeError

    options = dict(limit.estimate or {})
    key = tuple(sorted((name, str(value)) for name, value in options.items()))
    cache = item.config.stash[ESTIMATES]
    report = cache.get(key)
    if report is None:
        workload = options.pop("estimate")
        try:
            report = cache[key] = vramscope.estimate(workload, **options)
        except VramscopeError as exc:
            message = f"limit_gpu_memory: cannot estimate {workload!r}: {exc}"
        if report is None:
            pytest.fail(message, pytrace=False)  # outside the except: no chained traceback
    peak = report.peak.allocated_bytes or 0
    if peak > limit.limit_bytes:
        _show_report(item, report, "vramscope estimate")
        gpu = report.device.get("name", "the GPU")
        pytest.fail(
            f"limit_gpu_memory: estimated peak allocated memory {_size(peak)} on {gpu} (no "
            f"CUDA device here) exceeds the limit of {_size(limit.limit_bytes)}; the estimate "
            "is below",
            pytrace=False,
        )


def _show_report(item: pytest.Item, report: Any, title: str) -> None:
    """Put the terminal report into the test's output once (pytest shows it on failure)."""
    if item.stash.get(SHOWN, False):
        return
    item.stash[SHOWN] = True
    import io

    from rich.console import Console

    from vramscope.report.terminal import render

    text = io.StringIO()
    Console(file=text, width=120, color_system=None, force_terminal=False).print(render(report))
    item.add_report_section("call", title, text.getvalue())
