"""Exact bytes of parameters, buffers, gradients and optimizer state, from the objects.

Sizes are the allocator's: on CUDA each storage is one block rounded up to 512 bytes.
Storages are counted once, so tied weights and views are not double-counted. Nothing here
keeps a reference to a tensor after it returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from vramscope.units import round_up

CUDA_BLOCK = 512


def block_bytes(nbytes: int, device_type: str) -> int:
    """What one storage of ``nbytes`` takes from the allocator on ``device_type``."""
    if device_type == "cuda":
        return round_up(max(nbytes, 1), CUDA_BLOCK)
    return nbytes


@dataclass
class ObjectCategories:
    parameters: int = 0
    buffers: int = 0
    gradients: int = 0
    optimizer_state: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.buffers + self.gradients + self.optimizer_state


def tensors_in(value: object) -> Iterable[torch.Tensor]:
    """Every tensor inside nested dicts, lists and tuples (optimizer state, batches)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this process's bytes: a DTensor's (FSDP2, tensor parallel)
    local shard, the tensor itself otherwise."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def _storage_on(tensor: torch.Tensor | None, device_type: str) -> torch.UntypedStorage | None:
    """The storage behind ``tensor`` when it lives on ``device_type`` (None otherwise, and
    for sparse or other layouts and tensor subclasses without a storage)."""
    if tensor is None:
        return None
    tensor = local_tensor(tensor)
    if tensor.device.type != device_type or tensor.layout != torch.strided:
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def full_gradient_bytes(models: Iterable[torch.nn.Module], device_type: str) -> int:
    """What the gradients of every trainable parameter take once all exist (each storage
    once; frozen parameters have none). Parameters that are views of one storage (FSDP1's
    original parameters in its flat parameter) count each distinct view, the storage's
    bytes at most: one gradient buffer holds them all."""
    views: dict[int, tuple[int, set[tuple[int, int]]]] = {}
    for model in models:
        for p in model.parameters():
            if not p.requires_grad:
                continue
            storage = _storage_on(p, device_type)
            if storage is None:
                continue
            local = local_tensor(p)
            entry = views.setdefault(storage.data_ptr(), (storage.nbytes(), set()))
            entry[1].add((local.storage_offset(), local.numel() * local.element_size()))
    total = 0
    for storage_bytes, spans in views.values():
        total += block_bytes(min(storage_bytes, sum(size for _, size in spans)), device_type)
    return total


def object_categories(
    models: Iterable[torch.nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    device_type: str,
) -> ObjectCategories:
    """Bytes on ``device_type`` held by the models' parameters, buffers and gradients and
    the optimizers' state, each storage counted once, in the first category that holds it."""
    seen: set[int] = set()
    result = ObjectCategories()

    def add(tensor: torch.Tensor | None, field: str) -> None:
        storage = _storage_on(tensor, device_type)
        if storage is None:
            return
        key = storage.data_ptr()
        if key == 0 or key in seen:  # fake/meta tensors have no data pointer
            return
        seen.add(key)
        setattr(result, field, getattr(result, field) + block_bytes(storage.nbytes(), device_type))

    params: list[torch.nn.Parameter] = []
    for model in models:
        params.extend(model.parameters())
    for opt in optimizers:
        for group in opt.param_groups:
            params.extend(group["params"])
    for p in params:
        add(p, "parameters")
    for model in models:
        for b in model.buffers():
            add(b, "buffers")
    for p in params:
        add(p.grad, "gradients")
    for opt in optimizers:
        for state in opt.state.values():
            for t in tensors_in(state):
                add(t, "optimizer_state")
    return result
