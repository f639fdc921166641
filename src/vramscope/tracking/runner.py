"""Run an unmodified script, or a Workload's steps, under a tracking Session."""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from vramscope.errors import VramscopeError
from vramscope.report.model import Report
from vramscope.tracking.session import Session
from vramscope.workload import (
    StepRunner,
    WorkloadSpec,
    build_workload,
    pick_device,
    resolve,
)


def apply_allocator_config(config: str | None) -> None:
    """Set the allocator options before CUDA starts (both variable names torch reads)."""
    if not config:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(config)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = config
    os.environ["PYTORCH_ALLOC_CONF"] = config


def _print_user_traceback(exc: BaseException, script: Path) -> None:
    """Print the script's traceback as Python would, without vramscope's own frames."""
    tb = exc.__traceback__
    target = str(script.resolve())
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != target:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def run_script(script: str | Path, args: list[str], session: Session) -> tuple[Report, int]:
    """Run ``script`` with ``args`` as ``__main__`` under ``session``; (report, exit code)."""
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
    session.start()
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
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
        session.stop()
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.resolve().parent))
        if saved_path0 is not None and (not sys.path or sys.path[0] != saved_path0):
            sys.path.insert(0, saved_path0)
    return session.report(), code


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
    interval_s: float = 0.1,
    detail: str = "default",
    depth: int = 3,
    lines_of: list[Any] | None = None,
    snapshot: str | None = None,
) -> Report:
    """Build a workload and measure ``steps`` real steps, the first included.

    ``workload`` is a spec (``file.py:fn``, ``example:cnn``…) or a build function.
    An out-of-memory error leaves an OOM report (``report.exit.status == "oom"``).
    ``detail``, ``depth``, ``lines_of`` and ``snapshot`` are the Session's attribution
    options; lines default to the file that defines the workload.
    """
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
        lines_of=lines_of or ([_source_file(spec.builder)] if detail == "lines" else None),
        snapshot=snapshot,
    )
    losses: list[float | None] = []
    session.start()
    try:
        w = build_workload(spec.builder, batch_size, target, spec.spec)
        w = w.with_overrides(precision=precision, accumulate=accumulate)
        session.workload_info.update(
            precision=w.precision,
            accumulate=w.accumulate,
            training=w.training,
            parameters=sum(p.numel() for p in w.model.parameters()),
        )
        runner = StepRunner(w, target)
        session.watch(w.model)
        if w.optimizer is not None:
            session.watch(w.optimizer)
        session.mark_built()
        for _ in range(steps):
            losses.append(runner())
            session.step()
    except VramscopeError:
        raise
    except BaseException as exc:  # the user's step failed: keep the partial report
        session.record_exception(exc)
    finally:
        session.stop()
    report = session.report()
    report.extra["losses"] = losses
    return report
