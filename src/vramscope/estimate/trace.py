"""Trace real steps of a workload with fake tensors on an emulated CUDA device.

The user's build function and the standard step (``workload.StepRunner``) run unchanged,
under a :class:`torch._subclasses.fake_tensor.FakeTensorMode`: every tensor is a shape, a
dtype and a device with no data, so nothing proportional to the model is allocated. The
device passed to ``build`` is ``cuda:0`` even when only the CPU build of torch is installed
(:mod:`~vramscope.estimate.cuda_device`). So CUDA autocast runs its real op lists and cast
cache, GradScaler runs its real kernels, activation checkpointing saves and restores CUDA RNG
state, and autograd runs backward on its device thread as on a GPU. Every storage a CUDA tensor gets is one allocation; its
Python weak reference says when it is freed. The result is the ordered list of allocations
and frees, with the phase, step and module of each, that :mod:`vramscope.estimate.allocator`
replays. CUDA-specific memory the fake kernels do not show is added by
:mod:`vramscope.estimate.kernels`.

The pieces: :mod:`~vramscope.estimate.cuda_device` (the emulated GPU),
:mod:`~vramscope.estimate.recorder` (allocations and frees),
:mod:`~vramscope.estimate.fake_cache` (torch's fake-tensor cache with less overhead),
:mod:`~vramscope.estimate.scalars` (data-dependent values),
:mod:`~vramscope.estimate.model_state` (what the model and optimizer hold); here the fake
mode that joins them and the run of the workload's steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import (
    _DISPATCH_META_HANDLERS,
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._mode_utils import no_dispatch
from torch.utils.weak import WeakIdKeyDictionary

from vramscope.errors import VramscopeError, WorkloadError
from vramscope.estimate import cuda_rules, kernels, rnn, scalars
from vramscope.estimate.cuda_device import CUDA, cuda_emulation
from vramscope.estimate.fake_cache import (
    CACHE_CALLS_TAKE_FUNC,
    FAST_PATHS,
    FastForeach,
    _fast_cache_key,
    _is_inplace_foreach,
    _returns_tensor_list,
    entry_arguments,
)
from vramscope.estimate.generation import GenerationTracer
from vramscope.estimate.initializers import metadata_only_initializers
from vramscope.estimate.model_state import (
    _built_state,
    _check_device,
    _force_foreach,
    _iterations_at_their_limit,
    _label_persistent,
    _module_table,
)
from vramscope.estimate.profiles import GpuProfile
from vramscope.estimate.recorder import BlockMeta, Recorder, Trace, TraceError
from vramscope.estimate.scalars import (
    HEAVY,
    INTEGER_DRAW,
    DataDependentValues,
    _user_location,
)
from vramscope.estimate.torch_support import check_torch_version
from vramscope.estimate.transformers_eager import eager_transformers
from vramscope.workload import StepRunner, Workload, WorkloadSpec

try:  # torch's fake-tensor cache, for the fast paths (off where this torch lacks it)
    from torch._subclasses._fake_tensor_utils import _CacheKeyState
    from torch._subclasses.fake_tensor import (
        _DISPATCH_HANDLE_DIRECTLY,
        _DispatchCacheKey,
        _DispatchCacheValidEntry,
    )
    from torch._subclasses.fake_tensor import log as _fake_log
except Exception:  # FAST_PATHS["key"] is off then (fake_cache)
    pass

__all__ = ["CUDA", "BlockMeta", "Recorder", "Trace", "TraceError", "TracingMode", "trace_workload"]

aten = torch.ops.aten
_ADD = aten.add.Tensor
# answered from the fake tensor's metadata, as FakeTensorMode.dispatch does first
_META_HANDLERS: dict[Any, Any] = dict(_DISPATCH_META_HANDLERS)
_FAST_KEY_CHECKS = 2  # calls of each op whose fast key is compared with torch's
_KEY_CHECKED: dict[Any, int] = {}  # op -> calls compared so far
_LOCAL_SCALAR_DENSE = aten._local_scalar_dense.default
_FUSED_SDP_CHOICE = aten._fused_sdp_choice.default
# ops whose arguments a GPU refuses by their values or dtypes, which their fake kernels do
# not check: the estimate refuses them as the step would fail (scalars.refuse_invalid)
_CHECKED = {aten.embedding.default: "embedding", aten.index_add.default: "index_add"}
# comparisons that answer one Python bool from the values of whole tensors: computed from
# the values where the trace has them, else assumed true (validation code passes; an
# orthogonal parametrization's check of its initial weight)
_WHOLE_COMPARISONS = {aten.equal.default: "aten.equal", aten.allclose.default: "aten.allclose"}
_COMPOSITE: dict[Any, bool] = {}  # op -> has a CompositeImplicitAutograd kernel
_MISS = object()  # not a plain cache hit (TracingMode._cache_hit)
# ops that read a sparse tensor's parts or metadata (their meta kernels are right: views)
_SPARSE_METADATA = frozenset(
    getattr(aten, name).default
    for name in (
        "_indices",
        "_values",
        "indices",
        "values",
        "_nnz",
        "sparse_dim",
        "dense_dim",
        "is_coalesced",
        "crow_indices",
        "col_indices",
        "ccol_indices",
        "row_indices",
        "_coalesced_",
        "detach",
        "alias",
    )
)


def _touches_sparse(args: Any, kwargs: dict[str, Any]) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and a.layout != torch.strided:
            return True
        if isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, torch.Tensor) and x.layout != torch.strided:
                    return True
    return False


# ops the trace runs itself: cuDNN's RNNs, and ops whose fake kernel is not CUDA's
_OWN_KERNELS = {**rnn.KERNELS, **cuda_rules.KERNELS}
# FakeTensors of cache hits made without the Python constructor (TracingMode._wrap_meta)
_WRAP_CHECKS = 8  # wraps per mode and device compared with the constructor's
_NO_TEMPLATE = object()


# ============================================================================================
# The fake-tensor mode


class TracingMode(DataDependentValues, FastForeach, FakeTensorMode):
    """FakeTensorMode that records CUDA storages, answers ``.item()`` with plausible values
    and picks the attention kernels the profiled GPU would run."""

    def __init__(
        self,
        recorder: Recorder,
        profile: GpuProfile,
        variant: str = HEAVY,
        draws_at_top: bool = False,
    ) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.recorder = recorder
        self.profile = profile
        # keyed by identity: a tensor's == is an op, which would come back here
        self.shadows: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.producers: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._init_values(variant, draws_at_top)
        self._local = threading.local()
        self._fake_templates: dict[torch.device, Any] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> TracingMode:
        # a fake tensor's ``__dict__`` names its mode, and ``copy.deepcopy`` of a module
        # (``nn.TransformerEncoder`` clones its layer so) copies that dict: the copies belong
        # to this same mode, as a GPU's copies belong to the same device
        return self

    def can_run_unsafe_fallback(self, func: Any) -> bool:
        # torch would run an op without a fake kernel on the real device, which is absent:
        # ``dispatch`` runs its CPU kernel instead (cuda_rules.run_on_cpu)
        return False

    @property
    def avoid_device_init(self) -> bool:  # never move constants to the (absent) device
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing here is compiled: skip the torch._dynamo.disable wrapper on every op
        return False

    def _cache_key(self, *arguments: Any) -> Any:
        """torch's cache key, built by ``_fast_cache_key`` where it can (the same key)."""
        if not FAST_PATHS["key"] or self.shape_env is not None:
            return super()._cache_key(*arguments)
        state, func, args, kwargs = arguments
        missed = getattr(self._local, "missed", None)
        if (
            missed is not None
            and missed[0] is func
            and missed[1] is args
            and (missed[2] is kwargs or not (missed[2] or kwargs))
        ):
            # the key ``_cache_hit`` just built for this call and did not find
            self._local.missed = None
            return _DispatchCacheKey(missed[3])
        fast = _fast_cache_key(self, func, args, kwargs)
        if fast is None:
            return super()._cache_key(state, func, args, kwargs)
        count = _KEY_CHECKED.get(func, 0)
        if count < _FAST_KEY_CHECKS:
            _KEY_CHECKED[func] = count + 1
            try:
                key = super()._cache_key(state, func, args, kwargs)
            except Exception:
                FAST_PATHS["key"] = False
                raise
            if key.key != fast:
                FAST_PATHS["key"] = False
            return key
        return _DispatchCacheKey(fast)

    def __torch_dispatch__(  # type: ignore[override]
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return self.dispatch(func, types, args, kwargs)

    def _get_output_tensor_from_cache_entry(self, *arguments: Any) -> Any:
        """A cache hit's new output, as torch makes it (a meta tensor of the cached metadata,
        on the viewed storage for a view op, wrapped as a fake tensor), with less overhead;
        in-place and symbolic entries go to torch's own method."""
        if not FAST_PATHS["wrap"]:
            return super()._get_output_tensor_from_cache_entry(*arguments)
        entry, args = arguments[1], arguments[-1]
        if CACHE_CALLS_TAKE_FUNC:
            func = arguments[3]
            plain = isinstance(func, torch._ops.OpOverload)
            is_view = plain and func.is_view
        else:
            plain, is_view = True, entry.view_idx is not None
        metadata = entry.metadata
        if (
            metadata is None
            or entry.inplace_idx is not None
            or self.shape_env is not None
            or metadata.layout != torch.strided
            or not plain
        ):
            return super()._get_output_tensor_from_cache_entry(*arguments)
        shape, stride, offset = metadata.shape, metadata.stride, metadata.storage_offset
        storage = args[entry.view_idx].untyped_storage() if is_view else None
        previous = self.in_kernel_invocation
        # what in_kernel_invocation_manager(self) does
        with torch._C._DisableTorchDispatch():
            self.in_kernel_invocation = True
            with torch._C._PreserveDispatchKeyGuard():
                torch._C._set_meta_in_tls_dispatch_include(True)
                try:
                    empty = torch.empty_strided(
                        shape,
                        stride,
                        dtype=metadata.dtype,
                        layout=metadata.layout,
                        device="meta",
                        requires_grad=metadata.requires_grad,
                    )
                    if metadata.is_conj:
                        torch._C._set_conj(empty, True)
                    if metadata.is_neg:
                        torch._C._set_neg(empty, True)
                    if storage is not None:
                        empty.set_(storage, offset, shape, stride)
                finally:
                    self.in_kernel_invocation = previous
        return self._wrap_meta(empty, metadata.device)

    def _wrap_meta(self, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        """``FakeTensor(self, elem, device)``, with the Python part of the constructor replaced
        by a copy of the attributes a first ``FakeTensor(...)`` of this mode and device got
        (all None but the device and the mode; anything else keeps the constructor). The first
        wraps of every device are compared with the constructor's."""
        template = self._fake_templates.get(device, _NO_TEMPLATE)
        if template is _NO_TEMPLATE:
            made = FakeTensor(self, elem, device)
            state = dict(made.__dict__)
            ok = (
                FAST_PATHS["wrap"]
                and device.type != "meta"
                and state.get("_fake_device") == device
                and state.get("fake_mode") is self
                and all(
                    v is None for k, v in state.items() if k not in ("_fake_device", "fake_mode")
                )
            )
            self._fake_templates[device] = (state, [_WRAP_CHECKS]) if ok else None
            return made
        if template is None or not FAST_PATHS["wrap"]:
            return FakeTensor(self, elem, device)
        state, checks = template
        made = torch.Tensor._make_subclass(
            FakeTensor,
            elem,
            elem.requires_grad,
            dispatch_device=True,
            device_for_backend_keys=device,
        )
        if not self._allow_unsafe_data_ptr_access:
            torch._C._set_throw_on_mutable_data_ptr(made)
        else:
            torch._C._set_warn_deprecated_on_mutable_data_ptr(made)
        made.__dict__.update(state)
        made.__init__()
        if checks[0]:
            checks[0] -= 1
            reference = FakeTensor(self, elem, device)
            if (
                reference.__dict__ != made.__dict__
                or torch._C._dispatch_keys(reference) != torch._C._dispatch_keys(made)
                or reference.requires_grad != made.requires_grad
            ):
                FAST_PATHS["wrap"] = False
                self._fake_templates[device] = None
                return reference
        return made

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        handler = _META_HANDLERS.get(func)
        if handler is not None:
            # metadata queries (``prim.device`` above all: about half of all the ops the
            # autograd engine dispatches): no output, no allocation, nothing to record
            return handler(args)
        kwargs = kwargs or {}
        if func is _LOCAL_SCALAR_DENSE:
            return self._scalar(args[0])
        if func in _CHECKED:
            self.refuse_invalid(_CHECKED[func], args)
        if func is _FUSED_SDP_CHOICE:
            return kernels.choose_sdpa_backend(self.profile, self.recorder, *args, **kwargs)
        local = self._local
        if getattr(local, "eager", False) and not getattr(local, "depth", 0):
            composite = _COMPOSITE.get(func)
            if composite is None:
                composite = _COMPOSITE[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
                    func.name(), DispatchKey.CompositeImplicitAutograd
                )
            if composite:
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        if func in _WHOLE_COMPARISONS:
            shadow = self._shadow_args(args)
            if shadow is not None:
                with no_dispatch():
                    return bool(func(*shadow, **kwargs))
            self._note_data_dependent(_WHOLE_COMPARISONS[func], None)
            return True
        own = _OWN_KERNELS.get(func)
        # sparse kernels' output sizes depend on their indices (coalescing merges duplicates),
        # which their meta kernels do not know: their CPU kernels run instead, on inputs with
        # distinct indices (nothing merged: the most entries), as for ops without a fake kernel
        sparse = (
            self.recorder.sparse_seen
            and func not in _SPARSE_METADATA
            and _touches_sparse(args, kwargs)
        )
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        try:
            if own is not None:
                out = own(self, args, kwargs)
            elif sparse:
                out = cuda_rules.run_on_cpu(
                    self, func, args, kwargs, _user_location() or "the standard step"
                )
            elif (
                FAST_PATHS["foreach"]
                and _is_inplace_foreach(func)
                and self._plain_foreach(args, kwargs)
            ):
                out = None  # what the fake kernel returns, after its checks would pass
            elif FAST_PATHS["key"] and _returns_tensor_list(func):
                out = self._cached_list_dispatch(func, types, args, kwargs)
            else:
                out = self._cache_hit(func, args, kwargs)
                if out is _MISS:
                    try:
                        out = super().dispatch(func, types, args, kwargs)
                    finally:
                        local.missed = None
        except DynamicOutputShapeException:
            out = self._dynamic_shape(func, types, args, kwargs)
        except UnsupportedOperatorException:
            out = cuda_rules.run_on_cpu(
                self, func, args, kwargs, _user_location() or "the standard step"
            )
        except DataDependentOutputException as exc:
            where = _user_location() or "the standard step"
            raise TraceError(
                f"{func} needs the values of a tensor, which an estimate does not have "
                f"(at {where}): {exc}"
            ) from None
        finally:
            local.depth = depth
        if depth:
            # an op the fake mode runs to compute another (a Python decomposition or meta
            # function): on the GPU it is inside one kernel, so it allocates nothing of its own
            return out
        recorder = self.recorder
        if isinstance(out, torch.Tensor):
            recorder.see(out, func.__name__)
            # autograd sums two gradients with grad mode off (InputBuffer::accumulate adds in
            # place only then); an add with grad mode on is forward code run again inside
            # backward (activation checkpointing's recomputation): a plain new tensor
            if (
                func is _ADD
                and recorder.in_backward
                and recorder.recording
                and not torch.is_grad_enabled()
            ):
                with recorder.lock:
                    recorder.gradient_sum(out, args)
            outs = (out,)
        elif isinstance(out, (tuple, list)):
            outs = tuple(out)
            for t in outs:
                if isinstance(t, torch.Tensor):
                    recorder.see(t, func.__name__)
                elif isinstance(t, (tuple, list)):
                    for u in t:
                        if isinstance(u, torch.Tensor):
                            recorder.see(u, func.__name__)
        else:
            outs = ()
        if recorder.recording:
            kernels.after_op(self.profile, recorder, func, args, kwargs, out)
            if own is not None and func in rnn.KERNELS:
                rnn.scratch(recorder, func, args, out)
        self._track_small(func, args, kwargs, outs)
        return out

    def _cache_hit(self, func: Any, args: Any, kwargs: Any) -> Any:
        """``FakeTensorMode.dispatch`` when the op's output is in torch's cache: the same
        lookup and the same output, without the per-op logging context, the key wrapper and
        the cache-key state object; ``_MISS`` when it is not a plain cache hit (a miss, a
        bypass, an op torch answers directly, debug logging or cross-checks on), for torch's
        own path."""
        if (
            not FAST_PATHS["key"]
            or self.shape_env is not None
            or not self.cache_enabled
            or self.cache_crosscheck_enabled
            or func in _DISPATCH_HANDLE_DIRECTLY
            or _fake_log.isEnabledFor(logging.DEBUG)
            or _KEY_CHECKED.get(func, 0) < _FAST_KEY_CHECKS
        ):
            return _MISS
        fast = _fast_cache_key(self, func, args, kwargs)
        if fast is None:
            return _MISS
        key = _DispatchCacheKey(fast)
        entry = FakeTensorMode.cache.get(key)
        if entry is None:
            # torch's dispatch, next, needs this key: ``_cache_key`` takes it from here
            self._local.missed = (func, args, kwargs, fast)
            return _MISS
        if type(entry) is not _DispatchCacheValidEntry:
            return _MISS
        output = self._output_from_cache_entry(
            *entry_arguments(_CacheKeyState(None), entry, key, func, args)
        )
        FakeTensorMode.cache_hits += 1
        return output


# ============================================================================================
# Running the workload


class _PhaseListener:
    """Phase marks from the same global hooks the measuring session uses; gradients and
    optimizer state are labelled when backward and the optimizer end."""

    def __init__(self, recorder: Recorder, workload: Workload) -> None:
        self.recorder = recorder
        self.workload = workload

    def on_forward_start(self, module: torch.nn.Module) -> None:
        if self.recorder.phase != "forward":
            self.recorder.set_phase("forward")

    def on_backward_start(self) -> None:
        self.recorder.in_backward += 1
        self.recorder.set_phase("backward")

    def on_backward_end(self) -> None:
        self.recorder.in_backward -= 1
        _label_persistent(self.recorder, self.workload)

    def on_optimizer_start(self, optimizer: torch.optim.Optimizer) -> None:
        self.recorder.set_phase("optimizer")

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer) -> None:
        _label_persistent(self.recorder, self.workload)

    def on_zero_grad(self) -> None:
        self.recorder.set_phase("zero_grad")

    def on_data(self, loader_id: int | None) -> None:
        self.recorder.set_phase("data")

    def on_loader_iter(self, loader: Any) -> None:
        return None

    def on_oom_in_module(self, module: torch.nn.Module) -> None:
        return None


@contextlib.contextmanager
def _patched_swap(mode: TracingMode) -> Iterator[None]:
    """``Module._apply`` swaps fake parameters (``model.to(device)``, ``.half()``); the fake
    mode's memo holds weak references to them, which swapping refuses. Drop those memo
    entries first. A parameter something else still holds (the old ``nn.utils.weight_norm``'s
    computed weight, a TorchScript module's C++ side) cannot be swapped at all: it changes in
    place instead, as ``param.data = ...`` changes a real one in ``.to()``."""
    original = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        memo = mode.fake_tensor_converter.tensor_memo
        for key, value in list(memo.items()):
            if value is t1 or value is t2:
                del memo[key]
        for t in (t1, t2):
            mode.shadows.pop(t, None)
            mode.producers.pop(t, None)
            _forget_constant(mode, t)
        try:
            return original(t1, t2)
        except RuntimeError:
            if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)):
                raise
        t1.data = t2  # (the real tensor's behaviour: its storage, dtype and device replaced)
        t1.fake_device = t2.fake_device
        t1.constant = t2.constant
        return None

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _forget_constant(mode: TracingMode, tensor: torch.Tensor) -> None:
    """A fake tensor made from a Python number (CLIP's ``logit_scale =
    nn.Parameter(torch.tensor(2.6592))``) keeps its value as a constant, and the converter a
    weak reference to it among its constants' aliases: drop that reference, or swapping the
    parameter refuses."""
    constant = getattr(tensor, "constant", None) if isinstance(tensor, FakeTensor) else None
    mapping = getattr(mode.fake_tensor_converter, "constant_storage_mapping", None)
    if constant is None or not mapping:
        return
    from torch.multiprocessing.reductions import StorageWeakRef

    key = StorageWeakRef(constant._typed_storage())
    refs = mapping.get(key)
    if refs is None:
        return
    kept = [ref for ref in refs if ref() is not tensor]
    if kept:
        mapping[key] = kept
    else:
        del mapping[key]


@contextlib.contextmanager
def _module_stack(recorder: Recorder, names: dict[int, str]) -> Iterator[None]:
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    def pre(module: torch.nn.Module, _args: Any) -> None:
        recorder.module_stack.append(names.get(id(module), type(module).__name__))

    def post(module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if recorder.module_stack:
            recorder.module_stack.pop()

    handles = [
        register_module_forward_pre_hook(pre),
        register_module_forward_hook(post, always_call=True),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        recorder.module_stack.clear()


def _share_higher_order_rules() -> None:
    """Higher-order ops (``flex_attention`` and its backward, ``cond``, ...) look their fake
    rule up by the mode's exact class: the tracing mode takes ``FakeTensorMode``'s, which
    makes the outputs only. The ops in ``_EAGER_HIGHER_ORDER`` run as a GPU runs them
    without ``torch.compile``: their eager implementation, op by op (:func:`_run_eagerly`)."""
    for op in list(getattr(torch._ops, "_higher_order_ops", {}).values()):
        table = getattr(op, "python_key_table", None)
        if not isinstance(table, dict) or TracingMode in table:
            continue
        eager = getattr(op, "py_kernels", {}).get(DispatchKey.CompositeExplicitAutograd)
        if getattr(op, "_name", None) in _EAGER_HIGHER_ORDER and eager is not None:
            table[TracingMode] = functools.partial(_run_eagerly, eager)
        elif FakeTensorMode in table:
            table[TracingMode] = table[FakeTensorMode]


# Higher-order ops that a GPU runs through their eager implementation when not compiled:
# FlexAttention's materialises the (B, H, L, L) scores in float32 and, in backward,
# recomputes them (``sdpa_dense``, ``sdpa_dense_backward``)
_EAGER_HIGHER_ORDER = frozenset({"flex_attention", "flex_attention_backward"})


def _run_eagerly(eager: Any, mode: TracingMode, *args: Any, **kwargs: Any) -> Any:
    """A higher-order op's eager implementation under the tracing mode: every op it runs is
    recorded, and composite ops (``matmul``, ``to``), which reach the mode there because
    the op runs below autograd, are decomposed into the ops a GPU runs (the copies that
    ``reshape`` makes for ``bmm``, the cuBLAS workspace of the thread)."""
    local = mode._local
    previous = getattr(local, "eager", False)
    local.eager = True
    try:
        with mode:
            return eager(*args, **kwargs)
    finally:
        local.eager = previous


@contextlib.contextmanager
def _flex_attention_uncompiled() -> Iterator[None]:
    """``flex_attention`` called without ``torch.compile`` wraps its higher-order op in
    ``torch.compile(backend="eager")`` only to capture the score function as a graph; the op
    then runs its eager implementation. Dynamo would keep the first call's inputs (here fake
    tensors of the trace) alive in its cache, where a GPU's run keeps only Dynamo's own fake
    copies: the op is called directly instead, as torch's debugging switch does (the same
    ops, the same memory)."""
    module = sys.modules.get("torch.nn.attention.flex_attention")
    if module is None:
        with contextlib.suppress(ImportError):
            import torch.nn.attention.flex_attention as module
    name = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"
    if module is None or not hasattr(module, name):
        yield
        return
    previous = getattr(module, name)
    setattr(module, name, True)
    try:
        yield
    finally:
        setattr(module, name, previous)


@contextlib.contextmanager
def _fake_tensor_methods(mode: TracingMode) -> Iterator[None]:
    """Methods of a fake tensor that behave as a real tensor's while tracing: its deep copy,
    its format, its numpy array, its pinned host memory."""
    with (
        _fake_constants_deep_copy(),
        scalars.formatted_scalars(),
        scalars.host_arrays(mode),
        _pinned_host_memory(),
        _streams_recorded(),
    ):
        yield


def _pinned_host_memory() -> contextlib.AbstractContextManager[None]:
    """``Tensor.pin_memory()`` (``DataLoader(pin_memory=True)``, a batch pinned before
    ``.to(device, non_blocking=True)``), which fake tensors do not implement: page-locked
    host memory, none of the device's; the tensor stands for its pinned copy."""

    def pin_memory(self: FakeTensor, *args: Any, **kwargs: Any) -> FakeTensor:
        if self.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
        return self

    return scalars.fake_tensor_method("pin_memory", pin_memory)


def _streams_recorded() -> contextlib.AbstractContextManager[None]:
    """``Tensor.record_stream(stream)``: on a GPU it keeps a block from reuse until the
    stream's work is done; the emulated streams' work is always done (allocations here
    never wait), so it changes nothing."""

    def record_stream(self: FakeTensor, stream: Any) -> None:
        return None

    return scalars.fake_tensor_method("record_stream", record_stream)


def _fake_constants_deep_copy() -> contextlib.AbstractContextManager[None]:
    """``copy.deepcopy`` of a module holding a fake tensor made from a Python number
    (BatchNorm's ``num_batches_tracked``, ``torch.tensor(0)``): the fake tensor keeps that
    real value in its ``constant``, and copying it under the fake mode would give a fake
    tensor a real CPU storage (torch refuses). The copy's constant is cloned for real; the
    rest is torch's own deep copy. An EMA copy of a model (``copy.deepcopy(model)``), timm's
    pruned models and ``nn.TransformerEncoder``'s layers are made so."""

    def deep_copy(self: FakeTensor, memo: dict[int, Any]) -> Any:
        constant = getattr(self, "constant", None)
        if isinstance(constant, torch.Tensor) and id(constant) not in memo:
            with no_dispatch():
                memo[id(constant)] = constant.clone()
        return torch.Tensor.__deepcopy__(self, memo)

    return scalars.fake_tensor_method("__deepcopy__", deep_copy)


@contextlib.contextmanager
def _quiet_fake_tensor_warnings() -> Iterator[None]:
    """Warnings about fake tensors themselves, not the user's code: a deep copy reads a fake
    tensor's data pointer (``Tensor.__deepcopy__``), sparse kernels run without invariant
    checks, a meta kernel's error is logged."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    # a meta kernel that raises is logged with its traceback before the error reaches the
    # user's code, which may catch it (a shape check); the trace reports what is not caught
    logger.setLevel(max(level, logging.CRITICAL))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _compiled_code_runs_eagerly() -> Iterator[None]:
    """``torch.compile`` (of the model, of a function the model calls, inside ``build()`` or
    the step) is not traced: under ``set_stance("force_eager")`` every compiled callable runs
    its original Python code, op by op, as eager PyTorch runs it."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    with (
        _torchscript_unfused(),
        set_stance("force_eager") if set_stance else contextlib.nullcontext(),
    ):
        yield


@contextlib.contextmanager
def _torchscript_unfused() -> Iterator[None]:
    """TorchScript (a ``torch.jit.script``'ed module or function) runs op by op too: its
    fusers would compile CUDA kernels for the emulated device, with no driver to load."""
    switches = [
        (torch._C._jit_texpr_fuser_enabled, torch._C._jit_set_texpr_fuser_enabled),
        (torch._C._jit_can_fuse_on_gpu, torch._C._jit_override_can_fuse_on_gpu),
        (torch._C._jit_can_fuse_on_cpu, torch._C._jit_override_can_fuse_on_cpu),
    ]
    before = [read() for read, _ in switches]
    for _, write in switches:
        write(False)
    try:
        yield
    finally:
        for (_, write), value in zip(switches, before, strict=True):
            write(value)


# micro-batches of an accumulating step traced: from the second on, each holds what the one
# before held (the gradients exist and are summed in place), so more repeat it exactly; an
# accumulation of thousands (an effective batch of millions) would otherwise trace them all
TRACED_MICRO_BATCHES = 4

_COMPILED_NOTE = (
    "{what} is compiled (torch.compile): estimated as its eager original; the compiled "
    "code fuses operations and usually keeps less memory than this in its steady steps, but "
    "its first step autotunes its kernels, each timing writing a buffer the size of the "
    "GPU's L2 cache (measured on an H200: 60 MiB blocks, a small MLP's first step at 134 MB "
    "against 79 MB after): a small model's first step can peak above this estimate"
)


def _eager_original(workload: Workload, recorder: Recorder) -> Workload:
    """A model compiled in ``build()`` is estimated as the module it wraps (its names are
    the original's), and the report says so."""
    model = workload.model
    compiled = [
        name or f"the model ({type(getattr(module, '_orig_mod', module)).__name__})"
        for name, module in model.named_modules()
        if hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None)
    ]
    for fn in (workload.loss, workload.step):
        if fn is not None and hasattr(fn, "_torchdynamo_orig_callable"):
            compiled.append(getattr(fn, "__name__", "the loss"))
    if not compiled:
        return workload
    recorder.notes.append(_COMPILED_NOTE.format(what=", ".join(dict.fromkeys(compiled))))
    while hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
        model = model._orig_mod
    if model is workload.model:
        return workload

    return dataclasses.replace(workload, model=model)


@contextlib.contextmanager
def _storage_resizes(recorder: Recorder) -> Iterator[None]:
    """``UntypedStorage.resize_`` reaches no op of the fake mode: tell the recorder (FSDP
    frees unsharded parameters by resizing their storage to 0, and refills them so)."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        out = original(storage, size)
        recorder.storage_resized(storage)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


Setup = Callable[[Workload, Recorder], Workload]


@contextlib.contextmanager
def _seeded_host_rng() -> Iterator[None]:
    """The same random draws in every estimate of a workload (sizes drawn at random in its
    batch, a packed sequence's lengths: estimates of one workload differed by 5 %), from the
    CPU's generator seeded here; the caller's generator state is restored after. The GPU's
    generator is not touched."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(0)
        yield


def trace_workload(
    spec: WorkloadSpec,
    batch_size: int,
    profile: GpuProfile,
    precision: str | None = None,
    accumulate: int | None = None,
    steps: int = 2,
    setup: Setup | None = None,
    variant: str = HEAVY,
    draws_at_top: bool = False,
) -> Trace:
    """Build the workload and trace ``steps`` standard steps on the emulated GPU.

    ``setup`` changes the built workload while the trace records (after what the build left
    on the device, before the first step): wrapping the model in DDP, for one. ``variant``:
    how values the trace cannot know are assumed (:mod:`~vramscope.estimate.scalars`):
    ``"heavy"`` (the most memory) or ``"light"``; ``draws_at_top``: the steps' random
    integer draws read as the top of their range (:data:`~vramscope.estimate.scalars.INTEGER_DRAW`)."""
    import time

    check_torch_version()
    _share_higher_order_rules()
    if steps < 1:
        raise VramscopeError(f"steps must be 1 or more, not {steps}")
    start = time.perf_counter()
    kernels.register_cuda_placeholders()
    recorder = Recorder(profile)
    mode = TracingMode(recorder, profile, variant, draws_at_top)
    step_starts: list[int] = []
    old_limit = sys.getrecursionlimit()
    with (
        _seeded_host_rng(),
        cuda_emulation(profile, recorder),
        _patched_swap(mode),
        metadata_only_initializers(mode, mode.shadows),
        mode,
        _storage_resizes(recorder),
        kernels.AttentionKernels(profile, recorder),
        rnn.CudnnRnns(profile, recorder, mode.shadows, mode.sized_by),
        _flex_attention_uncompiled(),
        _compiled_code_runs_eagerly(),
        _quiet_fake_tensor_warnings(),
        _fake_tensor_methods(mode),
    ):
        from vramscope.workload import build_workload

        try:
            workload = build_workload(spec.builder, batch_size, CUDA, spec.spec, precision)
        except WorkloadError as exc:
            raise _explain_build_error(exc, spec.spec) from None
        workload = workload.with_overrides(precision=precision, accumulate=accumulate)
        recorder.notes.extend(workload.meta.get("notes", ()))  # what the builder chose
        workload = _eager_original(workload, recorder)
        _share_higher_order_rules()  # for those the build imported
        _check_device(workload, spec.spec)
        if workload.precision in ("bf16-mixed", "bf16-true") and not profile.supports_bf16:
            recorder.notes.append(
                f"{profile.display_name} has no bfloat16 support (sm{profile.sm}); torch would "
                "refuse bf16 autocast there"
            )
        changed = _force_foreach(workload.optimizer)
        if changed:
            recorder.notes.append(
                f"{changed[0]}: foreach implementation, as torch picks by default on CUDA"
            )
        recorder.notes.extend(_iterations_at_their_limit(workload.optimizer))
        names = {
            id(m): (n or type(workload.model).__name__) for n, m in workload.model.named_modules()
        }
        # what the build left on the device, in the order model.to(device) allocates it
        ordered = _built_state(workload)
        build_seconds = time.perf_counter() - start
        recorder.adopt_built_state(ordered)
        del ordered
        build_end = len(recorder.events)
        recorder.set_phase("setup", -2)
        if setup is not None:
            with _step_errors(spec.spec, recorder):
                workload = setup(workload, recorder)
            names = {
                id(m): (n or type(workload.model).__name__)
                for n, m in workload.model.named_modules()
            }
        params = list(workload.model.parameters())
        parameters = sum(p.numel() for p in params)
        parameter_bytes = sum(p.numel() * p.element_size() for p in params)
        trained = sum(p.numel() for p in params if p.requires_grad)
        del params
        if workload.training and 0 < trained < parameters:
            recorder.notes.append(_frozen_note(trained, parameters))
        traced = workload
        if workload.step is None and workload.accumulate > TRACED_MICRO_BATCHES:
            traced = dataclasses.replace(workload, accumulate=TRACED_MICRO_BATCHES)
            recorder.notes.append(
                f"accumulate {workload.accumulate}: {TRACED_MICRO_BATCHES} micro-batches a step "
                "traced; from the second on each holds what the one before held (the "
                "gradients summed in place), and the rest repeat them"
            )
        with _step_errors(spec.spec, recorder):
            runner = StepRunner(traced, CUDA)
        del traced
        _label_persistent(recorder, workload)
        setup_end = len(recorder.events)
        from vramscope.tracking.hooks import GlobalHooks

        hooks = GlobalHooks(_PhaseListener(recorder, workload))
        generating = GenerationTracer(recorder)
        hooks.install()
        try:
            # Backward runs on the calling thread: autograd's per-device threads may have
            # been sized, before this trace, for a process without CUDA. The kernels module
            # accounts cuBLAS handles per thread as the GPU would (backward on its own).
            with (
                _module_stack(recorder, names),
                torch.autograd.set_multithreading_enabled(False),
                generating.active(),
                eager_transformers(),
            ):
                step_seconds: list[float] = []
                for index in range(steps):
                    t_step = time.perf_counter()
                    step_starts.append(len(recorder.events))
                    recorder.set_phase("data", index)
                    with _step_errors(spec.spec, recorder):
                        runner()
                    _label_persistent(recorder, workload)
                    step_seconds.append(round(time.perf_counter() - t_step, 3))
        finally:
            hooks.remove()
            sys.setrecursionlimit(old_limit)
        recorder.set_phase("end", steps)
        modules = _module_table(recorder, workload, names)
        training = workload.training
        precision_used = workload.precision
        accumulate_used = workload.accumulate
        del runner, workload
    recorder.closed = True
    trace = Trace(
        events=recorder.events,
        blocks=recorder.blocks,
        marks=recorder.marks,
        step_starts=step_starts,
        build_end=build_end,
        setup_end=setup_end,
        training=training,
        precision=precision_used,
        accumulate=accumulate_used,
        parameters=parameters,
        parameter_bytes=parameter_bytes,
        modules=modules,
        notes=list(dict.fromkeys(recorder.notes)),
        data_dependent=list(recorder.data_dependent.values()),
        assumptions=[a for a in recorder.assumptions.values() if a.used and a.kind != INTEGER_DRAW],
        variant=variant,
        sized_by_draws=[
            f"{a.what} at {a.where}"
            for a in recorder.assumptions.values()
            if a.sized and a.kind == INTEGER_DRAW
        ],
        draws_at_top=draws_at_top,
        sdpa=dict(recorder.sdpa),
        workspaces=dict(recorder.workspaces),
        fallbacks=dict(recorder.fallbacks),
        libraries=set(recorder.libraries),
        backward_ran=any(p == "backward" for _, _, p in recorder.marks),
        seconds=time.perf_counter() - start,
        build_seconds=round(build_seconds, 3),
        step_seconds=step_seconds,
    )
    # generate() calls cut short: the decoding steps they skipped, written in
    return generating.expanded(trace)


def _frozen_note(trained: int, parameters: int) -> str:
    """A training step that leaves most weights alone (LoRA adapters, a frozen backbone)."""
    return (
        f"{trained:,} of {parameters:,} parameters train ({trained / parameters:.2%}); the "
        "others are frozen: no gradients, no optimizer state"
    )


def _explain_build_error(exc: WorkloadError, spec: str) -> VramscopeError:
    message = str(exc)
    if "Torch not compiled with CUDA" in message or "not linked with support for cuda" in message:
        return WorkloadError(f"{message}; the estimate emulates cuda:0 — pass device to .to()")
    if "meta" in message and "data" in message:
        return WorkloadError(
            f"{message}; the build reads tensor values, which an estimate does not have"
        )
    if "UninitializedParameter" in message or "UninitializedBuffer" in message:
        return WorkloadError(
            f"building {spec} made a lazy module (nn.LazyLinear, nn.LazyConv2d, ...), whose "
            "parameters take their size from the first input: an estimate cannot build one; "
            "give its input size (nn.Linear(in_features, out_features)), or measure a run "
            "with `vramscope run`"
        )
    return exc


@contextlib.contextmanager
def _step_errors(spec: str, recorder: Recorder) -> Iterator[None]:
    """An error of the workload's own code, explained in one line (ours pass through)."""
    try:
        yield
    except VramscopeError:
        raise
    except Exception as exc:
        raise _explain_step_error(exc, spec, recorder) from None


def _explain_step_error(exc: BaseException, spec: str, recorder: Recorder) -> VramscopeError:
    from vramscope.workload import _where

    where = _where(exc)
    step = recorder.step
    # before the first step (the standard step's set-up: the model cast to a -true
    # precision, ...) the recorder counts steps below 0
    at = (
        f"the {recorder.phase} phase of step {step}"
        if not isinstance(step, int) or step >= 0
        else "setting up the step"
    )
    text = str(exc)
    if "Expected all tensors to be on the same device" in text or (
        "device" in text and "cpu" in text and "cuda" in text
    ):
        return WorkloadError(
            f"tracing {spec} failed in {at}: {where}; "
            "the workload mixes devices — create every tensor with device=device (the device "
            "build() receives) rather than a fixed one"
        )
    return TraceError(f"tracing {spec} failed in {at}: {where}")
