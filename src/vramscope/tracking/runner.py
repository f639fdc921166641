"""Run an unmodified script, or a Workload's steps, under a tracking Session."""

from __future__ import annotations

import builtins
import contextlib
import os
import runpy
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from vramscope.contract import exit_status
from vramscope.errors import VramscopeError
from vramscope.journal.supervise import send_to_self
from vramscope.report.model import Finding, Report
from vramscope.stops import STOP_SIGNALS, Stopped
from vramscope.tracking.session import Session
from vramscope.workload import (
    StepRunner,
    WorkloadSpec,
    build_workload,
    pick_device,
    resolve,
    torch_optimizers,
)


def apply_allocator_config(config: str | None) -> None:
    """Set the allocator options before CUDA starts (both variable names torch reads)."""
    if not config:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(config)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = config
    os.environ["PYTORCH_ALLOC_CONF"] = config


class Terminated(Stopped):
    """A stop signal (SIGTERM, SIGHUP) arrived while tracked code ran.

    Raised in the main thread at the next Python bytecode (after the torch operator that was
    running returns), it unwinds the user's code so that the partial report is still written.
    """


def _folders(*paths: str) -> tuple[str, ...]:
    """Each folder as written and as its real path, with a trailing separator."""
    return tuple({f for p in paths for f in (p + os.sep, os.path.realpath(p) + os.sep)})


_PACKAGE = os.path.dirname(os.path.dirname(__file__))
# vramscope's bookkeeping: the hooks, the session, the attribution and the allocator reads
# (not the workloads and examples it runs, which are the user's code for this purpose)
_BOOKKEEPING = _folders(os.path.join(_PACKAGE, "tracking"), os.path.join(_PACKAGE, "sources"))
# code that vramscope's hooks run through without being the user's: torch and the standard
# library (whose folder holds site-packages: the packages there are the user's)
_TORCH = _folders(os.path.dirname(torch.__file__))
_STDLIB = _folders(sysconfig.get_paths()["stdlib"])
_INSTALLED = _folders(sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])
_RUNNER = {__file__, os.path.realpath(__file__)}
DEFER_S = 0.002  # a signal that came during vramscope's bookkeeping is sent again this late


def _in_bookkeeping(frame: FrameType | None) -> bool:
    """Whether the main thread was stopped inside vramscope's own code called from the
    user's (a hook recording a phase or a step), rather than in the user's code.

    From the innermost frame outwards, torch's and the standard library's frames are passed
    through; the first other frame decides. The runner (which runs the user's script) is not
    bookkeeping."""
    for _ in range(64):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if name in _RUNNER:
            return False
        if name.startswith(_BOOKKEEPING):
            return True
        passes = name.startswith(_TORCH) or (
            name.startswith(_STDLIB) and not name.startswith(_INSTALLED)
        )
        if not passes:
            return False
        frame = frame.f_back
    return False


class StopSignals:
    """While active, SIGTERM and SIGHUP end the tracked code and leave its report.

    The first signal of a kind raises ``Terminated`` while ``armed`` (the user's code runs;
    one that lands in vramscope's own bookkeeping, a hook called from that code, is sent
    again a moment later, so that no record is left half-made), and is only noted
    otherwise (the report is being written: it is finished first); either way that
    signal's default disposition is restored, so a second one ends the process at once.
    Handlers are installed before the user's code runs: a script that installs its own
    replaces them, and its own handling wins. Only the main thread can receive them, so
    elsewhere nothing is installed. The previous handlers come back on exit.
    """

    def __init__(self) -> None:
        self.armed = False
        self.received: Terminated | None = None
        self._previous: dict[int, Any] = {}
        self._deferring = False  # a signal is being put off (its timer starting)
        self._again = False  # and it came back meanwhile
        self._pid = os.getpid()  # a forked child (a multiprocessing worker) is not the run

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def arm(self) -> None:
        """The user's code starts: a signal now raises (one that came before, at once)."""
        if self.received is not None:
            raise self.received
        self.armed = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # a process the script forked (multiprocessing's pool workers, which their pool
            # ends with SIGTERM): the handler it had before vramscope's, as without it
            previous = self._previous.get(signum, signal.SIG_DFL)
            previous = signal.SIG_DFL if previous is None else previous
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
            return
        if self._deferring:
            # the signal sent again came while the timer that sends it was still starting
            # (a loaded machine): send it once more, after that
            self._again = True
            return
        if self.armed and sys.platform != "win32" and _in_bookkeeping(frame):
            # stopped halfway, a hook would leave the session's records torn (a step taken
            # off as current and not yet stored): the same signal comes again in a moment,
            # when the user's code runs
            self._deferring = True
            try:
                self._again = True
                while self._again:
                    self._again = False
                    timer = threading.Timer(DEFER_S, send_to_self, (signum,))
                    timer.daemon = True
                    timer.start()
            finally:
                self._deferring = False
            return
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
        if self.received is None:
            self.received = Terminated(signum)
        if self.armed:
            self.armed = False
            raise self.received


def _print_user_traceback(exc: BaseException, script: Path) -> None:
    """Print the script's traceback as Python would, without vramscope's own frames."""
    tb = exc.__traceback__
    target = str(script.resolve())
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != target:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def run_script(
    script: str | Path, args: list[str], session: Session, stops: StopSignals | None = None
) -> tuple[Report, int]:
    """Run ``script`` with ``args`` as ``__main__`` under ``session``; (report, exit code).

    SIGTERM and SIGHUP end the script as Ctrl-C does: the report says so
    (``exit.status == "terminated"``, ``exit.signal``) and the code is 128 + the signal's
    number (143, 129). ``stops``: handlers installed by the caller, to also cover what it
    does after (writing files); by default they are installed for the run only.
    """
    if stops is None:
        with StopSignals() as own:
            return run_script(script, args, session, own)
    path = Path(script)
    if not path.is_file():
        raise VramscopeError(f"no such script: {path}")
    if path.suffix not in (".py", ""):
        raise VramscopeError(f"{path} is not a Python script")
    session.workload_info.setdefault("spec", str(path))
    session.workload_info.update(script=str(path), argv=list(args))
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    code = 0
    spawned: list[dict[str, Any]] = []
    session.start()
    try:
        stops.arm()
        try:
            with _watching_spawns(spawned):
                # as ``python SCRIPT`` runs it: ``__file__`` absolute, ``__builtins__`` the
                # module (``sys.argv[0]`` stays as typed)
                namespace = runpy.run_path(
                    os.path.abspath(path),
                    init_globals={"__builtins__": builtins},
                    run_name="__main__",
                )
        finally:
            stops.armed = False
            _let_collectives_settle(session)  # the script's objects are still alive here
        del namespace
    except Terminated:
        pass  # recorded below: the signal decides the exit, whatever unwound the script
    except SystemExit as exc:
        code = exit_status(exc.code)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        session.record_exception(exc)
    except KeyboardInterrupt as exc:
        code = 130
        session.record_exception(exc)
    except BaseException as exc:
        code = 1
        _print_user_traceback(exc, path)
        session.record_exception(exc)
    finally:
        if stops.received is not None:
            code = stops.received.exit_code
            session.set_exit("terminated", code, str(stops.received))
        session.stop()
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.resolve().parent))
        if saved_path0 is not None and (not sys.path or sys.path[0] != saved_path0):
            sys.path.insert(0, saved_path0)
    return _with_spawns(_with_signal(session.report(), stops), spawned), code


@contextlib.contextmanager
def _watching_spawns(spawned: list[dict[str, Any]]) -> Iterator[None]:
    """Note each ``torch.multiprocessing.spawn`` (``start_processes``) the script makes: the
    function it runs and how many processes. Those processes train where this run cannot
    see (fresh interpreters), and the report must say so. The call itself is torch's own."""
    import torch.multiprocessing as tmp

    spawn_module = sys.modules.get("torch.multiprocessing.spawn")  # (the name is a function too)
    original = getattr(spawn_module, "start_processes", None)
    if original is None:  # another torch's layout: nothing watched, the run goes on
        yield
        return

    def start_processes(fn: Any, args: Any = (), nprocs: int = 1, *rest: Any, **kw: Any) -> Any:
        spawned.append({"function": getattr(fn, "__name__", repr(fn)), "processes": nprocs})
        return original(fn, args, nprocs, *rest, **kw)

    exported = getattr(tmp, "start_processes", None)
    spawn_module.start_processes = start_processes
    if exported is original:
        tmp.start_processes = start_processes
    try:
        yield
    finally:
        spawn_module.start_processes = original
        if exported is original:
            tmp.start_processes = original


def _with_spawns(report: Report, spawned: list[dict[str, Any]]) -> Report:
    """A finding when the script trained in processes it spawned."""
    if not spawned:
        return report
    processes = sum(int(s["processes"]) for s in spawned)
    functions = ", ".join(dict.fromkeys(str(s["function"]) for s in spawned))
    report.findings.insert(
        0,
        Finding(
            "spawned_processes",
            "warning",
            f"the script started {processes} processes with torch.multiprocessing.spawn "
            f"({functions}): what they held is not in this report, which measured the "
            "process that started them (host RSS counts the whole process tree). Measure "
            "each rank: launch the script with torchrun under `vramscope run --nproc N` "
            "(ranks read RANK and WORLD_SIZE), or wrap the spawned function's body in "
            "`with vramscope.track() as session:` and save `session.report()` per rank",
            {"spawns": spawned},
        ),
    )
    return report


SETTLE_S = 0.1


def _let_collectives_settle(session: Session) -> None:
    """When the script used torch.distributed, give its worker threads a moment without the
    GIL before the script's objects are freed.

    A gloo worker thread frees each finished collective, which needs the GIL when the work
    keeps Python state captured when it was launched (the CPU source's dispatch mode is part
    of every work a tracked CPU run launches). When the script's DDP model goes away, its
    reducer destroys the process group it still holds, joining those threads while holding
    the GIL: a thread still waiting to free its last work never gets it, and the process
    hangs (seen now and then on a loaded machine when a script ends right after its
    collectives, under a launcher and in a single process that set up its own group and
    destroyed it before the end). Sleeping here lets them finish first; nothing new is
    launched once the script ended. Runs that never made a process group do not wait.
    """
    if "torch.distributed" not in sys.modules or not torch.distributed.is_available():
        return
    if "RANK" in os.environ or torch.distributed.is_initialized() or session.holds_process_groups():
        time.sleep(SETTLE_S)


def _with_signal(report: Report, stops: StopSignals) -> Report:
    """Name the stop signal in the report, when one ended the run."""
    if stops.received is not None and report.exit.status == "terminated":
        report.exit.signal = stops.received.signal_name
        report.exit.signal_number = stops.received.signum
    return report


def _source_file(builder: Any) -> Any:
    """The file that defines a build function (its lines are the workload's own)."""
    import inspect

    try:
        return inspect.getsourcefile(inspect.unwrap(builder)) or builder
    except TypeError:
        return builder


def measure(
    workload: str | Any,
    batch_size: int,
    steps: int = 5,
    device: str | torch.device | None = None,
    precision: str | None = None,
    accumulate: int | None = None,
    allocator_config: str | None = None,
    interval_s: float | None = None,
    detail: str = "default",
    depth: int = 3,
    lines_of: list[Any] | None = None,
    snapshot: str | None = None,
    stops: StopSignals | None = None,
    module_steps: str | int = "auto",
    trust_remote_code: bool = False,
    phase_steps: str | int = "auto",
    journal: str | os.PathLike[str] | bool | None = True,
) -> Report:
    """Build a workload and measure ``steps`` real steps, the first included.

    ``workload`` is a spec (``file.py:fn``, ``example:cnn``…) or a build function.
    An out-of-memory error leaves an OOM report (``report.exit.status == "oom"``).
    ``detail``, ``depth``, ``module_steps``, ``lines_of`` and ``snapshot`` are the
    Session's attribution options (``phase_steps``: the steps read phase by phase on CUDA);
    lines default to the file that defines the workload. ``stops``: installed stop-signal
    handlers (the CLI's), so that SIGTERM/SIGHUP end the steps with a report;
    without them a signal does what the program says. ``trust_remote_code``: an ``hf:``
    model may run the code its repository ships. ``journal``: where the run's journal is
    written as the steps go (``vramscope report JOURNAL`` makes the report from it when the
    process is killed), as for :func:`vramscope.track`: True, the user's private directory
    (removed when the steps end); a path (kept); None, no journal.
    """
    from vramscope.hf_models import trusting_remote_code

    if not isinstance(steps, int) or steps < 1:
        raise VramscopeError(f"steps must be 1 or more, not {steps!r}")
    spec: WorkloadSpec = resolve(workload)
    apply_allocator_config(allocator_config)
    target = pick_device(str(device) if device is not None else None)
    session = Session(
        device=target,
        interval_s=interval_s,
        name=spec.spec,
        manual_steps=True,
        workload={
            "spec": spec.spec,
            "batch_size": batch_size,
            "steps": steps,
            "allocator_config": allocator_config,
        },
        detail=detail,
        depth=depth,
        module_steps=module_steps,
        phase_steps=phase_steps,
        lines_of=lines_of or ([_source_file(spec.builder)] if detail == "lines" else None),
        snapshot=snapshot,
        journal=journal,
    )
    losses: list[float | None] = []
    session.start()
    try:
        if stops is not None:
            stops.arm()
        with trusting_remote_code(trust_remote_code):
            w = build_workload(spec.builder, batch_size, target, spec.spec, precision)
        w = w.with_overrides(precision=precision, accumulate=accumulate)
        session.workload_info.update(
            precision=w.precision,
            accumulate=w.accumulate,
            training=w.training,
            parameters=sum(p.numel() for p in w.model.parameters()),
        )
        runner = StepRunner(w, target)
        session.watch(w.model)
        for optimizer in torch_optimizers(w.optimizer):
            session.watch(optimizer)
        session.mark_built()
        for _ in range(steps):
            losses.append(runner())
            session.step()
    except VramscopeError:
        raise
    except Terminated:
        pass  # recorded below
    except BaseException as exc:  # the user's step failed: keep the partial report
        session.record_exception(exc)
    finally:
        if stops is not None:
            stops.armed = False
            if stops.received is not None:
                session.set_exit("terminated", stops.received.exit_code, str(stops.received))
        session.stop()
    report = session.report() if stops is None else _with_signal(session.report(), stops)
    report.extra["losses"] = losses
    return report
