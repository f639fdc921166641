"""The standard step of a Workload, and spec resolution (``file.py:fn``, ``example:cnn``…).

A spec on the command line is ``path/to/file.py:function`` or a built-in name:
``example:cnn``, ``example:gpt``, and, when the library is installed, ``torchvision:NAME``,
``timm:NAME``, ``hf:NAME``. The function is called as ``build(batch_size, device)`` and
returns a ``Workload`` (defined in ``vramscope.contract``, below the built-in specs, and
importable from here too).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vramscope import examples, zoo
from vramscope.contract import (
    PRECISIONS,
    Builder,
    Workload,
    normalize_precision,
    torch_optimizers,
)
from vramscope.errors import VramscopeError, WorkloadError

__all__ = [
    "PRECISIONS",
    "Builder",
    "StepRunner",
    "Workload",
    "WorkloadSpec",
    "build_workload",
    "normalize_precision",
    "pick_device",
    "resolve",
    "torch_optimizers",
]


# ---- the standard step -------------------------------------------------------------------


def _autocast_dtype(precision: str) -> torch.dtype | None:
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


def _true_dtype(precision: str) -> torch.dtype | None:
    return {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floating(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floating(v, dtype) for k, v in value.items()}
    return value


def _as_args(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(batch, dict):
        return (), batch
    if isinstance(batch, (list, tuple)):
        return tuple(batch), {}
    return (batch,), {}


class StepRunner:
    """Runs the standard training or inference step of a Workload, as the contract says.

    For each micro-batch: forward under autocast, backward (scaled when ``16-mixed``);
    then ``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)``.
    """

    def __init__(self, workload: Workload, device: torch.device) -> None:
        self.workload = workload
        self.device = device
        true_dtype = _true_dtype(workload.precision)
        if true_dtype is not None:
            workload.model.to(true_dtype)
        self._input_dtype = true_dtype
        self._autocast = _autocast_dtype(workload.precision)
        self.scaler = None
        if workload.precision == "16-mixed" and workload.training:
            self.scaler = torch.amp.GradScaler(device.type, enabled=True)
        if workload.training:
            workload.model.train()
        else:
            workload.model.eval()

    def _context(self) -> contextlib.AbstractContextManager:
        if self._autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast)

    def micro_batch(self) -> Any:
        w = self.workload
        batch = w.batch()
        if self._input_dtype is not None:
            batch = _cast_floating(batch, self._input_dtype)
        args, kwargs = _as_args(batch)
        if not w.training:
            with torch.no_grad(), self._context():
                return w.loss(w.model, *args, **kwargs)
        with self._context():
            loss = w.loss(w.model, *args, **kwargs)
        if w.accumulate > 1:
            loss = loss / w.accumulate
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def __call__(self) -> float | None:
        """One step; returns the loss summed over micro-batches (None for inference)."""
        w = self.workload
        if w.step is not None:
            out = w.step()
            return float(out) if isinstance(out, (int, float)) else _scalar(out)
        total = 0.0
        result = None
        for _ in range(w.accumulate):
            result = self.micro_batch()
            if w.training:
                total += float(result)
        if not w.training:
            return _scalar(result)
        optimizers = w.optimizers
        for optimizer in optimizers:
            if self.scaler is None:
                optimizer.step()
            elif isinstance(optimizer, torch.optim.Optimizer):
                self.scaler.step(optimizer)
            else:  # a wrapper: the scaler steps the optimizers it holds
                inner = torch_optimizers(optimizer)
                if not inner:  # (none stepped would be a step without an update)
                    raise VramscopeError(
                        f"16-mixed steps each torch optimizer through a GradScaler; "
                        f"{type(optimizer).__name__} holds none among its attributes: pass "
                        "the optimizers themselves (Workload(optimizer=[...]))"
                    )
                for each in inner:
                    self.scaler.step(each)
        if self.scaler is not None:
            self.scaler.update()
        set_to_none = w.meta.get("zero_grad_set_to_none", True)
        for optimizer in optimizers:
            if isinstance(optimizer, torch.optim.Optimizer):
                optimizer.zero_grad(set_to_none=set_to_none)
            else:  # a wrapper of the user's: its own zero_grad(), as their loop calls it
                optimizer.zero_grad()
        return total


def _scalar(value: Any) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return None


# ---- spec resolution -----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    """A resolved spec: a name for reports and the function that builds the workload."""

    spec: str
    builder: Builder

    def build(self, batch_size: int, device: torch.device) -> Workload:
        return build_workload(self.builder, batch_size, device, self.spec)


def resolve(spec: str | Builder) -> WorkloadSpec:
    """Turn ``file.py:fn``, ``example:cnn``, ``torchvision:resnet50`` … into a builder."""
    if callable(spec):
        name = getattr(spec, "__qualname__", repr(spec))
        return WorkloadSpec(spec=f"{getattr(spec, '__module__', '?')}:{name}", builder=spec)
    text = str(spec).strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix in _BUILTIN_PREFIXES:
        return WorkloadSpec(spec=text, builder=_BUILTIN_PREFIXES[prefix](rest))
    path_text, sep, func = text.rpartition(":")
    if not sep or not path_text.endswith(".py"):
        raise WorkloadError(
            f"cannot read workload {text!r}; write path/to/file.py:function or one of "
            "example:cnn, example:gpt, torchvision:NAME, timm:NAME, hf:NAME"
        )
    return WorkloadSpec(spec=text, builder=_load_function(Path(path_text), func))


def _load_function(path: Path, func: str) -> Builder:
    if not path.is_file():
        shown = str(path) if str(path).isprintable() else repr(str(path))
        raise WorkloadError(f"no such file: {shown}")
    module_name = f"_vramscope_workload_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise WorkloadError(
            f"importing {path} exited (code {exc.code}): it runs a program at import; "
            "put that under `if __name__ == '__main__':`"
        ) from None
    except Exception as exc:
        raise WorkloadError(f"importing {path} raised {_where(exc, path)}") from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.resolve().parent))
    builder = getattr(module, func, None)
    if builder is None or not callable(builder):
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise WorkloadError(
            f"{path} has no function {func!r}"
            + (f"; functions there: {', '.join(available[:8])}" if available else "")
        )
    return builder


def _where(exc: BaseException, path: Path | None = None) -> str:
    """``TypeError: msg (at file.py:12)``: the user's error and the innermost user frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = Path(__file__).resolve().parent
    location = ""
    for frame in reversed(frames):
        file = Path(frame.filename)
        if path is not None and file.resolve() != path.resolve() and own in file.resolve().parents:
            continue
        if own in file.resolve().parents:
            continue
        location = f" (at {file.name}:{frame.lineno})"
        break
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"{type(exc).__name__}: {message}{location}"
        if message
        else f"{type(exc).__name__}{location}"
    )


def build_workload(
    builder: Builder,
    batch_size: int,
    device: torch.device,
    spec: str = "?",
    precision: str | None = None,
) -> Workload:
    """Call a build function and check that it returned a Workload. A build function that
    takes ``precision=`` is told the precision asked for (``--precision``), so that it can
    build the model in a ``-true`` precision's dtype directly."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise VramscopeError(f"batch size must be a whole number of 1 or more, not {batch_size!r}")
    try:
        workload = zoo.call_builder(builder, batch_size, device, precision)
    except VramscopeError:
        raise
    except torch.cuda.OutOfMemoryError:
        raise
    except SystemExit as exc:  # sys.exit() in build(): one line, not the build's exit code
        raise WorkloadError(f"building {spec} exited (sys.exit({exc.code!r}))") from None
    except Exception as exc:
        raise WorkloadError(f"building {spec} raised {_where(exc)}") from None
    if not isinstance(workload, Workload):
        raise WorkloadError(f"{spec} returned {type(workload).__name__}, not vramscope.Workload")
    if workload.name is None:
        workload.name = spec
    return workload


def _example(name: str) -> Builder:
    try:
        return examples.BUILDERS[name]
    except KeyError:
        raise WorkloadError(
            f"no built-in example {name!r}; examples: {', '.join(sorted(examples.BUILDERS))}"
        ) from None


_BUILTIN_PREFIXES: dict[str, Callable[[str], Builder]] = {
    "example": _example,
    "torchvision": zoo.torchvision_builder,
    "timm": zoo.timm_builder,
    "hf": zoo.hf_builder,
}


def pick_device(requested: str | None = None) -> torch.device:
    """The device to measure on: ``requested``, else CUDA when present, else CPU."""
    if requested:
        try:
            device = torch.device(requested)
        except RuntimeError:
            raise VramscopeError(f"unknown device {requested!r}; use cuda, cuda:N or cpu") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise VramscopeError("--device cuda was asked for, but torch sees no CUDA device here")
        return device
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
