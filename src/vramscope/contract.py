"""The Workload contract: a model, an optimizer, a batch and a loss, at a precision.

A workload is what ``build(batch_size, device)`` returns; ``optimizer=None`` means
inference. The built-in specs (``examples``, ``zoo``) build on this module; the standard
step and spec resolution live above them, in ``vramscope.workload``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vramscope.errors import VramscopeError

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
_ALIASES = {
    "32": "32-true",
    "fp32": "32-true",
    "bf16": "bf16-mixed",
    "16": "16-mixed",
    "fp16": "16-mixed",
    "amp": "bf16-mixed",
}
Builder = Callable[[int, torch.device], "Workload"]


def normalize_precision(value: str) -> str:
    """Lightning's precision names; a few common aliases accepted."""
    text = str(value).strip().lower()
    text = _ALIASES.get(text, text)
    if text not in PRECISIONS:
        raise VramscopeError(f"unknown precision {value!r}; use one of {', '.join(PRECISIONS)}")
    return text


def exit_status(code: object) -> int:
    """The process's exit status for ``sys.exit(code)``, as the shell sees it: an integer
    modulo 256 (``True`` is 1, 256 is 0), None 0, anything else (a message) 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) % 256
    return 1


# what a wrapper of optimizers is not: looked into, a model or a module would be walked whole
_NOT_WRAPPERS = (torch.nn.Module, torch.Tensor, types.ModuleType, types.FunctionType, str, bytes)


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers a Workload's ``optimizer`` stands for: itself; each of a list or
    tuple; or those a wrapper of your own keeps in its attributes, in lists, tuples and
    dicts of them (a few levels down; never inside a module or a tensor).
    ZeroRedundancyOptimizer is a torch optimizer: itself."""
    found: list[torch.optim.Optimizer] = []
    seen: set[int] = set()

    def visit(value: Any, levels: int) -> None:
        if isinstance(value, torch.optim.Optimizer):
            if value not in found:
                found.append(value)
            return
        if levels == 0 or id(value) in seen or isinstance(value, _NOT_WRAPPERS):
            return
        seen.add(id(value))
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            children = vars(value).values()
        else:
            return
        for child in children:
            visit(child, levels - 1)

    visit(optimizer, 4)
    return found


def single_optimizer(
    workload: Workload, what: str, error: type[VramscopeError] = VramscopeError
) -> torch.optim.Optimizer | None:
    """The workload's one torch optimizer (None for inference; a list of one is that one),
    for ``what`` that rebuilds or changes it; several, or a wrapper of your own, are refused
    in one line (an ``error``)."""
    optimizer = workload.optimizer
    if isinstance(optimizer, (list, tuple)) and len(optimizer) == 1:
        optimizer = optimizer[0]
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    raise error(
        f"{what} needs the workload's optimizer to be one torch.optim.Optimizer, not "
        f"{type(optimizer).__name__}"
    )


@dataclass
class Workload:
    """What to run for one step: the model, optimizer, how to make a batch, and the loss.

    ``optimizer=None`` means inference: ``loss`` runs under ``torch.no_grad()`` in eval
    mode. ``optimizer`` may also be a list or tuple of optimizers (a GAN's, or one per
    parameter group kind: each stepped, then each zeroed) or an object of your own with
    ``step()`` and ``zero_grad()`` that holds them. ``step`` (optional) replaces the
    standard step entirely: ``precision`` and ``accumulate`` are then what it does, and
    overriding them (``--precision``) changes nothing but a note in the report.
    """

    model: torch.nn.Module
    batch: Callable[[], Any]
    loss: Callable[..., Any]
    optimizer: Any = None  # torch.optim.Optimizer, a sequence of them, or a wrapper
    precision: str = "32-true"
    accumulate: int = 1
    step: Callable[[], Any] | None = None
    name: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    tensor_parallel_plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.precision = normalize_precision(self.precision)
        if int(self.accumulate) < 1:
            raise VramscopeError(f"accumulate must be 1 or more, not {self.accumulate}")
        self.accumulate = int(self.accumulate)
        if not isinstance(self.model, torch.nn.Module):
            raise VramscopeError(
                f"Workload(model=...) must be a torch.nn.Module, not {type(self.model).__name__}"
                " (wrap a function in a module whose forward calls it)"
            )
        for name in ("batch", "loss"):
            if not callable(getattr(self, name)):
                raise VramscopeError(
                    f"Workload({name}=...) must be a function, not "
                    f"{type(getattr(self, name)).__name__}"
                )
        if self.step is not None and not callable(self.step):
            raise VramscopeError(
                f"Workload(step=...) must be a function, not {type(self.step).__name__}"
            )
        if isinstance(self.optimizer, (list, tuple)):
            if not self.optimizer:
                raise VramscopeError(
                    "Workload(optimizer=[]) is empty: pass None for inference, or the optimizers"
                )
            self.optimizer = tuple(self.optimizer)
        for opt in self.optimizers:
            if not (
                callable(getattr(opt, "step", None)) and callable(getattr(opt, "zero_grad", None))
            ):
                raise VramscopeError(
                    f"Workload(optimizer=...): {type(opt).__name__} has no step() and "
                    "zero_grad(); pass a torch.optim.Optimizer (or several, as a list)"
                )

    @property
    def training(self) -> bool:
        return self.optimizer is not None

    @property
    def optimizers(self) -> tuple[Any, ...]:
        """The optimizers as the step calls them: one, or each of a list (none: inference)."""
        if self.optimizer is None:
            return ()
        if isinstance(self.optimizer, tuple):
            return self.optimizer
        return (self.optimizer,)

    def with_overrides(
        self, precision: str | None = None, accumulate: int | None = None
    ) -> Workload:
        """The workload at another precision or accumulation. A workload with its own
        ``step`` runs it as written: the values stay its own, and a note says what was
        asked for and had no effect."""
        precision = self.precision if precision is None else normalize_precision(precision)
        accumulate = self.accumulate if accumulate is None else accumulate
        if self.step is None or getattr(self.step, "applies_overrides", False):
            return replace(self, precision=precision, accumulate=accumulate)
        ignored = [
            f"{flag} {asked}"
            for flag, asked, own in (
                ("precision", precision, self.precision),
                ("accumulate", accumulate, self.accumulate),
            )
            if asked != own
        ]
        if not ignored:
            return self
        note = (
            f"{' and '.join(ignored)} asked for, not applied: the workload's own step() runs as "
            f"written (precision {self.precision}, accumulate {self.accumulate}); set them in "
            "build() or drop step= to use the standard step"
        )
        return replace(self, meta={**self.meta, "notes": [*self.meta.get("notes", ()), note]})
