"""The Workload contract: a model, an optimizer, a batch and a loss, at a precision.

A workload is what ``build(batch_size, device)`` returns; ``optimizer=None`` means
inference. The built-in specs (``examples``, ``zoo``) build on this module; the standard
step and spec resolution live above them, in ``vramscope.workload``.
"""

from __future__ import annotations

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


@dataclass
class Workload:
    """What to run for one step: the model, optimizer, how to make a batch, and the loss.

    ``optimizer=None`` means inference: ``loss`` runs under ``torch.no_grad()`` in eval
    mode. ``step`` (optional) replaces the standard step entirely.
    """

    model: torch.nn.Module
    batch: Callable[[], Any]
    loss: Callable[..., Any]
    optimizer: torch.optim.Optimizer | None = None
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

    @property
    def training(self) -> bool:
        return self.optimizer is not None

    def with_overrides(
        self, precision: str | None = None, accumulate: int | None = None
    ) -> Workload:
        return replace(
            self,
            precision=self.precision if precision is None else normalize_precision(precision),
            accumulate=self.accumulate if accumulate is None else accumulate,
        )
