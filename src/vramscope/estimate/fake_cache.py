"""The fake-tensor cache with less overhead: torch's own cache key and cache-hit outputs, built
with fewer calls, and the optimizers' foreach ops answered without a meta function per
element. Every shortcut here gives what torch's own path gives (checked at first use)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

# ---- the fake-tensor cache, used with less overhead ------------------------------------------
#
# FakeTensorMode caches each op's output metadata under a key made of the op and the metadata
# of its arguments (``FakeTensorMode._cache_key``) and makes a cache hit's output from it.
# Building that key in Python was the largest single cost of a trace, and making the output the
# next. ``_fast_cache_key`` builds the *same* key -- the same tuple, element for element -- for
# the arguments a trace meets (fake tensors of the mode, numbers, dtypes, devices, lists of
# them), with fewer calls; anything else goes to torch's own method. ``TracingMode._cache_hit``
# looks it up in torch's cache as ``FakeTensorMode.dispatch`` would, and the output is made as
# torch makes it, its Python wrapper filled from a template (``TracingMode._wrap_meta``). The
# first calls of every op are checked against torch's key, and the first wrappers of every
# device against torch's constructor: one difference turns that fast path off for the rest of
# the process, so a torch that differs is only slower, never wrong. Misses, bypasses and
# anything unusual take torch's own path.

# torch's TensorMetadata fields, in order, as the fast key flattens them
_TENSOR_METADATA_FIELDS = (
    "dtype",
    "shape",
    "stride",
    "device",
    "layout",
    "memory_format",
    "storage_offset",
    "storage_bytes",
    "requires_grad",
    "is_quantized",
    "is_conj",
    "is_neg",
    "is_inference",
    "is_sparse",
    "is_coalesced",
    "dense_dim",
    "sparse_dim",
)
_PLAIN_ARGS = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)
_LENGTHS = [f"length_{n}" for n in range(1024)]  # beyond: made when needed
# The fast paths of this section, each on unless this torch lacks what it needs or a check
# found a difference (tests turn them off to compare): "key" the cache key and the cache-hit
# dispatch (and the foreach list cache, which needs the key), "wrap" the outputs of cache
# hits, "foreach" in-place foreach ops answered without their meta functions.
FAST_PATHS: dict[str, bool] = {"key": False, "wrap": True, "foreach": True}
try:
    from torch._prims_common import suggest_memory_format as _suggest_memory_format
    from torch._subclasses._fake_tensor_utils import _CacheKeyState
    from torch._subclasses.fake_tensor import TensorMetadata as _TensorMetadata
    from torch._subclasses.fake_tensor import _DispatchCacheKey, _DispatchCacheValidEntry
    from torch.fx.experimental.proxy_tensor import get_proxy_mode as _get_proxy_mode

    FAST_PATHS["key"] = (
        tuple(f.name for f in dataclasses.fields(_TensorMetadata)) == _TENSOR_METADATA_FIELDS
    )
except Exception:  # another torch: its own key and dispatch only
    pass


def _parameters(method: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return ()


# the methods the fast paths stand in for or call, as this torch has them; torch 2.15 took
# ``func`` out of the two cache-entry methods (a view is then known by the entry's view_idx)
_WITH_FUNC = ("self", "state", "entry", "key", "func", "args")
_WITHOUT_FUNC = ("self", "state", "entry", "key", "args")
CACHE_CALLS_TAKE_FUNC = _parameters(FakeTensorMode._output_from_cache_entry) != _WITHOUT_FUNC
_ENTRY_PARAMETERS = _WITH_FUNC if CACHE_CALLS_TAKE_FUNC else _WITHOUT_FUNC
FAST_PATHS["key"] = FAST_PATHS["key"] and (
    _parameters(FakeTensorMode._cache_key) == ("self", "state", "func", "args", "kwargs")
    and _parameters(FakeTensorMode._output_from_cache_entry) == _ENTRY_PARAMETERS
    and _parameters(FakeTensorMode._make_cache_entry)
    == ("self", "state", "key", "func", "args", "kwargs", "output")
)
FAST_PATHS["wrap"] = _parameters(
    getattr(FakeTensorMode, "_get_output_tensor_from_cache_entry", None)
) == _ENTRY_PARAMETERS and not getattr(
    getattr(sys.modules[FakeTensorMode.__module__], "FakeTensorConfig", None), "debug", True
)


def entry_arguments(state: Any, entry: Any, key: Any, func: Any, args: Any) -> tuple[Any, ...]:
    """The arguments of torch's cache-entry methods, as this torch takes them."""
    if CACHE_CALLS_TAKE_FUNC:
        return state, entry, key, func, args
    return state, entry, key, args


def _proxy_tracing() -> bool:
    """``get_proxy_mode() is not None`` (its pybind enum look-ups, once)."""
    if _PROXY_KEY is None:
        return _get_proxy_mode() is not None
    return (
        _pre_dispatch_modes().get(0) is not None
        or torch._C._get_dispatch_mode(_PROXY_KEY) is not None
    )


try:
    _PROXY_KEY: Any = torch._C._TorchDispatchModeKey.PROXY
    _pre_dispatch_modes = torch._ops.mode_stack_state_for_pre_dispatch
    _pre_dispatch_modes().get(0)
except Exception:  # another torch: ask get_proxy_mode
    _PROXY_KEY = None


class _UnusualArgument(Exception):
    """An argument the fast key does not handle: torch's own method builds the key."""


class _Sizes(tuple):  # type: ignore[type-arg]
    """The flattened shape and strides of a tensor's key, and its memory format."""

    memory_format: torch.memory_format | None


# (shape, strides) -> their part of the key: what it holds depends on nothing else (a strided
# tensor's suggested memory format and contiguity are functions of its shape and strides), and
# a trace meets a few thousand of them while it builds keys for hundreds of thousands of tensors
_SIZES: dict[tuple[Any, Any], _Sizes] = {}
_SIZES_KEPT = 65536


def _flatten_sizes(t: Any, shape: Any, stride: tuple[int, ...]) -> _Sizes:
    ndim = len(shape)
    memory_format = _suggest_memory_format(t) if ndim == 4 or ndim == 5 else torch.contiguous_format
    if not t.is_contiguous(memory_format=memory_format):
        memory_format = None
    length = _LENGTHS[ndim] if ndim < 1024 else f"length_{ndim}"
    flat: list[Any] = [torch.Size, length]
    for d in shape:
        flat += (int, d)
    flat += (tuple, length)
    for d in stride:
        flat += (int, d)
    sizes = _Sizes(flat)
    sizes.memory_format = memory_format
    if len(_SIZES) >= _SIZES_KEPT:
        _SIZES.clear()
    _SIZES[(tuple(shape), stride)] = sizes
    return sizes


def _flatten_tensor(mode: FakeTensorMode, out: list[Any], t: Any) -> None:
    """``extract_tensor_metadata(t)._flatten_into(out, ...)`` for a dense, non-symbolic fake
    tensor of ``mode``."""
    if (
        t.fake_mode is not mode
        or t.constant is not None
        or t.layout != torch.strided
        or t._has_symbolic_sizes_strides
    ):
        raise _UnusualArgument
    shape = t.shape
    stride = t.stride()
    sizes = _SIZES.get((shape, stride))
    if sizes is None:
        sizes = _flatten_sizes(t, shape, stride)
    out.append(t.dtype)
    out += sizes
    out += (
        t.device,
        torch.strided,
        sizes.memory_format,
        t.storage_offset(),
        t.untyped_storage().nbytes(),
        t.requires_grad,
        t.is_quantized,
        t.is_conj(),
        t.is_neg(),
        t.is_inference(),
        False,  # is_sparse
        None,  # is_coalesced
        None,  # dense_dim
        None,  # sparse_dim
    )


def _flatten_args(mode: FakeTensorMode, out: list[Any], args: Any) -> None:
    """``FakeTensorMode._prep_args_for_hash`` for a list or tuple of plain arguments."""
    n = len(args)
    out.append(type(args))
    out.append(_LENGTHS[n] if n < 1024 else f"length_{n}")
    _flatten_items(mode, out, args)


def _flatten_items(mode: FakeTensorMode, out: list[Any], args: Any) -> None:
    for arg in args:
        cls = type(arg)
        if cls in _PLAIN_ARGS:
            out.append(cls)
            out.append(arg)
        elif isinstance(arg, FakeTensor):
            _flatten_tensor(mode, out, arg)
        elif cls is list or cls is tuple or cls is torch.Size:
            _flatten_args(mode, out, arg)
        else:
            raise _UnusualArgument


def _fast_cache_key(
    mode: FakeTensorMode, func: Any, args: Any, kwargs: Any
) -> tuple[Any, ...] | None:
    """The tuple ``FakeTensorMode._cache_key`` would build, or None when an argument is
    unusual (a real tensor, a symbolic size, a constant, a sparse tensor, a callable...)."""
    key = [
        func,
        torch.get_default_dtype(),
        torch._C._get_default_device(),
        torch.is_inference_mode_enabled(),
        None,  # no ShapeEnv
        _proxy_tracing(),
    ]
    try:
        if args:
            if type(args) is not tuple and type(args) is not list:
                return None
            _flatten_args(mode, key, args)
        if kwargs:
            if type(kwargs) is not dict:
                return None
            key += (dict, f"length_{len(kwargs)}")
            for name in kwargs:
                if type(name) is not str:
                    return None
                key += (str, name)
            _flatten_items(mode, key, kwargs.values())
    except _UnusualArgument:
        return None
    return tuple(key)


# ---- foreach ops (the optimizers' updates) ----------------------------------------------------

_REAL_SCALARS = frozenset({int, float, bool})
_INPLACE_FOREACH: dict[Any, bool] = {}


def _is_inplace_foreach(func: Any) -> bool:
    """``aten::_foreach_*_`` ops that write their first list and return nothing."""
    known = _INPLACE_FOREACH.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = _INPLACE_FOREACH[func] = bool(
            schema is not None
            and schema.name.startswith("aten::_foreach_")
            and not schema.returns
            and schema.arguments
            and schema.arguments[0].alias_info is not None
            and schema.arguments[0].alias_info.is_write
        )
    return known


_RETURNS_LIST: dict[Any, bool] = {}
_BYPASS = object()
# entries of foreach ops that return lists (TracingMode._cached_list_dispatch), by cache key
_list_cache: dict[str, Any] = {"entries": {}}


def _returns_tensor_list(func: Any) -> bool:
    """``aten::_foreach_*`` ops that write nothing and return one list of tensors."""
    known = _RETURNS_LIST.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = False
        if (
            schema is not None
            and schema.name.startswith("aten::_foreach_")
            and len(schema.returns) == 1
            and not any(a.alias_info is not None for a in schema.arguments)
        ):
            with contextlib.suppress(Exception):
                known = schema.returns[0].type == torch._C.ListType.ofTensors()
        _RETURNS_LIST[func] = known
    return known


class FastForeach(FakeTensorMode):
    """The foreach ops of a :class:`~vramscope.estimate.trace.TracingMode`: lists cached as
    torch caches tuples, in-place updates answered from their arguments' metadata."""

    def _cached_list_dispatch(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """A foreach op that returns a list of new tensors (``_foreach_sqrt``...). torch's
        cache takes tuple outputs but not lists, so each call would run a Python meta function
        per element; here the list is cached as torch caches a tuple (the same entry, made by
        ``_make_cache_entry``), once the outputs synthesized from it are checked to have the
        storages the kernel made."""
        fast = (
            _fast_cache_key(self, func, args, kwargs)
            if FAST_PATHS["key"] and self.shape_env is None
            else None
        )
        if fast is None:
            return super().dispatch(func, types, args, kwargs)
        key = _DispatchCacheKey(fast)
        entries = _list_cache["entries"]
        entry = entries.get(key)
        if entry is _BYPASS:
            return super().dispatch(func, types, args, kwargs)
        state = _CacheKeyState(self.shape_env)
        if entry is not None:
            return [
                self._get_output_tensor_from_cache_entry(
                    *entry_arguments(state, info, key, func, args)
                )
                for info in entry.output_infos
            ]
        entry = self._deduplicated_entry(state, key, func, types, args, kwargs)
        if entry is not None:
            entries[key] = entry
            return [
                self._get_output_tensor_from_cache_entry(
                    *entry_arguments(state, info, key, func, args)
                )
                for info in entry.output_infos
            ]
        out = super().dispatch(func, types, args, kwargs)
        try:
            entry = self._list_entry(state, key, func, args, kwargs, out)
        except Exception:
            entry = None
        entries[key] = _BYPASS if entry is None else entry
        return out

    def _deduplicated_entry(
        self, state: Any, key: Any, func: Any, types: Any, args: Any, kwargs: Any
    ) -> Any | None:
        """The entry of a foreach call computed on one element of each kind: elements whose
        arguments have the same metadata (an optimizer's parameters come in a few shapes) get
        the same output metadata, as the kernel runs element by element. None when nothing
        repeats or anything is unusual."""
        lists = [
            (i, arg)
            for i, arg in enumerate((*args, *kwargs.values()))
            if type(arg) in (list, tuple)
        ]
        if not lists:
            return None
        n = len(lists[0][1])
        if n < 2 or any(len(arg) != n for _, arg in lists):
            return None
        firsts: dict[tuple[Any, ...], int] = {}
        position: list[int] = []
        try:
            for i in range(n):
                signature: list[Any] = []
                for _, arg in lists:
                    item = arg[i]
                    if type(item) is FakeTensor:
                        _flatten_tensor(self, signature, item)
                    elif type(item) in _REAL_SCALARS:
                        signature += (type(item), item)
                    else:
                        return None
                position.append(firsts.setdefault(tuple(signature), len(firsts)))
        except _UnusualArgument:
            return None
        if len(firsts) == n:
            return None
        representatives = [position.index(k) for k in range(len(firsts))]
        taken = {i: type(arg)(arg[r] for r in representatives) for i, arg in lists}
        everything = [taken.get(i, a) for i, a in enumerate((*args, *kwargs.values()))]
        sub_args = tuple(everything[: len(args)])
        sub_kwargs = dict(zip(kwargs, everything[len(args) :], strict=True))
        try:
            out = super().dispatch(func, types, sub_args, sub_kwargs)
            sub = self._list_entry(state, key, func, sub_args, sub_kwargs, out)
        except Exception:
            return None
        if sub is None:
            return None
        return _DispatchCacheValidEntry(
            output_infos=tuple(sub.output_infos[k] for k in position), is_output_tuple=True
        )

    def _list_entry(
        self, state: Any, key: Any, func: Any, args: Any, kwargs: Any, out: Any
    ) -> Any | None:
        if type(out) is not list or not out or any(type(t) is not FakeTensor for t in out):
            return None
        entry = self._make_cache_entry(state, key, func, args, kwargs, tuple(out))
        if len(entry.output_infos) != len(out):
            return None
        inputs = {
            t.untyped_storage()._cdata
            for arg in (*args, *kwargs.values())
            for t in (arg if isinstance(arg, (list, tuple)) else (arg,))
            if isinstance(t, torch.Tensor)
        }
        seen: set[int] = set()
        for made, info in zip(out, entry.output_infos, strict=True):
            if info.metadata is None or info.inplace_idx is not None or info.view_idx is not None:
                return None
            storage = made.untyped_storage()
            if storage._cdata in inputs or storage._cdata in seen:
                return None
            seen.add(storage._cdata)
            again = self._get_output_tensor_from_cache_entry(
                *entry_arguments(state, info, key, func, args)
            )
            if (
                again.untyped_storage().nbytes() != storage.nbytes()
                or again.storage_offset() != made.storage_offset()
            ):
                return None
        return entry

    def _plain_foreach(self, args: Any, kwargs: dict[str, Any]) -> bool:
        """An in-place foreach op (``_foreach_add_``, ``_foreach_lerp_``...: the optimizers'
        updates) whose lists are fake tensors of this mode that agree, element for element, in
        shape, floating dtype and device, with real-number scalars: its fake kernel would check
        that and return None; each element of each list would otherwise pass through a Python
        meta function (most of an optimizer's first step). Anything else takes the fake path."""
        length = -1
        lists: list[Any] = []
        for arg in (*args, *kwargs.values()):
            if type(arg) is list or type(arg) is tuple:
                if length < 0:
                    length = len(arg)
                if len(arg) != length or not length:
                    return False
                if isinstance(arg[0], torch.Tensor):
                    lists.append(arg)
                elif not all(type(x) in _REAL_SCALARS for x in arg):
                    return False
            elif type(arg) not in _REAL_SCALARS:
                return False
        if not lists:
            return False
        for t in (t for tensors in lists for t in tensors):
            if (
                type(t) is not FakeTensor
                or t.fake_mode is not self
                or t.constant is not None
                or not t.is_floating_point()
                or t.layout != torch.strided
                or t._has_symbolic_sizes_strides
            ):
                return False
        first = lists[0]
        for tensors in lists[1:]:
            for a, b in zip(first, tensors, strict=True):
                if a.shape != b.shape or a.dtype != b.dtype or a.fake_device != b.fake_device:
                    return False
        return True
