"""Data-dependent values under fake tensors: real values where they exist, the bound that
gives the most memory where they do not, and where in the user's code each was met.

A fake tensor has no values, but many tensors of a step have values that can be computed
for real on the CPU: the batch the user's code makes (ids, labels, masks, lengths), and
whatever is computed from them and from other small tensors (positions, masks, counts).
Each such tensor keeps a real twin (its *shadow*), computed op by op beside it: every
integer and boolean tensor up to :data:`~vramscope.estimate.shadows.INDEX_SHADOW_LIMIT` elements, and floating-point
tensors up to :data:`~vramscope.estimate.shadows.SHADOW_LIMIT`. ``.item()``, ``bool()``, ``.tolist()`` and the ops whose
output size depends on values (``nonzero``, ``unique``, ``bincount``, boolean indexing,
``nms``...) read the shadows, so they are exact.

Where a value has no shadow (it comes from the model's floating-point activations: a
router's choice of experts, the boxes a detector keeps), it is *assumed*, and the
assumption is the one that needs the most memory (:class:`Assumptions`): indices chosen by
``topk``/``argmax``/``sort`` on values that are not known are the same for every row (every
token routed to the same experts), a selection keeps every element (every proposal kept).
Each assumption is recorded with the op and the user's line; the estimator traces the
alternative (tokens spread evenly, nothing selected) and reports the bytes that depend on
the assumption.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch
from torch.utils.weak import WeakIdKeyDictionary

from vramscope.estimate.recorder import Recorder, TraceError
from vramscope.estimate.shadows import fits_shadow

aten = torch.ops.aten
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
        "shadows.py",
        "cuda_rules.py",
    )
)
_SKIP, _OWN = 0, 1
_FILE_KINDS: dict[str, int | str] = {}  # code file -> _SKIP, _OWN, or its base name (user code)


def _file_kind(filename: str) -> int | str:
    kind = _FILE_KINDS.get(filename)
    if kind is None:
        path = os.path.abspath(filename)
        torch_dir = os.path.dirname(torch.__file__) + os.sep  # not torchvision's folder
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


# ---- assumptions ---------------------------------------------------------------------------

HEAVY, LIGHT = "heavy", "light"


@dataclass
class Assumption:
    """A value the trace could not know and assumed: what, where, and what was assumed."""

    kind: str  # "routing" (indices chosen on unknown values) or "selection" (a size)
    what: str  # the op, e.g. "topk"
    where: str  # the user's line
    heavy: str  # what the heavy (most memory) variant assumes
    light: str  # what the light variant assumes
    used: bool = False  # whether anything read the assumed values (or sizes)
    sized: bool = False  # whether a size was made from them (an op's output, packed rows)

    def describe(self, variant: str = HEAVY) -> str:
        return f"{self.what} at {self.where}: {self.heavy if variant == HEAVY else self.light}"


# ops whose integer output picks positions along a dimension of values that may be unknown:
# op name -> (index of the index output among the outputs, "picks" or "permutes")
_INDEX_SOURCES: dict[str, tuple[int, str]] = {
    "topk": (1, "picks"),
    "argmax": (0, "picks"),
    "argmin": (0, "picks"),
    "max": (1, "picks"),
    "min": (1, "picks"),
    "kthvalue": (1, "picks"),
    "mode": (1, "picks"),
    "median": (1, "picks"),
    "nanmedian": (1, "picks"),
    "multinomial": (0, "picks"),
    "sort": (1, "permutes"),
    "argsort": (0, "permutes"),
    "cummax": (1, "permutes"),
    "cummin": (1, "permutes"),
}


def _dim_arg(func: Any, args: Any, kwargs: Any, default: int | None) -> int | None:
    """The ``dim`` argument of an index source (None: over all elements)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return default
    for position, argument in enumerate(schema.arguments):
        if argument.name == "dim":
            if "dim" in kwargs:
                return kwargs["dim"]
            if position < len(args):
                return args[position]
            value = argument.default_value
            return value if isinstance(value, int) else default
    return default


def assumed_indices(
    source: torch.Tensor, index: torch.Tensor, dim: int | None, permutes: bool, spread: bool
) -> torch.Tensor:
    """Indices an op picked along ``dim`` of ``source`` (whose values are unknown), assumed.

    ``spread=False`` (the heavy variant): the first rows pick every position once, every
    other row picks the same first positions — every expert gets a token (so each has a
    gradient and optimizer state) and all the other tokens go to the same experts, the most
    a single expert's activations can be. ``spread=True``: rows spread evenly over the
    positions (row r picks r·k, r·k+1, ... modulo the size). A permutation (``sort``) is the
    identity either way."""
    if dim is None or source.dim() == 0:
        return torch.zeros(index.shape, dtype=index.dtype)
    dim = dim % source.dim()
    size = max(1, source.shape[dim])
    kept = index.dim() == source.dim()  # the dimension kept (k picks), or reduced away
    picks = index.shape[dim] if kept else 1
    rows = max(1, index.numel() // max(1, picks))
    j = torch.arange(picks)
    r = torch.arange(rows).unsqueeze(1)
    if permutes:
        values = j.expand(rows, picks)
    else:
        values = r * picks + j
        if not spread:
            covering = -(-size // picks)  # rows that pick every position once
            values = torch.where(r < covering, values, j)
    values = values % size
    if not kept:
        return values.reshape(index.shape).to(index.dtype)
    moved = list(index.shape)
    moved.append(moved.pop(dim))
    return values.reshape(moved).movedim(-1, dim).to(index.dtype).contiguous()


# ---- the mode's part -----------------------------------------------------------------------


class DataDependentValues(FakeTensorMode):
    """The data-dependent part of a :class:`~vramscope.estimate.trace.TracingMode`."""

    recorder: Recorder
    shadows: WeakIdKeyDictionary
    producers: WeakIdKeyDictionary
    # fake tensor -> the assumptions its shadow (or its size) depends on
    assumed: WeakIdKeyDictionary
    # fake integer tensor without values -> the largest value it can hold (a count)
    bounds: WeakIdKeyDictionary
    variant: str  # HEAVY or LIGHT: how values that cannot be known are assumed
    draws_at_top: bool  # integer draws of the steps read as the top of their range

    def _init_values(self, variant: str = HEAVY, draws_at_top: bool = False) -> None:
        self.assumed = WeakIdKeyDictionary()
        self.bounds = WeakIdKeyDictionary()
        self.variant = variant
        self.draws_at_top = draws_at_top

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

    def _shadow_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        shadow: dict[str, Any] = {}
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                s = self.shadows.get(v) if isinstance(v, FakeTensor) else v
                if s is None:
                    return None
                shadow[k] = s
            elif isinstance(v, torch.device):
                shadow[k] = torch.device("cpu")
            else:
                shadow[k] = v
        return shadow

    def _assumptions_of(self, args: Any, kwargs: dict[str, Any]) -> frozenset[int]:
        """The assumptions that the values (or sizes) of the op's inputs depend on."""
        found: set[int] = set()
        for a in (*args, *kwargs.values()):
            if isinstance(a, FakeTensor):
                found.update(self.assumed.get(a, ()))
            elif isinstance(a, (list, tuple)):
                for x in a:
                    if isinstance(x, FakeTensor):
                        found.update(self.assumed.get(x, ()))
        return frozenset(found)

    def _use(self, keys: frozenset[int], sized: bool = False) -> None:
        """Something read values (``sized``: made a size) that depend on these assumptions."""
        for key in keys:
            assumption = self.recorder.assumptions[key]
            assumption.used = True
            assumption.sized = assumption.sized or sized

    def sized_by(self, tensor: Any) -> None:
        """A size was made from the values of ``tensor`` (a host tensor of the trace)."""
        if isinstance(tensor, FakeTensor):
            self._use(self.assumed.get(tensor, frozenset()), sized=True)

    def _assume(self, kind: str, what: str, heavy: str, light: str) -> int:
        """Record an assumption (one per op and line); its key."""
        where = _user_location() or "the standard step"
        key = hash((kind, what, where)) & 0x7FFFFFFF
        if key not in self.recorder.assumptions:
            self.recorder.assumptions[key] = Assumption(kind, what, where, heavy, light)
        return key

    def _mark(self, tensors: Any, keys: frozenset[int]) -> None:
        if not keys:
            return
        for t in tensors:
            if isinstance(t, FakeTensor):
                with contextlib.suppress(TypeError):
                    self.assumed[t] = keys | self.assumed.get(t, frozenset())

    def _track_small(self, func: Any, args: Any, kwargs: Any, outs: tuple[Any, ...]) -> None:
        small = [t for t in outs if isinstance(t, FakeTensor) and fits_shadow(t)]
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
        name = op_name(func)
        for t in (*small, *mutated):
            with contextlib.suppress(TypeError):
                self.producers[t] = name
        if small and all(self.shadows.get(t) is not None for t in small) and not mutated:
            return  # made with their values already (an op whose size depends on them)
        keys = self._assumptions_of(args, kwargs)
        shadow_args = self._shadow_args(args)
        shadow_kwargs = self._shadow_kwargs(kwargs)
        if shadow_args is None and name in _VALUE_FREE and args and small:
            shadow_args = _value_free_args(name, args)
        if shadow_args is None and name in _COMPARISONS and len(args) == 2 and small:
            shadow_args = _against_infinity(args)
        if (
            shadow_args is None
            or shadow_kwargs is None
            or any(isinstance(t, FakeTensor) and not fits_shadow(t) for t in outs)
        ):
            for t in mutated:
                self.shadows.pop(t, None)
            if shadow_args is None or shadow_kwargs is None:
                if name in ("sum", "count_nonzero") and outs:
                    self._count_bound(args, outs[0])
                else:
                    self._assume_indices(func, name, args, kwargs, outs)
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
        if name in _UNIFORM_DRAWS:
            # in the traced steps, where Python reads the draw, both ends are traced and the
            # larger step kept: LayerDrop skips a layer below its probability, a random
            # augmentation applies its work below its own (while the workload is built, a
            # parameter's initial values: the top, and no assumption)
            stepping = self.recorder.recording
            _end_of_range(func, args, kwargs, reals, top=self.variant == HEAVY or not stepping)
            if stepping:
                top, bottom = (
                    f"a random draw read as the {end} of its range" for end in ("top", "bottom")
                )
                keys = keys | {self._assume("draw", name, top, bottom)}
        elif name in _INTEGER_DRAWS and self.recorder.recording:
            # a draw of the steps whose values make a size (lengths packed, counted, kept)
            # is traced as drawn and, when a size followed from it, again at the top of its
            # range: the run's many steps reach draws this one step did not
            if self.draws_at_top:
                _top_of_integer_range(func, args, kwargs, reals)
            keys = keys | {
                self._assume(
                    INTEGER_DRAW, name, "every value at the top of its range", "the values drawn"
                )
            }
        for fake, value in zip(outs, reals, strict=False):
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                with contextlib.suppress(TypeError):
                    self.shadows[fake] = value
        self._mark((*outs, *mutated), keys)

    def _assume_indices(
        self, func: Any, name: str, args: Any, kwargs: Any, outs: tuple[Any, ...]
    ) -> None:
        """An index source (``topk``, ``argmax``, ``sort``...) over values the trace does not
        have: its indices get assumed values (:func:`assumed_indices`)."""
        source_spec = _INDEX_SOURCES.get(name)
        if source_spec is None or not args or not isinstance(args[0], FakeTensor):
            return
        position, how = source_spec
        if position >= len(outs):
            return
        index = outs[position]
        if not isinstance(index, FakeTensor) or index.dtype.is_floating_point:
            return
        if not fits_shadow(index) or self.shadows.get(index) is not None:
            return
        permutes = how == "permutes"
        source = args[0]
        if name == "multinomial":
            dim: int | None = -1
        else:
            dim = _dim_arg(func, args, kwargs, -1 if name in ("topk", "sort", "argsort") else None)
        spread = self.variant == LIGHT
        with no_dispatch():
            values = assumed_indices(source, index, dim, permutes, spread)
        with contextlib.suppress(TypeError):
            self.shadows[index] = values
        if permutes:
            return  # an order: no position is favoured, nothing to assume
        key = self._assume(
            "routing",
            name,
            "each position picked once and every other row the same positions (every "
            "expert gets a token, all the others go to the same experts: the most memory)",
            "rows spread evenly over the positions",
        )
        self._mark((index,), frozenset((key,)))

    def _scalar(self, tensor: torch.Tensor) -> Any:
        shadow = self.shadows.get(tensor) if isinstance(tensor, FakeTensor) else None
        if shadow is not None:
            # an integer read is taken for a size (a length, a count); a boolean one decides
            # a branch (``pad_token_id in input_ids``)
            dtype = tensor.dtype
            integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
            self._use(self.assumed.get(tensor, frozenset()), sized=integer)
            with no_dispatch():
                return shadow.item()
        if isinstance(tensor, FakeTensor) and tensor.constant is not None:
            with no_dispatch():
                return tensor.constant.item()
        bound = self.bounds.get(tensor) if isinstance(tensor, FakeTensor) else None
        if bound is not None:
            key = self._assume(
                "selection",
                "Tensor.item()",
                f"a count of selected elements: all {bound:,} selected (the most memory)",
                "none selected",
            )
            self._use(frozenset((key,)))
            return bound if self.variant == HEAVY else 0
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

    def refuse_invalid(self, name: str, args: Any) -> None:
        """Arguments a GPU refuses and the fake kernels let pass: an embedding's ids outside
        its rows (a sequence longer than a model's learned positions, token ids past its
        vocabulary; the ids' values where the trace has them), ``index_add`` of a source of
        another dtype. The step fails on the device, so the estimate fails with it."""
        if name == "embedding":
            weight, ids = args[0], args[1]
            shadow = self.shadows.get(ids) if isinstance(ids, FakeTensor) else None
            if shadow is None or shadow.numel() == 0 or self.producers.get(ids) in _UNWRITTEN:
                return  # (values never written: a collective's output, which nothing fills)
            with no_dispatch():
                low, high = int(shadow.min()), int(shadow.max())
            rows = weight.shape[0]
            if low < 0 or high >= rows:
                raise IndexError(
                    f"index out of range in self: an embedding of {rows:,} rows looked up "
                    f"with ids from {low:,} to {high:,} (a sequence longer than the model's "
                    "positions, or ids past its vocabulary, fail so on the GPU)"
                )
        elif name == "index_add" and len(args) >= 4:
            target, source = args[0], args[3]
            if isinstance(source, torch.Tensor) and source.dtype != target.dtype:
                raise RuntimeError(
                    f"index_add_(): self ({target.dtype}) and source ({source.dtype}) must "
                    "have the same scalar type (the GPU refuses it; cast the source first)"
                )

    def _note_data_dependent(self, what: str, producer: str | None) -> None:
        where = _user_location()
        if where is None:
            return
        key = f"{what} at {where}"
        if key not in self.recorder.data_dependent:
            made = f" of {producer}" if producer else ""
            self.recorder.data_dependent[key] = f"{what}{made} at {where}"

    def _count_bound(self, args: Any, out: Any) -> None:
        """``mask.sum()`` / ``count_nonzero`` of a boolean tensor without values: a count
        between 0 and the elements counted (read by ``.item()`` as an assumption)."""
        if not isinstance(out, FakeTensor) or out.numel() != 1 or self.shadows.get(out) is not None:
            return
        x = args[0] if args else None
        if isinstance(x, FakeTensor) and x.dtype == torch.bool:
            with contextlib.suppress(TypeError):
                self.bounds[out] = x.numel()

    # ---- ops whose output size depends on values -------------------------------------------
    def _empty(self, types: Any, shape: Any, dtype: torch.dtype, device: torch.device) -> Any:
        return super().dispatch(
            aten.empty.memory_format, types, (tuple(shape),), {"dtype": dtype, "device": device}
        )

    def _dynamic_shape(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """Ops whose output size depends on values: run for real on the inputs' values where
        the trace has them (exact); else the size the heavy or light variant assumes."""
        name = func._schema.name
        overload = f"{name}.{func._overloadname}" if func._overloadname != "default" else name
        where = _user_location() or "the standard step"
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = x.device if x is not None else torch.device("cpu")
        shadow_args = self._shadow_args(args)
        shadow_kwargs = self._shadow_kwargs(kwargs)
        if shadow_args is not None and shadow_kwargs is not None:
            try:
                with no_dispatch():
                    real = func(*shadow_args, **shadow_kwargs)
            except Exception as exc:
                raise TraceError(f"{overload} failed at {where}: {exc}") from None
            reals = (real,) if isinstance(real, torch.Tensor) else tuple(real)
            outs = []
            for value in reals:
                fake = super().dispatch(
                    aten.empty_strided.default,
                    types,
                    (tuple(value.shape), tuple(value.stride())),
                    {"dtype": value.dtype, "device": device},
                )
                if fits_shadow(fake):
                    with contextlib.suppress(TypeError):
                        self.shadows[fake] = value
                outs.append(fake)
            keys = self._assumptions_of(args, kwargs)
            self._use(keys, sized=True)
            self._mark(outs, keys)
            return outs[0] if isinstance(real, torch.Tensor) else type(real)(outs)
        if overload not in _SELECTED_BY_VALUE and _integers_known(self, args, kwargs):
            # the size follows integer inputs the trace has (CTC's target lengths), not the
            # floating-point values it lacks: run the op on the CPU with those as zeros
            from vramscope.estimate.cuda_rules import run_on_cpu

            keys = self._assumptions_of(args, kwargs)
            self._use(keys, sized=True)
            out = run_on_cpu(self, func, args, kwargs, where)
            self._mark(out if isinstance(out, (tuple, list)) else (out,), keys)
            return out
        return self._assumed_size(func, overload, types, args, kwargs, where, device)

    def _assumed_size(
        self,
        func: Any,
        overload: str,
        types: Any,
        args: Any,
        kwargs: Any,
        where: str,
        device: torch.device,
    ) -> Any:
        """The output of a value-dependent op whose inputs have no values: the heavy variant
        selects every element (every proposal kept), the light one none."""
        heavy = self.variant == HEAVY
        x = args[0]
        if overload == "aten::nonzero":
            rows = x.numel() if heavy else 0
            result = self._empty(types, (rows, x.dim()), torch.long, device)
        elif overload == "aten::masked_select":
            n = torch.broadcast_shapes(x.shape, args[1].shape).numel() if heavy else 0
            result = self._empty(types, (n,), x.dtype, device)
        elif overload == "aten::index.Tensor":
            # a boolean mask of k dims selects (at most) all its elements: k long indices
            indices: list[Any] = []
            for idx in args[1]:
                if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
                    count = idx.numel() if heavy else 0
                    long_index = self._empty(types, (count,), torch.long, idx.device)
                    indices.extend([long_index] * idx.dim())
                else:
                    indices.append(idx)
            result = super().dispatch(func, types, (x, indices), kwargs)
        elif overload in ("aten::_unique2", "aten::_unique", "aten::unique_consecutive"):
            n = x.numel() if heavy else min(1, x.numel())
            inverse = _named_arg(func, args, kwargs, "return_inverse")
            counts = _named_arg(func, args, kwargs, "return_counts")
            result = (
                self._empty(types, (n,), x.dtype, device),
                self._empty(types, tuple(x.shape) if inverse else (0,), torch.long, device),
            )
            if overload != "aten::_unique":
                result = (*result, self._empty(types, (n,) if counts else (0,), torch.long, device))
        elif overload == "aten::bincount":
            minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0) or 0
            if not minlength:
                raise TraceError(
                    f"bincount at {where} counts values an estimate does not have (they come "
                    "from the model's activations); pass minlength= (the number of bins) so "
                    "that its size is known"
                )
            weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
            dtype = (
                torch.double
                if weights is not None and weights.dtype != torch.float
                else weights.dtype
                if weights is not None
                else torch.long
            )
            result = self._empty(types, (minlength,), dtype, device)
        elif overload == "torchvision::nms":
            kept = x.shape[0] if heavy else 0
            result = self._empty(types, (kept,), torch.long, device)
        else:
            raise TraceError(
                f"{overload} at {where} has an output size that depends on values the "
                "estimate does not have (they come from the model's activations); compute "
                "it from the batch or in build(), or give its size explicitly"
            )
        light = "nothing selected" if overload != "aten::bincount" else "the same"
        heavy_text = (
            "every element selected (the most memory)"
            if overload != "aten::bincount"
            else "every value below minlength"
        )
        if overload == "torchvision::nms":
            heavy_text, light = "every box kept (the most memory)", "no box kept"
        key = self._assume("selection", overload.replace("aten::", ""), heavy_text, light)
        self._use(frozenset((key,)))
        outs = result if isinstance(result, tuple) else (result,)
        self._mark(outs, frozenset((key,)))
        self._selected_values(overload, x, result)
        return result

    def _selected_values(self, overload: str, x: Any, result: Any) -> None:
        """The values an assumed selection implies, so that what is computed from them
        stays known: every position (in order) or none for ``nonzero``; for ``nms`` the
        boxes in their given order (the scores that would order them are not known). Without
        them a loop over ``unique`` of the selected labels (torchvision's per-class NMS)
        would run once per box instead of once per class."""
        if not isinstance(result, FakeTensor) or not fits_shadow(result):
            return
        with no_dispatch():
            if overload == "aten::nonzero":
                value = torch.ones(tuple(x.shape), dtype=torch.bool).nonzero()
                if value.shape[0] != result.shape[0]:
                    value = value[: result.shape[0]]
            elif overload == "torchvision::nms":
                value = torch.arange(result.shape[0])
            else:
                return
        with contextlib.suppress(TypeError):
            self.shadows[result] = value


# ops whose output size depends on the values of every input, floating-point ones included
_SELECTED_BY_VALUE = frozenset(
    {
        "aten::nonzero",
        "aten::argwhere",
        "aten::masked_select",
        "aten::index.Tensor",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "torchvision::nms",
    }
)


# ops whose output values do not depend on their tensor input's values (only its shape and
# dtype): their small outputs get values even when the input has none (HF's CTC models make
# an attention mask with ones_like of the audio when none is given)
_VALUE_FREE = frozenset(
    ("ones_like", "zeros_like", "full_like", "new_ones", "new_zeros", "new_full", "rand_like")
)

# Uniform random draws. A draw that Python reads decides control flow, and a trace of a few
# steps would take one branch at random where a run of many steps takes both: LayerDrop
# (``torch.rand([]) < layerdrop``: skip the layer; every use in transformers is written so)
# skipped a layer in some estimates of a model and not in others, and a random augmentation
# (``torch.rand(1) < p``: apply it) runs its work only below its probability. A draw reads
# as the top of its range (every layer runs) and, when Python read it, the estimate traces
# the alternative with the bottom of the range too (every augmentation applied) and keeps the
# larger: the steps that set a run's peak, whichever way the code is written.
_UNIFORM_DRAWS = frozenset(("rand", "rand_like", "uniform", "uniform_"))

# Integer draws: sequence lengths, counts, ids. One traced step sees one draw where a run's
# steps see many, and lengths drawn in every step set the peak at the longest draw. A draw
# whose values make a size (``pack_padded_sequence``'s rows, ``bincount``, a selection) is
# traced again with every value at the top of its range and the larger estimate kept (an
# integer Python reads counts: ``int(torch.randint(...))`` rows); one read only for a branch
# (a boolean: ``pad_token_id in input_ids``) keeps its values (ids at the top of a
# vocabulary would all be the last token, which multimodal models reserve for images).
_INTEGER_DRAWS = frozenset(("randint", "randint_like", "random_"))
INTEGER_DRAW = "integer draw"


def _top_of_integer_range(func: Any, args: Any, kwargs: Any, reals: tuple[Any, ...]) -> None:
    """Set the real values of an integer draw to the largest its range holds: ``high - 1``
    of ``randint``, ``to - 1`` of ``random_``; a draw over the dtype's whole range is
    left as drawn."""
    overload = func._overloadname
    if op_name(func) == "random_":
        if overload not in ("from", "to"):
            return
        high = _named_arg(func, args, kwargs, "to")
        if high is None:
            return
    else:
        high = _named_arg(func, args, kwargs, "high")
    for value in reals:
        if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
            with no_dispatch():
                value.fill_(int(high) - 1)


def _end_of_range(
    func: Any, args: Any, kwargs: Any, reals: tuple[Any, ...], top: bool = True
) -> None:
    """Set the real values of a uniform draw to the largest value below the top of its
    range (``[0, 1)``, or uniform's ``[from, to)``), in the draw's dtype, or (``top``
    False) to the bottom of the range."""
    low, high = 0.0, 1.0
    if op_name(func).startswith("uniform"):
        low = float(_named_arg(func, args, kwargs, "from"))
        high = float(_named_arg(func, args, kwargs, "to"))
    for value in reals:
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
            continue
        with no_dispatch():
            if not top:
                value.fill_(low)
                continue
            end = torch.tensor(high, dtype=value.dtype)
            below = torch.nextafter(end, torch.tensor(low, dtype=value.dtype))
            value.fill_(max(float(below), low))


# factories whose values are whatever the memory held: a shadow made by one and written by
# nothing the trace sees (a collective's output buffer) says nothing of the values
_UNWRITTEN = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"))

# A comparison with an infinite number has the same answer for every finite value (``x >
# inf`` is false): an optimizer told never to stop at a tolerance (LBFGS, see
# ``model_state._iterations_at_their_limit``) is traced so, whatever its values
_COMPARISONS = frozenset(("gt", "ge", "lt", "le"))


def _against_infinity(args: Any) -> tuple[Any, ...] | None:
    """A comparison's arguments with its tensor stood in for by zeros (finite values), when
    it compares with an infinite number."""
    first, other = args
    if not (
        isinstance(first, FakeTensor)
        and isinstance(other, float)
        and math.isinf(other)
        and fits_shadow(first)
    ):
        return None
    with no_dispatch():
        stand_in = torch.zeros(tuple(first.shape), dtype=first.dtype)
    return (stand_in, other)


def _value_free_args(name: str, args: Any) -> tuple[Any, ...] | None:
    """The arguments of a value-free op with its tensor input stood in for by zeros."""
    first = args[0]
    if not isinstance(first, FakeTensor) or any(isinstance(a, torch.Tensor) for a in args[1:]):
        return None
    shape = tuple(first.shape) if name.endswith("_like") else (0,)
    with no_dispatch():
        stand_in = torch.zeros(shape, dtype=first.dtype)
    return (stand_in, *args[1:])


def _integers_known(mode: DataDependentValues, args: Any, kwargs: Any) -> bool:
    """Whether every integer and boolean tensor input has values in the trace."""
    for a in (*args, *kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        for t in items:
            if (
                isinstance(t, FakeTensor)
                and not (t.dtype.is_floating_point or t.dtype.is_complex)
                and mode.shadows.get(t) is None
            ):
                return False
    return True


def _named_arg(func: Any, args: Any, kwargs: Any, name: str) -> Any:
    """The value of the argument ``name`` of an op call (its default when not passed)."""
    if name in kwargs:
        return kwargs[name]
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[position] if position < len(args) else argument.default_value
    return None


@contextlib.contextmanager
def fake_tensor_method(name: str, method: Callable[..., Any]) -> Iterator[None]:
    """``FakeTensor.<name>`` is ``method`` while the trace runs; put back after."""
    had = name in FakeTensor.__dict__
    original = FakeTensor.__dict__.get(name)
    setattr(FakeTensor, name, method)
    try:
        yield
    finally:
        if had:
            setattr(FakeTensor, name, original)
        else:
            delattr(FakeTensor, name)


def formatted_scalars() -> contextlib.AbstractContextManager[None]:
    """A 0-dim fake tensor formats as its value, as a real one does (``Tensor.__format__``
    calls ``.item()`` only for the plain ``Tensor`` type): ``f"expert_{idx}"`` names the
    expert the trace's values say (Switch Transformers picks its expert module so)."""

    def format_(self: FakeTensor, spec: str) -> str:
        if self.dim() == 0:
            return format(self.item(), spec)
        return torch.Tensor.__format__(self, spec)

    return fake_tensor_method("__format__", format_)


def host_arrays(mode: Any) -> contextlib.AbstractContextManager[None]:
    """``Tensor.numpy()`` of a fake tensor (``np.asarray`` of one; scipy's
    ``linear_sum_assignment`` on DETR's matching costs, a metric computed in numpy): its
    values where the trace has them, else zeros of its shape and dtype, and a finding names
    it. Code that hands numpy's results back as indices gets sizes right whatever the values
    (an assignment of rows to columns has min(rows, columns) pairs)."""

    def numpy_(self: FakeTensor, *, force: bool = False) -> Any:
        shadow = mode.shadows.get(self)
        with no_dispatch():
            if shadow is not None:
                return shadow.detach().cpu().numpy(force=force)
            mode._note_data_dependent("Tensor.numpy()", None)
            return torch.zeros(tuple(self.shape), dtype=self.dtype).numpy()

    return fake_tensor_method("numpy", numpy_)
