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
        if tensor is None or tensor.device.type != device_type:
            return
        if tensor.is_sparse or tensor.layout != torch.strided:
            return
        storage = tensor.untyped_storage()
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
