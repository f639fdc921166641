"""Global hooks that find the phases of an unmodified training loop, at the cost of a call.

Forward: PyTorch's global module forward pre/post hooks (a depth counter finds the
outermost call). Backward: ``torch.autograd.backward`` and ``torch.autograd.grad`` wrapped
(``Tensor.backward`` goes through the former). Optimizer: PyTorch's global optimizer
step hooks. zero_grad: ``Optimizer.zero_grad`` and ``Module.zero_grad`` wrapped. Data and
epochs: the DataLoader iterator's ``__next__`` and ``DataLoader.__iter__`` wrapped.
Everything is undone by :meth:`GlobalHooks.remove`, also when the run raised.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Protocol

import torch
import torch.utils.data.dataloader as dataloader_module


class PhaseListener(Protocol):
    def on_forward_start(self, module: torch.nn.Module) -> None: ...
    def on_forward_end(self, module: torch.nn.Module) -> None: ...
    def on_backward_start(self) -> None: ...
    def on_backward_end(self) -> None: ...
    def on_optimizer_start(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_optimizer_end(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_zero_grad(self) -> None: ...
    def on_data(self, loader_id: int | None) -> None: ...
    def on_loader_iter(self, loader: Any) -> None: ...
    def on_oom_in_module(self, module: torch.nn.Module) -> None: ...


class GlobalHooks:
    """Installs the hooks for one listener; ``remove()`` restores everything."""

    def __init__(self, listener: PhaseListener) -> None:
        self.listener = listener
        self.depth = 0
        self.in_backward = 0
        self.module_stack: list[torch.nn.Module] = []
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []

    # ---- module hooks -------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.in_backward:  # recomputation under activation checkpointing
            return
        self.module_stack.append(module)
        self.depth += 1
        if self.depth == 1:
            self.listener.on_forward_start(module)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.in_backward:
            return
        if self.module_stack:
            if sys.exc_info()[0] is torch.cuda.OutOfMemoryError:
                self.listener.on_oom_in_module(self.module_stack[-1])
            self.module_stack.pop()
        self.depth = max(0, self.depth - 1)
        if self.depth == 0:
            self.listener.on_forward_end(module)

    # ---- patching helpers ----------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        self._patches.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        listener = self.listener
        hooks = self
        self._handles.append(register_module_forward_pre_hook(self._pre))
        self._handles.append(register_module_forward_hook(self._post, always_call=True))
        self._handles.append(
            register_optimizer_step_pre_hook(lambda opt, a, k: listener.on_optimizer_start(opt))
        )
        self._handles.append(
            register_optimizer_step_post_hook(lambda opt, a, k: listener.on_optimizer_end(opt))
        )

        def wrap_backward(original: Any) -> Any:
            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                outermost = hooks.in_backward == 0
                if outermost:
                    listener.on_backward_start()
                hooks.in_backward += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    hooks.in_backward -= 1
                    if outermost:
                        listener.on_backward_end()

            return backward

        self._patch(torch.autograd, "backward", wrap_backward)
        self._patch(torch.autograd, "grad", wrap_backward)

        def wrap_zero_grad(original: Any) -> Any:
            @functools.wraps(original)
            def zero_grad(*args: Any, **kwargs: Any) -> Any:
                listener.on_zero_grad()
                return original(*args, **kwargs)

            return zero_grad

        self._patch(torch.optim.Optimizer, "zero_grad", wrap_zero_grad)
        self._patch(torch.nn.Module, "zero_grad", wrap_zero_grad)

        def wrap_next(original: Any) -> Any:
            @functools.wraps(original)
            def __next__(self_iter: Any) -> Any:
                listener.on_data(getattr(self_iter, "_vramscope_loader_id", None))
                return original(self_iter)

            return __next__

        def wrap_iter(original: Any) -> Any:
            @functools.wraps(original)
            def __iter__(self_loader: Any) -> Any:
                listener.on_loader_iter(self_loader)
                iterator = original(self_loader)
                with contextlib.suppress(AttributeError):
                    iterator._vramscope_loader_id = id(self_loader)
                return iterator

            return __iter__

        self._patch(dataloader_module._BaseDataLoaderIter, "__next__", wrap_next)
        self._patch(dataloader_module.DataLoader, "__iter__", wrap_iter)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()
        self.depth = 0
        self.module_stack.clear()
