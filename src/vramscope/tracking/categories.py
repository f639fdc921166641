"""Exact bytes of parameters, buffers, gradients and optimizer state, from the objects.

Sizes are the allocator's: on CUDA each storage is one block rounded up to 512 bytes.
Storages are counted once, so tied weights and views are not double-counted. Nothing here
keeps a reference to a tensor after it returns.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
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


# plain tensors, whose device is read from their flags: ``tensor.device`` makes a device
# object (1 µs, a third of a storage's lookup); a subclass is asked for its device
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))


def _on_device(tensor: torch.Tensor, device_type: str) -> bool:
    if type(tensor) in _PLAIN:
        if device_type == "cuda":
            return tensor.is_cuda
        if device_type == "cpu":
            return tensor.is_cpu
    return tensor.device.type == device_type


def _storage_on(tensor: torch.Tensor | None, device_type: str) -> torch.UntypedStorage | None:
    """The storage behind ``tensor`` when it lives on ``device_type`` (None otherwise, and
    for sparse or other layouts and tensor subclasses without a storage)."""
    if tensor is None:
        return None
    tensor = local_tensor(tensor)
    if not _on_device(tensor, device_type) or tensor.layout != torch.strided:
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def model_tensors(
    models: Iterable[torch.nn.Module],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The models' parameters and buffers, each tensor once (tied weights), in the order
    ``parameters()`` and ``buffers()`` give them: one walk over the modules for both."""
    params: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    seen: set[int] = set()
    for model in models:
        for module in model.modules():
            for p in module._parameters.values():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
            for b in module._buffers.values():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    buffers.append(b)
    return params, buffers


def full_gradient_bytes(
    models: Iterable[torch.nn.Module],
    device_type: str,
    params: Iterable[torch.Tensor] | None = None,
    storages: _Storages | None = None,
) -> int:
    """What the gradients of every trainable parameter take once all exist (each storage
    once; frozen parameters have none). Parameters that are views of one storage (FSDP1's
    original parameters in its flat parameter) count each distinct view, the storage's
    bytes at most: one gradient buffer holds them all. ``params``: the models' parameters
    when the caller has them (:func:`model_tensors`); ``storages``: a count's lookups (each
    storage's allocator bytes, rounded up: the same blocks)."""
    if params is None:
        params = model_tensors(models)[0]
    if storages is None:
        storages = _Storages(device_type)
    views: dict[int, tuple[int, set[tuple[int, int]]]] = {}
    for p in params:
        if not p.requires_grad:
            continue
        found = storages.of(p)
        if found is None:
            continue
        ptr, nbytes = found
        local = local_tensor(p)
        entry = views.setdefault(ptr, (nbytes, set()))
        entry[1].add((local.storage_offset(), local.numel() * local.element_size()))
    total = 0
    for storage_bytes, spans in views.values():
        total += block_bytes(min(storage_bytes, sum(size for _, size in spans)), device_type)
    return total


OBJECT_CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state")


def object_tensors(
    models: Iterable[torch.nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    what: Collection[str] = OBJECT_CATEGORIES,
    walked: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> Iterator[tuple[torch.Tensor, str, torch.Tensor | None, str]]:
    """Every tensor the models and optimizers hold: ``(tensor, category, parameter, key)``,
    parameters first, then buffers, gradients and optimizer state (a storage belongs to the
    first category that holds it; ``what``: only these). ``parameter`` is the one a gradient
    or a state belongs to (None for buffers), ``key`` the state's name (``exp_avg``). The one
    walk over the objects: their bytes (:func:`object_categories`) and their storages by
    address (the attribution's census) both come from it. ``walked``: the models'
    :func:`model_tensors`, when the caller has them."""
    params: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    if {"parameters", "gradients", "buffers"} & set(what):
        params, buffers = walked if walked is not None else model_tensors(models)
        params = list(params)
        for opt in optimizers:
            for group in opt.param_groups:
                params.extend(group["params"])
    if "parameters" in what:
        for p in params:
            yield p, "parameters", p, ""
    if "buffers" in what:
        for b in buffers:
            yield b, "buffers", None, ""
    if "gradients" in what:
        for p in params:
            if p.grad is not None:
                yield p.grad, "gradients", p, "grad"
    if "optimizer_state" in what:
        for opt in optimizers:
            for p, state in opt.state.items():
                for key, t in _named_tensors(state):
                    yield t, "optimizer_state", p, key


def _named_tensors(value: object, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield prefix or "state", value
    elif isinstance(value, dict):
        for key, v in value.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(v, torch.Tensor):  # (an optimizer's usual state: no generator each)
                yield name or "state", v
            else:
                yield from _named_tensors(v, name)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _named_tensors(v, f"{prefix}.{i}" if prefix else str(i))


def storage_of(tensor: torch.Tensor | None, device_type: str) -> tuple[int, int] | None:
    """``(address, allocator bytes)`` of the storage behind ``tensor`` on ``device_type``."""
    storage = _storage_on(tensor, device_type)
    if storage is None:
        return None
    ptr = storage.data_ptr()
    return (ptr, block_bytes(storage.nbytes(), device_type)) if ptr else None


class _Storages:
    """``storage_of`` for one count, each tensor looked up once: a count asks again for the
    parameters and gradients of each optimizer (its state's own bytes). The tensors are held
    while the count runs (so no id is reused meanwhile), and let go with it."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self._found: dict[int, tuple[torch.Tensor, tuple[int, int] | None]] = {}

    def of(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        entry = self._found.get(id(tensor))
        if entry is None:
            entry = self._found[id(tensor)] = (tensor, storage_of(tensor, self.device_type))
        return entry[1]


def _categories(
    models: Iterable[torch.nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    storages: _Storages,
    walked: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    states: dict[int, int] | None = None,
) -> ObjectCategories:
    """The objects' bytes, each storage once; ``states``: filled with each optimizer's
    state bytes (by ``id``), those its parameters and gradients do not hold."""
    seen: set[int] = set()
    totals = dict.fromkeys(OBJECT_CATEGORIES, 0)
    optimizers = list(optimizers)
    for tensor, category, _param, _key in object_tensors(
        models, optimizers, ("parameters", "buffers", "gradients"), walked
    ):
        found = storages.of(tensor)
        if found is None or found[0] in seen:  # fake/meta tensors have no data pointer
            continue
        seen.add(found[0])
        totals[category] += found[1]
    for opt in optimizers:  # (the state last: a storage belongs to its first category)
        own = 0
        for tensor, *_ in object_tensors([], [opt], ("optimizer_state",)):
            found = storages.of(tensor)
            if found is None or found[0] in seen:
                continue
            seen.add(found[0])
            own += found[1]
        totals["optimizer_state"] += own
        if states is not None:
            states[id(opt)] = states.get(id(opt), 0) + own
    return ObjectCategories(**totals)


def object_categories(
    models: Iterable[torch.nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    device_type: str,
) -> ObjectCategories:
    """Bytes on ``device_type`` held by the models' parameters, buffers and gradients and
    the optimizers' state, each storage counted once, in the first category that holds it."""
    return _categories(models, optimizers, _Storages(device_type))


# a new optimizer's state is counted after each of its first steps while it has none (a
# skipped step, an optimizer without state), then after its 16th, 32nd, ... step
CENSUS_EVERY_STEP = 8


class ObjectLedger:
    """The objects' bytes on one device, the highest seen over the run: counted when a model
    or optimizer is first seen, after a new optimizer's first steps and at the end, so that
    a model gone by the end (it lived in ``main()``), or an optimizer state moved off the
    device by a trainer's teardown, keeps its bytes."""

    def __init__(self) -> None:
        self.seen = ObjectCategories()
        self.full_gradients = 0
        self._state: dict[int, int] = {}  # id(optimizer) -> its state's bytes
        self.due = False  # an optimizer whose state is not counted yet
        self._tries = 0  # its steps that ended while it was due

    def count(
        self,
        models: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        device_type: str,
        walked: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    ) -> ObjectCategories:
        """Count now, keep the highest; returns what the objects hold now. ``walked``: the
        models' :func:`model_tensors`, when the caller has them."""
        storages = _Storages(device_type)
        if walked is None:
            walked = model_tensors(models)
        states: dict[int, int] = {}
        now = _categories(models, optimizers, storages, walked, states)
        seen = self.seen
        seen.parameters = max(seen.parameters, now.parameters)
        seen.buffers = max(seen.buffers, now.buffers)
        seen.gradients = max(seen.gradients, now.gradients)
        full = full_gradient_bytes(models, device_type, walked[0], storages)
        self.full_gradients = max(self.full_gradients, full)
        for key, state in states.items():
            if state:
                self._state[key] = max(self._state.get(key, 0), state)
        seen.optimizer_state = max(seen.optimizer_state, sum(self._state.values()))
        return now

    def new_optimizer(self) -> None:
        self.due, self._tries = True, 0

    def step_ended(self, optimizer: torch.optim.Optimizer) -> bool:
        """A step of an optimizer ended while one was due: whether to count now (and the
        state exists from then on: nothing is due any more)."""
        self._tries += 1
        tries = self._tries
        if tries <= CENSUS_EVERY_STEP or tries & (tries - 1) == 0:
            self.due = not optimizer.state
            return True
        return False
