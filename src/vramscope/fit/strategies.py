"""Memory-saving strategies as transformations of a workload (the seeds' four ways, and more).

A strategy changes the precision, the micro-batch and accumulation, the allocator options,
or the built workload itself (activation checkpointing, the optimizer, ``foreach``,
``zero_grad``). The same named strategy is applied by the estimator in this process and
by ``vramscope measure --strategy NAME`` in a fresh process on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from vramscope.contract import single_optimizer
from vramscope.errors import VramscopeError
from vramscope.workload import Builder, Workload


class NotApplicable(VramscopeError):
    """This strategy does not apply to this workload (the message says why)."""


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    precision: str | None = None
    accumulate_factor: int = 1  # micro-batch ÷ factor, accumulation × factor
    allocator_config: str | None = None
    checkpointing: bool = False
    optimizer: str | None = None  # "sgd", "sgdm", "adamw"
    foreach: bool | None = None
    zero_grad_set_to_none: bool | None = None
    lora_rank: int | None = None  # LoRA fine-tuning with adapters of this rank (PEFT)
    cost: int = 0  # how much the change asks of the user (speed, numerics, convergence)

    def micro_batch(self, batch_size: int) -> int:
        if batch_size % self.accumulate_factor:
            raise NotApplicable(
                f"batch size {batch_size} is not divisible by {self.accumulate_factor}"
            )
        return batch_size // self.accumulate_factor

    def accumulate(self, requested: int | None) -> int | None:
        """The accumulation to run with: the requested one × factor; None (the workload's
        own, which ``wrap`` multiplies by the factor) when none was requested."""
        if self.accumulate_factor == 1 or requested is None:
            return requested
        return requested * self.accumulate_factor

    def wrap(self, builder: Builder) -> Builder:
        """The builder with this strategy's changes to the built workload applied."""
        if not (
            self.checkpointing
            or self.accumulate_factor > 1
            or self.optimizer
            or self.foreach is not None
            or self.zero_grad_set_to_none is not None
            or self.lora_rank
        ):
            return builder
        from vramscope.zoo import call_builder

        def build(batch_size: int, device: torch.device, precision: str | None = None) -> Workload:
            workload = call_builder(builder, batch_size, device, precision)
            if not isinstance(workload, Workload):
                return workload  # build_workload reports the wrong type
            if self.accumulate_factor > 1:
                if workload.step is not None:
                    raise NotApplicable("the workload's own step() decides its accumulation")
                # the same effective batch: the workload's own accumulation, times the factor
                # (one asked for on the command line replaces it after the build)
                workload.accumulate *= self.accumulate_factor
            if self.checkpointing:
                apply_checkpointing(workload.model)
            if self.lora_rank:
                apply_lora(workload, self.lora_rank)
            if self.optimizer:
                workload.optimizer = switch_optimizer(workload, self.optimizer)
            if self.foreach is not None:
                for group in _one_optimizer(workload).param_groups:
                    group["foreach"] = self.foreach
                    if "fused" in group:
                        group["fused"] = None if not self.foreach else group["fused"]
            if self.zero_grad_set_to_none is not None:
                if workload.optimizer is None:
                    raise NotApplicable("inference has no gradients to zero")
                workload.meta["zero_grad_set_to_none"] = self.zero_grad_set_to_none
            return workload

        build.__qualname__ = getattr(builder, "__qualname__", "build")
        return build


def _combine(name: str, description: str, *parts: Strategy) -> Strategy:
    fields: dict = {"name": name, "description": description, "cost": sum(p.cost for p in parts)}
    for part in parts:
        for key in (
            "precision",
            "allocator_config",
            "optimizer",
            "foreach",
            "zero_grad_set_to_none",
            "lora_rank",
        ):
            if getattr(part, key) is not None:
                fields[key] = getattr(part, key)
        if part.checkpointing:
            fields["checkpointing"] = True
        if part.accumulate_factor > 1:
            fields["accumulate_factor"] = part.accumulate_factor
    return Strategy(**fields)


EXPANDABLE = "expandable_segments:True"
_BASE = [
    Strategy("baseline", "the workload as written"),
    Strategy(
        "expandable-segments",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        allocator_config=EXPANDABLE,
        cost=0,
    ),
    Strategy(
        "zero-grad-keep",
        "zero_grad(set_to_none=False): gradients stay allocated between steps",
        zero_grad_set_to_none=False,
        cost=0,
    ),
    Strategy(
        "foreach-off",
        "optimizer with foreach=False (a for-loop: fewer temporaries, slower)",
        foreach=False,
        cost=1,
    ),
    Strategy("bf16-mixed", "autocast to bfloat16", precision="bf16-mixed", cost=2),
    Strategy("16-mixed", "autocast to float16 with a GradScaler", precision="16-mixed", cost=2),
    Strategy(
        "checkpointing",
        "activation checkpointing of the repeated blocks (recompute in backward)",
        checkpointing=True,
        cost=3,
    ),
    Strategy(
        "accumulate-x2",
        "half the micro-batch, 2 accumulation steps (same effective batch)",
        accumulate_factor=2,
        cost=3,
    ),
    Strategy(
        "accumulate-x4",
        "a quarter of the micro-batch, 4 accumulation steps",
        accumulate_factor=4,
        cost=4,
    ),
    Strategy(
        "sgd-momentum",
        "SGD with momentum instead (one state tensor per parameter)",
        optimizer="sgdm",
        cost=5,
    ),
    Strategy("sgd", "plain SGD (no optimizer state)", optimizer="sgd", cost=6),
    Strategy("adamw", "AdamW (two state tensors per parameter)", optimizer="adamw", cost=5),
    Strategy(
        "lora-r8",
        "LoRA rank 8 (PEFT): weights frozen, adapters trained with AdamW",
        lora_rank=8,
        cost=7,
    ),
    Strategy(
        "lora-r64",
        "LoRA rank 64 (PEFT): weights frozen, adapters trained with AdamW",
        lora_rank=64,
        cost=7,
    ),
]
STRATEGIES: dict[str, Strategy] = {s.name: s for s in _BASE}
for _name, _desc, _parts in (
    (
        "bf16+checkpointing",
        "bf16-mixed and activation checkpointing",
        ("bf16-mixed", "checkpointing"),
    ),
    (
        "bf16+checkpointing+expandable",
        "bf16-mixed, checkpointing, expandable segments",
        ("bf16-mixed", "checkpointing", "expandable-segments"),
    ),
    (
        "lora-r8+checkpointing",
        "LoRA rank 8 and activation checkpointing",
        ("lora-r8", "checkpointing"),
    ),
    (
        "bf16+accumulate-x2",
        "bf16-mixed and half the micro-batch with 2 accumulation steps",
        ("bf16-mixed", "accumulate-x2"),
    ),
):
    STRATEGIES[_name] = _combine(_name, _desc, *(STRATEGIES[p] for p in _parts))
DEFAULT_STRATEGIES = [
    "baseline",
    "bf16-mixed",
    "16-mixed",
    "checkpointing",
    "accumulate-x2",
    "accumulate-x4",
    "expandable-segments",
    "foreach-off",
    "zero-grad-keep",
    "sgd",
    "adamw",
    "bf16+checkpointing",
    "bf16+checkpointing+expandable",
]


# what compare runs for a transformers model besides DEFAULT_STRATEGIES: LoRA fine-tuning
LORA_STRATEGIES = ["lora-r8", "lora-r64", "lora-r8+checkpointing"]


def default_strategies(spec: str, lora: bool = True) -> list[str]:
    """The strategies ``compare`` runs when none are named: with ``lora``, LoRA too for
    ``hf:`` training specs (not for inference, nor when the spec already trains adapters)."""
    if lora and spec.startswith("hf:"):
        from vramscope.zoo import parse_hf

        try:
            parsed = parse_hf(spec[3:])
        except VramscopeError:
            return list(DEFAULT_STRATEGIES)
        if parsed.training and "lora" not in parsed.options:
            return [*DEFAULT_STRATEGIES, *LORA_STRATEGIES]
    return list(DEFAULT_STRATEGIES)


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise VramscopeError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


def apply_checkpointing(model: torch.nn.Module) -> str:
    """Turn on activation checkpointing: the model's own switch, else its repeated blocks.

    Returns how it was applied; raises NotApplicable when the model has neither.
    """
    if hasattr(model, "gradient_checkpointing_enable"):
        try:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        except TypeError:
            model.gradient_checkpointing_enable()
        return "the model's gradient_checkpointing_enable()"
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(True)
        return "the model's set_grad_checkpointing(True)"
    blocks = repeated_blocks(model)
    if not blocks:
        raise NotApplicable(
            "the model has no repeated blocks (a ModuleList or Sequential of alike layers)"
        )
    for block in blocks:
        _checkpoint_forward(block)
    return f"{len(blocks)} repeated blocks of {type(blocks[0]).__name__}"


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The largest run of same-class, parameter-holding children of a ModuleList/Sequential."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        groups: dict[type, list[torch.nn.Module]] = {}
        for child in module.children():
            if next(child.parameters(), None) is not None and len(list(child.children())) > 0:
                groups.setdefault(type(child), []).append(child)
        for members in groups.values():
            if len(members) >= 2 and _size(members) > _size(best):
                best = members
    return best


def _size(modules: list[torch.nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def _checkpoint_forward(block: torch.nn.Module) -> None:
    original: Callable = block.forward

    def forward(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            return checkpoint(original, *args, use_reentrant=False, **kwargs)
        return original(*args, **kwargs)

    block.forward = forward  # an instance attribute: nn.Module.__call__ uses it


def _one_optimizer(workload: Workload) -> torch.optim.Optimizer:
    """The workload's optimizer, for a strategy that changes it: not for inference, nor for
    several optimizers or a wrapper of the user's (which the strategy cannot rebuild)."""
    optimizer = single_optimizer(workload, "this strategy", NotApplicable)
    if optimizer is None:
        raise NotApplicable("inference has no optimizer")
    return optimizer


def switch_optimizer(workload: Workload, kind: str) -> torch.optim.Optimizer:
    optimizer = _one_optimizer(workload)
    lr = optimizer.param_groups[0].get("lr", 1e-3)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "sgdm":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise VramscopeError(f"unknown optimizer {kind!r}")


def apply_lora(workload: Workload, rank: int) -> None:
    """LoRA fine-tuning of a transformers model: adapters of ``rank`` on PEFT's default layers
    for its type, the weights frozen, AdamW over the adapters (at the workload's learning
    rate)."""
    from vramscope import lora
    from vramscope.hf_models import task_of_model

    if workload.optimizer is None:
        raise NotApplicable("LoRA fine-tuning trains; this workload is inference")
    optimizer = _one_optimizer(workload)
    if hasattr(workload.model, "peft_config"):
        raise NotApplicable("the model already has LoRA adapters")
    task = task_of_model(workload.model)
    if task is None:
        raise NotApplicable("LoRA here adapts transformers models (hf: specs)")
    lr = optimizer.param_groups[0].get("lr", 1e-4)
    workload.model = lora.with_adapters(workload.model, lora.LoraSettings(rank), task)
    workload.optimizer = lora.adapter_optimizer(workload.model, lr=lr)
