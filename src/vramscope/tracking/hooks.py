"""Hooks that find the phases of an unmodified training loop, at a cost per step, not per module.

Forward: the outermost call of a *model* (a module with parameters). Each model's class gets a
thin ``__call__`` wrapper, one Python call per call of that class, so every other module keeps
``nn.Module``'s fast path. (A global module hook would send every module call down the slow
path, which made tracking cost grow with the number of module calls; torch.compile also
guards on the number of global hooks, so adding or removing one recompiles.) Models are found
by :meth:`GlobalHooks.adopt` (``Session.watch``) and during short *discovery* windows, in which
``nn.Module.__call__`` itself is wrapped: the first step, a new pass over a DataLoader, and the
step after a backward whose forward nobody saw.

Backward: ``torch.autograd.backward`` and ``torch.autograd.grad`` wrapped (``Tensor.backward``
goes through the former). Optimizer: PyTorch's global optimizer step hooks. zero_grad:
``Optimizer.zero_grad`` and ``Module.zero_grad`` wrapped. Data and epochs: the DataLoader
iterator's ``__next__`` and ``DataLoader.__iter__`` wrapped.

Every wrapper returns at once while ``torch.compile`` traces (``torch.compiler.is_compiling()``),
before it reads anything of ours, so dynamo never traces vramscope: no graph break, no guard,
no recompilation. Wrappers live on classes, not instances, so a model can still be deep-copied
or pickled while tracked (and its pickle never refers to vramscope). Other recorders (the
per-module attribution) receive every call of a wrapped class, and what it returned, through
:func:`add_listener`.
Everything is undone when the last hook set is removed, also when the run raised.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.utils.data.dataloader as dataloader_module

_is_compiling = torch.compiler.is_compiling
try:  # the mode under which AOTAutograd and make_fx trace a graph (torch >= 2.1)
    _PROXY = torch._C._TorchDispatchModeKey.PROXY
    _get_mode = torch._C._get_dispatch_mode
except AttributeError:  # pragma: no cover - an older torch
    _PROXY = None

    def _get_mode(key: Any) -> Any:
        return None


_MODULE_CALL = torch.nn.Module.__call__  # nn.Module's own, before anyone wraps it

_LOCK = threading.RLock()
# what receives the calls of wrapped classes (``_enter(module)``/``_exit(module)``); a tuple,
# replaced on change, so a wrapper reads it without a lock
_LISTENERS: tuple[Any, ...] = ()
_DISCOVERING: tuple[GlobalHooks, ...] = ()  # hook sets with a discovery window open
_MISSING = object()
# class -> what its own __dict__ held under "__call__" before we wrapped it (or _MISSING)
_WRAPPED: dict[type, Any] = {}
_MODEL_CLASSES: set[type] = set()  # every call of these (and subclasses) is reported
_INSTANCES: set[int] = set()  # ids of single modules whose calls are reported


class PhaseListener(Protocol):
    def on_forward_start(self, module: torch.nn.Module) -> None: ...
    def on_backward_start(self) -> None: ...
    # optional: def on_backward_end(self) -> None (not called when the listener has none)
    def on_optimizer_start(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_optimizer_end(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_zero_grad(self) -> None: ...
    def on_data(self, loader_id: int | None) -> None: ...
    def on_loader_iter(self, loader: Any) -> None: ...


def _never_compiled(function: Any) -> Any:
    """Tell dynamo to run ``function``'s frame as it is, compiling only what it calls.

    Our wrappers run where the user's code runs; when torch.compile's frame callback meets
    one as a new frame (the eager part around a graph break), it would otherwise try to
    compile it and count a graph break the plain run does not have. The mark is per code
    object, so one call covers every closure made from the same ``def``.
    """
    with contextlib.suppress(Exception):
        _skip_code(function.__code__)
    return function


def _skip_code(code: Any) -> None:
    """dynamo's ``skip_code``: the mark is kept by dynamo's C part, which torch loads with
    itself; importing ``torch._dynamo`` for it would cost a process that never compiles
    anything (an inference script) about a second at the first ``track()``."""
    if "torch._dynamo" not in sys.modules:
        try:
            from torch._C._dynamo.eval_frame import (
                _FrameAction,
                _FrameExecStrategy,
                set_code_exec_strategy,
            )

            skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
            set_code_exec_strategy(code, skip)
            return
        except Exception:  # a torch whose C part differs: dynamo's own function
            pass
    from torch._dynamo.eval_frame import skip_code

    skip_code(code)


try:  # torch.compile's frame callback: set while compiled code runs its eager parts
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _frame_callback
    from torch._C._dynamo.eval_frame import set_eval_frame as _set_frame_callback
except ImportError:  # pragma: no cover - a torch without dynamo's C part

    def _frame_callback() -> Any:  # type: ignore[misc]
        return None


def _outside_dynamo(function: Any, *args: Any) -> Any:
    """Call ``function`` with torch.compile's frame callback off, so none of vramscope's
    bookkeeping is ever analysed or compiled (only where a callback is set: costs ~30 ns).
    The wrappers test ``_frame_callback() is None`` themselves and call this only when it is
    not: in a launch-bound step every Python frame costs microseconds."""
    if _frame_callback() is None:
        return function(*args)
    prior = _set_frame_callback(None)
    try:
        return function(*args)
    finally:
        _set_frame_callback(prior)


def _call_of(cls: type) -> Any:
    """``cls.__call__`` as it would be without vramscope's wrappers."""
    for klass in cls.__mro__:
        own = klass.__dict__.get("__call__")
        if own is None:
            continue
        if klass in _WRAPPED:
            own = _WRAPPED[klass]
            if own is _MISSING:
                continue
        if own is _discovering_call:
            return _MODULE_CALL
        return own
    return _MODULE_CALL


def _enter_all(listeners: tuple[Any, ...], module: torch.nn.Module) -> None:
    for listener in listeners:
        listener._enter(module)


def _exit_all(listeners: tuple[Any, ...], module: torch.nn.Module, output: Any) -> None:
    for listener in reversed(listeners):
        listener._exit(module, output)


def _calling_quietly(
    listeners: tuple[Any, ...], module: torch.nn.Module, call: Any, args: Any, kwargs: Any
) -> Any:
    """A wrapped class's call in the eager part of compiled code: only the user's call is
    compiled."""
    _outside_dynamo(_enter_all, listeners, module)
    output = None
    try:
        output = call(module, *args, **kwargs)
        return output
    finally:
        _outside_dynamo(_exit_all, listeners, module, output)


def wrap_class(cls: type, instance: torch.nn.Module | None = None) -> None:
    """Report the calls of ``cls`` to every listener: of all its instances (a model's class),
    or only of ``instance`` (a module that places attribution markers); idempotent."""
    with _LOCK:
        if not issubclass(cls, torch.nn.Module) or issubclass(cls, torch.jit.ScriptModule):
            return
        if instance is None:
            _MODEL_CLASSES.add(cls)
        else:
            _INSTANCES.add(id(instance))
        if cls in _WRAPPED:
            return
        original = _call_of(cls)

        def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if _is_compiling():  # first, so dynamo reads nothing of ours
                return original(self, *args, **kwargs)
            listeners = _LISTENERS
            if not listeners:
                return original(self, *args, **kwargs)
            if cls not in _MODEL_CLASSES and id(self) not in _INSTANCES:
                # a module of a class wrapped for another model's markers (a bare
                # nn.Linear head beside a model holding Linears): discovery still finds it
                if not _DISCOVERING or not _outside_dynamo(_wanted, self):
                    return original(self, *args, **kwargs)
                wrap_class(cls)  # a model's class: its calls are reported from now on
            if _frame_callback() is not None:
                return _calling_quietly(listeners, self, original, args, kwargs)
            # every listener around the call (at every step of a launch-bound loop: no
            # helper call)
            for listener in listeners:
                listener._enter(self)
            output = None
            try:
                output = original(self, *args, **kwargs)
                return output
            finally:
                for listener in reversed(listeners):
                    listener._exit(self, output)

        __call__.__vramscope_wrapper__ = True  # type: ignore[attr-defined]
        _never_compiled(__call__)
        _WRAPPED[cls] = cls.__dict__.get("__call__", _MISSING)
        type.__setattr__(cls, "__call__", __call__)


def set_instances(ids: Iterable[int], on: bool) -> None:
    """Report, or stop reporting, the calls of single modules (by ``id``) whose classes stay
    wrapped: a module left out costs its wrapper's one membership test per call."""
    with _LOCK:
        if on:
            _INSTANCES.update(ids)
        else:
            _INSTANCES.difference_update(ids)


def _wanted(module: torch.nn.Module) -> bool:
    return any(hooks.wants(module) for hooks in _DISCOVERING)


def _discovering_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module.__call__`` while a discovery window is open: finds the models."""
    if _is_compiling():
        return _MODULE_CALL(self, *args, **kwargs)
    cls = type(self)
    if cls not in _WRAPPED and _outside_dynamo(_wanted, self):
        wrap_class(cls)  # this call and the next go through the class wrapper
        wrapper = cls.__dict__.get("__call__")
        if getattr(wrapper, "__vramscope_wrapper__", False):
            return wrapper(self, *args, **kwargs)
    return _MODULE_CALL(self, *args, **kwargs)


for _function in (_outside_dynamo, _discovering_call, _calling_quietly):
    _never_compiled(_function)


def _set_discovering(hooks: GlobalHooks, on: bool) -> None:
    global _DISCOVERING
    with _LOCK:
        others = tuple(h for h in _DISCOVERING if h is not hooks)
        _DISCOVERING = (*others, hooks) if on else others
        patched = torch.nn.Module.__dict__.get("__call__") is _discovering_call
        if _DISCOVERING and not patched:
            type.__setattr__(torch.nn.Module, "__call__", _discovering_call)
        elif not _DISCOVERING and patched:
            type.__setattr__(torch.nn.Module, "__call__", _MODULE_CALL)


def add_listener(listener: Any) -> None:
    """Receive ``_enter(module)``/``_exit(module)`` for every call of a wrapped class."""
    global _LISTENERS
    with _LOCK:
        _LISTENERS = (*_LISTENERS, listener)


def remove_listener(listener: Any) -> None:
    """Stop receiving calls; the wrappers go once nobody listens."""
    global _LISTENERS
    with _LOCK:
        _LISTENERS = tuple(item for item in _LISTENERS if item is not listener)
        if not _LISTENERS:
            _unwrap_classes()


def _unwrap_classes() -> None:
    with _LOCK:
        for cls, own in list(_WRAPPED.items()):
            if getattr(cls.__dict__.get("__call__"), "__vramscope_wrapper__", False):
                if own is _MISSING:
                    type.__delattr__(cls, "__call__")
                else:  # the user replaced it since: leave theirs
                    type.__setattr__(cls, "__call__", own)
        _WRAPPED.clear()
        _MODEL_CLASSES.clear()
        _INSTANCES.clear()


def wrapped_classes() -> list[type]:
    """The classes whose calls are tracked now (for tests and diagnostics)."""
    with _LOCK:
        return list(_WRAPPED)


class GlobalHooks:
    """Installs the hooks for one listener; ``remove()`` restores everything."""

    def __init__(self, listener: PhaseListener) -> None:
        self.listener = listener
        # one entry per wrapped call under way, on any thread (a model inside a model counts
        # once; DataParallel's replicas run on threads of their own): list appends and pops
        # are atomic, so no lock is taken at every model call (a lock cost a launch-bound
        # step microseconds, cold in cache between two steps)
        self._calls: list[None] = []
        self.in_backward = 0
        self.discovering = False
        self._installed = False
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []
        self._has_params: weakref.WeakKeyDictionary[torch.nn.Module, bool] = (
            weakref.WeakKeyDictionary()
        )
        self._forwards_since_discovery = 0
        self._forward_since_optimizer = False

    @property
    def depth(self) -> int:
        """Wrapped calls under way (model calls, and modules with attribution markers)."""
        return len(self._calls)

    @depth.setter
    def depth(self, value: int) -> None:  # only ever reset: a call left by an exception
        del self._calls[value:]

    # ---- models ------------------------------------------------------------------------------
    def is_model(self, module: torch.nn.Module) -> bool:
        """A module with parameters (an ``nn.CrossEntropyLoss`` is not a model)."""
        try:
            known = self._has_params.get(module)
        except TypeError:  # a module that cannot be a weak key
            return next(module.parameters(), None) is not None
        if known is None:
            known = self._has_params[module] = next(module.parameters(), None) is not None
        return known

    def wants(self, module: torch.nn.Module) -> bool:
        """Whether a call seen by discovery is a model's outermost call."""
        return not self.depth and not self.in_backward and self.is_model(module)

    def adopt(self, module: torch.nn.Module) -> None:
        """Track the calls of ``module``'s class from now on (``Session.watch``)."""
        if isinstance(module, torch.nn.Module):
            wrap_class(type(module))

    def _enter(self, module: torch.nn.Module) -> None:
        calls = self._calls
        calls.append(None)
        # two threads entering a model at once could both read 2 here and miss a forward;
        # a thread inside a model (DataParallel's) always makes the others' calls nested
        if len(calls) == 1 and not self.in_backward:  # not a recomputation (checkpointing)
            self._forward_since_optimizer = True
            if self.discovering:
                self._forwards_since_discovery += 1
            self.listener.on_forward_start(module)

    def _exit(self, module: torch.nn.Module, output: Any = None) -> None:
        calls = self._calls
        if calls:
            calls.pop()

    # ---- discovery ---------------------------------------------------------------------------
    def set_discovery(self, on: bool) -> None:
        """Open or close a discovery window (every module call costs a little while open)."""
        if on == self.discovering or not self._installed:
            return
        self.discovering = on
        if on:
            self._forwards_since_discovery = 0
        _set_discovering(self, on)

    def on_step_boundary(self) -> None:
        """A step with a forward ended: the models it used are known, discovery can close."""
        if self.discovering and self._forwards_since_discovery:
            self.set_discovery(False)

    def _optimizer_ended(self, optimizer: torch.optim.Optimizer) -> None:
        self.listener.on_optimizer_end(optimizer)
        self.on_step_boundary()

    def _backward_starts(self) -> None:
        if not self._forward_since_optimizer:
            self.set_discovery(True)  # a forward nobody saw: find its model next time
        self.listener.on_backward_start()

    def _loader_iter(self, loader: Any) -> None:
        self.listener.on_loader_iter(loader)
        self.set_discovery(True)  # a new pass (an epoch, a validation loop)

    # ---- patching helpers ----------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        self._patches.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        listener = self.listener
        hooks = self

        def optimizer_pre(opt: Any, args: Any, kwargs: Any) -> None:
            if _is_compiling():
                return
            hooks.depth = 0  # never inside a forward: heals a forward left by KeyboardInterrupt
            if _frame_callback() is None:
                listener.on_optimizer_start(opt)
            else:
                _outside_dynamo(listener.on_optimizer_start, opt)

        def optimizer_post(opt: Any, args: Any, kwargs: Any) -> None:
            if _is_compiling():
                return
            hooks._forward_since_optimizer = False
            if _frame_callback() is not None:
                _outside_dynamo(hooks._optimizer_ended, opt)
                return
            listener.on_optimizer_end(opt)  # _optimizer_ended, written out
            if hooks.discovering:
                hooks.on_step_boundary()

        _never_compiled(optimizer_pre)
        _never_compiled(optimizer_post)
        self._handles.append(register_optimizer_step_pre_hook(optimizer_pre))
        self._handles.append(register_optimizer_step_post_hook(optimizer_post))

        backward_end = getattr(listener, "on_backward_end", None)  # optional

        def wrap_backward(original: Any) -> Any:
            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                # a graph traced, not a backward run: AOTAutograd's joint graph calls
                # torch.autograd.grad on proxies while it compiles (on torch 2.11 with
                # torch.compiler.is_compiling() false)
                if _is_compiling() or _get_mode(_PROXY) is not None:
                    return original(*args, **kwargs)
                outermost = hooks.in_backward == 0
                if outermost:
                    if _frame_callback() is not None:
                        _outside_dynamo(hooks._backward_starts)
                    else:  # _backward_starts, written out
                        if not hooks._forward_since_optimizer:
                            hooks.set_discovery(True)
                        listener.on_backward_start()
                hooks.in_backward += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    hooks.in_backward -= 1
                    if outermost and backward_end is not None:
                        if _frame_callback() is None:
                            backward_end()
                        else:
                            _outside_dynamo(backward_end)

            return _never_compiled(backward)

        self._patch(torch.autograd, "backward", wrap_backward)
        self._patch(torch.autograd, "grad", wrap_backward)

        def wrap_zero_grad(original: Any) -> Any:
            @functools.wraps(original)
            def zero_grad(*args: Any, **kwargs: Any) -> Any:
                if not _is_compiling():
                    if _frame_callback() is None:
                        listener.on_zero_grad()
                    else:
                        _outside_dynamo(listener.on_zero_grad)
                return original(*args, **kwargs)

            return _never_compiled(zero_grad)

        self._patch(torch.optim.Optimizer, "zero_grad", wrap_zero_grad)
        self._patch(torch.nn.Module, "zero_grad", wrap_zero_grad)

        def wrap_next(original: Any) -> Any:
            @functools.wraps(original)
            def __next__(self_iter: Any) -> Any:
                if not _is_compiling():
                    loader_id = getattr(self_iter, "_vramscope_loader_id", None)
                    if _frame_callback() is None:
                        listener.on_data(loader_id)
                    else:
                        _outside_dynamo(listener.on_data, loader_id)
                return original(self_iter)

            return _never_compiled(__next__)

        def wrap_iter(original: Any) -> Any:
            @functools.wraps(original)
            def __iter__(self_loader: Any) -> Any:
                iterator = original(self_loader)
                # told once the iterator exists: its worker processes have started, so the
                # host-memory sampler that lists the children now finds them
                if not _is_compiling():
                    _outside_dynamo(hooks._loader_iter, self_loader)
                with contextlib.suppress(AttributeError):
                    iterator._vramscope_loader_id = id(self_loader)
                return iterator

            return _never_compiled(__iter__)

        self._patch(dataloader_module._BaseDataLoaderIter, "__next__", wrap_next)
        self._patch(dataloader_module.DataLoader, "__iter__", wrap_iter)
        add_listener(self)
        self._installed = True
        self.set_discovery(True)

    def remove(self) -> None:
        self.set_discovery(False)
        self._installed = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()
        remove_listener(self)
        self.depth = 0
        self._has_params.clear()
