"""LoRA fine-tuning with PEFT: the model's weights frozen (no gradients, no optimizer state),
low-rank adapters beside the chosen linear layers trained with AdamW.

Used by the ``hf:NAME/lora=R`` spec option and by ``compare``'s ``lora-r8``/``lora-r64``
strategies. The adapters take the dtype of the layer they adapt (PEFT's float32 upcast of
adapters is off), so a ``-true`` precision makes them that dtype too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from vramscope.errors import WorkloadError, first_line

DEFAULT_RANK = 8
ALL_LINEAR = "all-linear"
_PEFT_TASKS = {
    "causal-lm": "CAUSAL_LM",
    "seq2seq-lm": "SEQ_2_SEQ_LM",
    "sequence-classification": "SEQ_CLS",
    "token-classification": "TOKEN_CLS",
    "question-answering": "QUESTION_ANS",
}


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA set-up: the rank, and which linear layers get adapters (None: PEFT's default
    for the model type, else every linear layer but the output head)."""

    rank: int = DEFAULT_RANK
    targets: tuple[str, ...] | None = None

    @property
    def alpha(self) -> int:
        return 2 * self.rank  # the usual choice; it scales the update, not the memory


def parse_rank(value: str) -> int:
    """``8`` or ``r8`` (as in ``/lora=r8``); empty: the default rank."""
    text = value[1:] if value[:1] in ("r", "R") else value
    if not text:
        return DEFAULT_RANK
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and int(text) > 0):
        raise WorkloadError(
            f"/lora takes a rank of 1 or more, like /lora=8 or /lora=r64, not {value!r}"
        )
    return int(text)


def parse_targets(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise WorkloadError(
            "/targets takes module names, like /targets=q_proj,v_proj or all-linear"
        )
    return names


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise WorkloadError("LoRA needs the peft package: pip install peft") from None
    return peft


def with_adapters(model: torch.nn.Module, settings: LoraSettings, task: str | None) -> Any:
    """``model`` wrapped by PEFT with LoRA adapters; every weight of ``model`` frozen."""
    peft = _peft()
    targets: Any = list(settings.targets) if settings.targets else None
    if targets == [ALL_LINEAR]:
        targets = ALL_LINEAR

    def config(target_modules: Any) -> Any:
        return peft.LoraConfig(
            r=settings.rank,
            lora_alpha=settings.alpha,
            lora_dropout=0.0,
            target_modules=target_modules,
            task_type=_PEFT_TASKS.get(task or ""),
        )

    try:
        return _wrapped(peft, model, config(targets))
    except ValueError as exc:
        if targets is not None or "target_modules" not in str(exc):
            raise WorkloadError(f"PEFT cannot add LoRA adapters: {first_line(exc)}") from None
    # PEFT knows no default layers for this model type: every linear layer but the head
    try:
        return _wrapped(peft, model, config(ALL_LINEAR))
    except ValueError as exc:
        raise WorkloadError(
            f"PEFT cannot add LoRA adapters: {first_line(exc)}; name the layers with "
            "/targets=NAME,NAME"
        ) from None


def _wrapped(peft: Any, model: torch.nn.Module, config: Any) -> Any:
    # PEFT warns about its defaults for other variants of the model type (a fused MoE
    # projection): not about this model's memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return peft.get_peft_model(model, config, autocast_adapter_dtype=False)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def adapter_optimizer(model: torch.nn.Module, lr: float = 1e-4) -> torch.optim.Optimizer:
    """AdamW over the adapters alone: the frozen weights get no optimizer state."""
    return torch.optim.AdamW(trainable(model), lr=lr)


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable and frozen parameters (count and bytes), each storage counted once."""
    seen: set[int] = set()
    counts = dict.fromkeys(("trainable", "trainable_bytes", "frozen", "frozen_bytes"), 0)
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        key = "trainable" if p.requires_grad else "frozen"
        counts[key] += p.numel()
        counts[f"{key}_bytes"] += p.numel() * p.element_size()
    return counts
