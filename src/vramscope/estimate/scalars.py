"""Data-dependent values under fake tensors: ``.item()`` and friends answered from real values
of small tensors (kept beside their fake ones) or with a plausible value, ops whose output
size depends on values, and where in the user's code each was met."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch
from torch.utils.weak import WeakIdKeyDictionary

from vramscope.estimate.recorder import Recorder, TraceError

aten = torch.ops.aten
SHADOW_LIMIT = 4096  # elements: small tensors also get real values, for .item() and .tolist()
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the trace's own modules: their frames are never the user's location
_TRACE_FILES = tuple(
    os.path.join(_OWN_DIR, "estimate", name)
    for name in (
        "trace.py",
        "kernels.py",
        "scalars.py",
        "fake_cache.py",
        "recorder.py",
        "cuda_device.py",
        "model_state.py",
        "initializers.py",
        "rnn.py",
    )
)
_SKIP, _OWN = 0, 1
_FILE_KINDS: dict[str, int | str] = {}  # code file -> _SKIP, _OWN, or its base name (user code)


def _file_kind(filename: str) -> int | str:
    kind = _FILE_KINDS.get(filename)
    if kind is None:
        path = os.path.abspath(filename)
        torch_dir = os.path.dirname(torch.__file__)
        if path.startswith(torch_dir) or path in _TRACE_FILES or "<frozen" in path:
            kind = _SKIP
        elif path.startswith(_OWN_DIR):
            kind = _OWN
        else:
            kind = os.path.basename(path)
        _FILE_KINDS[filename] = kind
    return kind


def _user_location() -> str | None:
    """The innermost frame outside torch: where the user's code (or a library it calls) made
    the op; None when it is vramscope's own step (``float(loss)`` in the standard step).
    Walks the frames themselves (no source lines read), each file classified once: a
    data-dependent check inside a loop costs microseconds, not a formatted stack."""
    frame = sys._getframe(1)
    while frame is not None:
        kind = _file_kind(frame.f_code.co_filename)
        if kind == _OWN:
            return None
        if kind != _SKIP:
            return f"{kind}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "unknown location"


def op_name(func: Any) -> str:
    """``any`` for ``aten.any.default``: the op without its overload."""
    packet = getattr(func, "overloadpacket", None)
    return packet.__name__ if packet is not None else func.__name__


_WRITTEN_ARGS: dict[Any, tuple[int, ...]] = {}  # op -> positions of arguments it writes


class DataDependentValues(FakeTensorMode):
    """The data-dependent part of a :class:`~vramscope.estimate.trace.TracingMode`."""

    recorder: Recorder
    shadows: WeakIdKeyDictionary
    producers: WeakIdKeyDictionary

    # ---- small tensors keep real values ---------------------------------------------------
    def _shadow_args(self, args: Any) -> list[Any] | None:
        result = []
        for a in args:
            if isinstance(a, torch.Tensor):
                s = self.shadows.get(a) if isinstance(a, FakeTensor) else a
                if s is None:
                    return None
                result.append(s)
            elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
                inner = self._shadow_args(a)
                if inner is None:
                    return None
                result.append(type(a)(inner))
            else:
                result.append(a)
        return result

    def _track_small(self, func: Any, args: Any, kwargs: Any, outs: tuple[Any, ...]) -> None:
        small = [t for t in outs if isinstance(t, FakeTensor) and t.numel() <= SHADOW_LIMIT]
        writes = _WRITTEN_ARGS.get(func)
        if writes is None:
            schema = getattr(func, "_schema", None)  # none for higher-order ops
            writes = _WRITTEN_ARGS[func] = tuple(
                i
                for i, arg in enumerate(schema.arguments if schema is not None else ())
                if arg.alias_info is not None and arg.alias_info.is_write
            )
        if not small and not writes:
            return
        mutated: list[FakeTensor] = []
        for i in writes:
            a = args[i] if i < len(args) else None
            if isinstance(a, FakeTensor):
                mutated.append(a)
            elif isinstance(a, (list, tuple)):
                mutated.extend(x for x in a if isinstance(x, FakeTensor))
        if not small and not mutated:
            return
        shadow_args = self._shadow_args(args)
        shadow_kwargs: dict[str, Any] | None = {}
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                s = self.shadows.get(v) if isinstance(v, FakeTensor) else v
                if s is None:
                    shadow_kwargs = None
                    break
                shadow_kwargs[k] = s
            elif isinstance(v, torch.device):
                shadow_kwargs[k] = torch.device("cpu")
            else:
                shadow_kwargs[k] = v
        name = op_name(func)
        for t in (*small, *mutated):
            with contextlib.suppress(TypeError):
                self.producers[t] = name
        if (
            shadow_args is None
            or shadow_kwargs is None
            or any(isinstance(t, FakeTensor) and t.numel() > SHADOW_LIMIT for t in outs)
        ):
            for t in mutated:
                self.shadows.pop(t, None)
            return
        try:
            with no_dispatch():
                real = func(*shadow_args, **shadow_kwargs)
        except Exception:
            for t in mutated:
                self.shadows.pop(t, None)
            return
        reals = (
            (real,)
            if isinstance(real, torch.Tensor)
            else tuple(real)
            if isinstance(real, (tuple, list))
            else ()
        )
        for fake, value in zip(outs, reals, strict=False):
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                with contextlib.suppress(TypeError):
                    self.shadows[fake] = value

    def _scalar(self, tensor: torch.Tensor) -> Any:
        shadow = self.shadows.get(tensor) if isinstance(tensor, FakeTensor) else None
        if shadow is not None:
            with no_dispatch():
                return shadow.item()
        if isinstance(tensor, FakeTensor) and tensor.constant is not None:
            with no_dispatch():
                return tensor.constant.item()
        producer = self.producers.get(tensor, "") if isinstance(tensor, FakeTensor) else ""
        self._note_data_dependent("Tensor.item()", producer)
        dtype = tensor.dtype
        if dtype == torch.bool:
            return producer not in ("any", "isnan", "isinf", "isneginf", "isposinf")
        if dtype.is_floating_point:
            # GradScaler's found_inf and other overflow flags read 0; anything else 1
            if producer.startswith("_amp") or producer in ("isnan", "isinf"):
                return 0.0
            return 1.0
        if dtype.is_complex:
            return complex(1.0)
        return 1

    def _note_data_dependent(self, what: str, producer: str | None) -> None:
        where = _user_location()
        if where is None:
            return
        key = f"{what} at {where}"
        if key not in self.recorder.data_dependent:
            made = f" of {producer}" if producer else ""
            self.recorder.data_dependent[key] = f"{what}{made} at {where}"

    def _dynamic_shape(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """Ops whose output size depends on values: exact when the input has real values,
        else the largest possible size (every element selected)."""
        name = func._schema.name
        overload = f"{name}.{func._overloadname}" if func._overloadname != "default" else name
        shadow = self._shadow_args(args)
        where = _user_location() or "the standard step"
        if shadow is not None:
            with no_dispatch():
                real = func(*shadow, **kwargs)
            shape = real.shape if isinstance(real, torch.Tensor) else None
        else:
            shape = None
        x = args[0]
        if overload == "aten::nonzero":
            rows = shape[0] if shape is not None else x.numel()
            result = super().dispatch(
                aten.empty.memory_format,
                types,
                ((rows, x.dim()),),
                {"dtype": torch.long, "device": x.device},
            )
        elif overload == "aten::masked_select":
            n = (
                shape[0]
                if shape is not None
                else torch.broadcast_shapes(x.shape, args[1].shape).numel()
            )
            result = super().dispatch(
                aten.empty.memory_format, types, ((n,),), {"dtype": x.dtype, "device": x.device}
            )
        elif overload == "aten::index.Tensor":
            # a boolean mask of k dims selects (at most) all its elements: k long indices
            indices: list[Any] = []
            for idx in args[1]:
                if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
                    count = idx.numel()
                    long_index = super().dispatch(
                        aten.empty.memory_format,
                        types,
                        ((count,),),
                        {"dtype": torch.long, "device": idx.device},
                    )
                    indices.extend([long_index] * idx.dim())
                else:
                    indices.append(idx)
            result = super().dispatch(func, types, (x, indices), kwargs)
        elif overload in (
            "aten::_unique2",
            "aten::_unique",
            "aten::unique_consecutive",
            "aten::unique_dim",
        ):
            raise TraceError(
                f"{overload} has a size that depends on the tensor's values (at {where}); an "
                "estimate cannot know it. Compute it outside the traced step (e.g. in build())"
            )
        else:
            raise TraceError(
                f"{overload} has an output size that depends on tensor values (at {where}); "
                "an estimate cannot know it"
            )
        self._note_data_dependent(overload, None)
        if shape is None:
            self.recorder.notes.append(
                f"{overload} at {where}: output size depends on values; assumed the largest"
            )
        return result
