"""Context parallel: each rank holds its share of every sequence, and attention sees the
whole sequence through torch's ring attention (``torch.distributed.tensor.experimental``).

A context-parallel job runs the model on a shard of each sequence: ``context_parallel``
cuts the batch's sequence-long tensors (token ids, labels, positions) along the sequence,
and patches ``F.scaled_dot_product_attention`` so that query, key and value become DTensors
split along the sequence; DTensor then runs its ring attention handler on each rank's
share: the rank's queries attend to every rank's keys and values, which the ring brings in
(torch's default rotation all-gathers the keys and values once per attention call), the
partial outputs merged in float32. The rest of the model (projections, MLPs, norms, the
head, the loss) runs on the rank's tokens only.

Here the same is done with torch's own pieces: the batch is cut as torch cuts it (with
its default head-tail load balancing, each rank 2 chunks of the sequence; memory is the
same as a plain chunk), and torch's dispatcher is enabled while the step runs, so the
ring's collectives (``all_gather_single`` of the keys and values, its backward's
reduce-scatter of their gradients) are traced where the functional collectives allocate
their outputs. Only ``F.scaled_dot_product_attention`` is made context parallel, as in
torch: an attention written out by hand (``softmax(q @ k.T)``) would see the rank's keys
only; its memory is then that of the rank's own block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from vramscope.errors import VramscopeError

SEQ_DIM = 1  # the batch's tensors: batch, sequence, ...


def sequence_length(batch: Any) -> int | None:
    """The sequence length of a batch: dimension 1 of its first tensor of 2 or more
    dimensions (None when it has none)."""
    for tensor in _tensors(batch):
        if tensor.dim() > SEQ_DIM:
            return int(tensor.shape[SEQ_DIM])
    return None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def load_balanced() -> bool:
    """Whether torch's context parallel balances causal attention (its default): each rank
    holds 2 chunks of the sequence, the head and the tail."""
    try:
        from torch.distributed.tensor.experimental._context_parallel._attention import (
            _cp_options,
        )
    except ImportError:
        return False
    return bool(_cp_options.enable_load_balance)


def check_sequence(length: int | None, cp: int) -> None:
    """A one-line VramscopeError when ``cp`` ranks cannot share a sequence of ``length``."""
    if length is None:
        raise VramscopeError(
            f"--cp {cp}: the workload's batch has no tensor with a sequence dimension "
            "(batch, sequence, ...) to split among the context-parallel ranks"
        )
    chunks = 2 * cp if load_balanced() else cp
    if length % chunks:
        raise VramscopeError(
            f"--cp {cp} does not divide the sequence of {length} tokens into {chunks} equal "
            f"chunks (torch's context parallel gives each rank {chunks // cp} chunk"
            f"{'s' if chunks > cp else ''}: the head and the tail of the sequence)"
        )


def shard_batch(batch: Any, cp: int, coordinate: int) -> Any:
    """``batch`` with each tensor that is as long as the sequence along dimension 1 cut to
    the share of the rank at ``coordinate`` of the context-parallel group (a new tensor:
    the whole one is dropped)."""
    length = sequence_length(batch)
    check_sequence(length, cp)
    assert length is not None
    balanced = load_balanced()

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() <= SEQ_DIM or value.shape[SEQ_DIM] != length:
                return value
            if balanced:
                chunk = length // (2 * cp)
                head = value.narrow(SEQ_DIM, coordinate * chunk, chunk)
                tail = value.narrow(SEQ_DIM, (2 * cp - 1 - coordinate) * chunk, chunk)
                return torch.cat([head, tail], dim=SEQ_DIM)
            chunk = length // cp
            return value.narrow(SEQ_DIM, coordinate * chunk, chunk).clone()
        if isinstance(value, tuple):
            return tuple(cut(v) for v in value)
        if isinstance(value, list):
            return [cut(v) for v in value]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return cut(batch)


@contextlib.contextmanager
def ring_attention(mesh: Any) -> Iterator[None]:
    """torch's context-parallel attention on ``mesh`` (1-D, the context-parallel group)
    inside: ``F.scaled_dot_product_attention`` patched as ``context_parallel`` patches it
    (query, key and value made DTensors split along the sequence, its ring attention
    handler run by DTensor); restored afterwards."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    except ImportError as exc:
        raise VramscopeError(
            f"torch {torch.__version__} has no context parallel ({exc}); --cp needs torch "
            "2.11 or newer"
        ) from None
    import torch.nn.functional as F

    before = F.scaled_dot_product_attention
    mode = cp._dispatch_mode
    cp._dispatch_mode = cp._DispatchMode.MONKEY_PATCH
    cp._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=mesh)
    patched = F.scaled_dot_product_attention
    try:
        yield
    finally:
        cp._disable_context_parallel_dispatcher_impl()
        if F.scaled_dot_product_attention is patched:  # torch's restore did not run
            F.scaled_dot_product_attention = before
        cp._replaced_functions.pop(patched, None)
        cp._dispatch_mode = mode


class ContextApplied:
    """What making a workload context parallel made: the workload (its batch cut to this
    rank's share of the sequence), the context-parallel mesh, and the sequence lengths."""

    def __init__(self, workload: Any, mesh: Any, cp: int, coordinate: int) -> None:
        self.workload = workload
        self.mesh = mesh
        self.cp = cp
        self.coordinate = coordinate
        self.sequence: int | None = None  # the whole sequence, once a batch is made
        self.attention_calls = 0  # scaled_dot_product_attention calls made context parallel

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.cp,
            "rank": self.coordinate,
            "sequence": self.sequence,
            "local_sequence": self.sequence // self.cp if self.sequence else None,
            "load_balanced": load_balanced(),
            "attention": "torch's ring attention (context_parallel's SDPA dispatcher; keys "
            "and values all-gathered once per call, torch's default rotation)",
        }


def apply_context_parallel(
    workload: Any, cp: int, coordinate: int, device: torch.device, mesh: Any = None
) -> ContextApplied:
    """Make a built ``workload`` one rank of a ``cp``-rank context-parallel group: each
    micro-batch cut to the rank's share of the sequence (:func:`shard_batch`). The ring
    attention itself is enabled while the step runs (:func:`ring_attention` on ``mesh``,
    the job's 1-D context-parallel mesh; left out, one over the whole world)."""
    from dataclasses import replace

    from torch.distributed.device_mesh import init_device_mesh

    if mesh is None:
        mesh = init_device_mesh(device.type, (cp,), mesh_dim_names=("cp",))
    applied = ContextApplied(None, mesh, cp, coordinate)
    make = workload.batch

    def batch() -> Any:
        whole = make()
        applied.sequence = sequence_length(whole)
        return shard_batch(whole, cp, coordinate)

    applied.workload = replace(workload, batch=batch)
    return applied
