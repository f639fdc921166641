"""What the workload's objects hold on the emulated device: parameters, buffers, gradients and
optimizer state, found from the model and optimizer themselves and labelled in the trace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from vramscope.errors import WorkloadError
from vramscope.estimate.recorder import Recorder, sparse_parts
from vramscope.tracking.categories import local_tensor
from vramscope.tracking.categories import tensors_in as _tensors_in
from vramscope.workload import Workload, torch_optimizers


def _apply_order(module: torch.nn.Module) -> Iterator[tuple[torch.Tensor, str]]:
    """Parameters and buffers in the order ``Module._apply`` (``.to(device)``) visits them."""
    for child in module.children():
        yield from _apply_order(child)
    for p in module._parameters.values():
        if p is not None:
            yield p, "parameter"
    for b in module._buffers.values():
        if b is not None:
            yield b, "buffer"


def _storage(t: torch.Tensor) -> Any | None:
    t = local_tensor(t)  # a DTensor (FSDP2): this rank's shard
    if isinstance(t, FakeTensor) and t.fake_device.type == "cuda" and t.layout == torch.strided:
        return t.untyped_storage()
    return None


def _check_device(workload: Workload, spec: str) -> None:
    """The model must be on the device build() was given; say so when it is not."""
    for name, p in list(workload.model.named_parameters())[:1000]:
        if local_tensor(p) is not p:
            continue  # sharded by FSDP2, which placed it (on the CPU when offloading)
        device = p.fake_device if isinstance(p, FakeTensor) else p.device
        if device.type != "cuda" or (device.index or 0) != 0:
            raise WorkloadError(
                f"{spec} built its model on {device} (parameter {name}), ignoring the "
                "device passed to build(); move it with model.to(device) so it can be estimated"
            )


def _force_foreach(optimizers: Any) -> list[str]:
    """On CUDA, torch's optimizers pick the foreach implementation by default; fake tensors
    are not of the types that default checks, so ask for it explicitly (each of a
    workload's optimizers)."""
    changed: list[str] = []
    for optimizer in torch_optimizers(optimizers):
        if "foreach" not in optimizer.defaults:
            continue
        mine = False
        for group in optimizer.param_groups:
            if (
                group.get("foreach") is None
                and not group.get("fused")
                and not group.get("differentiable")
            ):
                group["foreach"] = mine = True
        if mine:
            changed.append(type(optimizer).__name__)
            if optimizer.defaults.get("foreach") is None:
                optimizer.defaults["foreach"] = True
    return changed


def _iterations_at_their_limit(optimizers: Any) -> list[str]:
    """An optimizer whose step repeats until the values converge (LBFGS: up to ``max_iter``
    evaluations, keeping ``history_size`` pairs of parameter-sized vectors) stops where the
    trace's assumed values say it has converged, at once. Its tolerances are set so that it
    never does: it runs to its iteration limit and fills its history, the most memory it
    can take. The notes for the report (the objects are the estimate's own)."""
    notes = []
    for optimizer in torch_optimizers(optimizers):
        if not isinstance(optimizer, torch.optim.LBFGS):
            continue
        for group in optimizer.param_groups:
            group["tolerance_grad"] = group["tolerance_change"] = float("-inf")
        group = optimizer.param_groups[0]
        notes.append(
            f"{type(optimizer).__name__}: run to its limit ({group['max_iter']} iterations, "
            f"a history of {group['history_size']}): when its values converge sooner it takes "
            "less memory than this"
        )
    return notes


def _built_state(workload: Workload) -> list[tuple[Any, str]]:
    """Storages of the model (in ``.to(device)`` order) and of any optimizer state.

    A function of its own so that no loop variable keeps a storage alive afterwards."""
    ordered: list[tuple[Any, str]] = []
    for t, kind in _apply_order(workload.model):
        st = _storage(t)
        if st is not None:
            ordered.append((st, kind))
    for _, state in optimizer_state(workload.optimizer):
        for t in _tensors_in(state):
            st = _storage(t)
            if st is not None:
                ordered.append((st, "optimizer_state"))
    return ordered


def optimizer_state(optimizer: Any) -> Iterator[tuple[Any, Any]]:
    """(parameter, state) of each parameter the optimizer updates: its own state, or that of
    the optimizer it wraps (``ZeroRedundancyOptimizer`` keeps its share's in ``optim``)."""
    for one in torch_optimizers(optimizer):  # (several: a list, or a wrapper's)
        inner = getattr(one, "optim", None)
        if isinstance(inner, torch.optim.Optimizer) and inner is not one:
            yield from inner.state.items()
        else:
            yield from one.state.items()


def _label_persistent(recorder: Recorder, workload: Workload) -> None:
    """Parameters, buffers, gradients and optimizer state are what the objects hold now
    (called after set-up, when backward ends and when the optimizer step ends), each with
    the module that owns it (its first owner: tied weights count once)."""
    owners: dict[int, str] = {}
    for name, module in workload.model.named_modules():
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None:
                owners.setdefault(id(t), name)
    for t in workload.model.parameters():
        st = _storage(t)
        if st is not None:
            recorder.retag(st, "parameter", owners.get(id(t)))
    for t in workload.model.buffers():
        st = _storage(t)
        if st is not None:
            recorder.retag(st, "buffer", owners.get(id(t)))
    for p in workload.model.parameters():
        if p.grad is not None:
            st = _storage(p.grad)
            if st is not None:
                recorder.retag(st, "gradient", owners.get(id(p)))
            elif p.grad.layout != torch.strided:  # a sparse gradient (nn.Embedding(sparse=True))
                for part in sparse_parts(p.grad):
                    recorder.retag(part.untyped_storage(), "gradient", owners.get(id(p)))
    for p, state in optimizer_state(workload.optimizer):
        for t in _tensors_in(state):
            st = _storage(t)
            if st is not None:
                recorder.retag(st, "optimizer_state", owners.get(id(p)))


def _module_table(
    recorder: Recorder, workload: Workload, names: dict[int, str]
) -> list[dict[str, Any]]:
    """Parameters, gradients and optimizer state each module owns (its own tensors)."""
    rows: dict[str, dict[str, Any]] = {}
    opt_state: dict[int, int] = {}
    for p, state in optimizer_state(workload.optimizer):
        opt_state[id(p)] = sum(
            _block(st.nbytes()) for t in _tensors_in(state) if (st := _storage(t)) is not None
        )
    seen: set[int] = set()
    seen_storages: set[int] = set()  # a recurrent layer's weights share one cuDNN buffer
    for name, module in workload.model.named_modules():
        own = [p for p in module._parameters.values() if p is not None and id(p) not in seen]
        seen.update(id(p) for p in own)
        stored = []
        for p in own:
            key = local_tensor(p).untyped_storage()._cdata
            if key not in seen_storages:
                seen_storages.add(key)
                stored.append(p)
        row = {
            "name": name,
            "class": type(module).__name__,
            "depth": 0 if not name else name.count(".") + 1,
            "parameters_bytes": sum(_block(n) for p in stored if (n := _nbytes(p)) is not None),
            "gradients_bytes": sum(
                _block(n) for p in stored if p.requires_grad and (n := _nbytes(p)) is not None
            )
            if workload.training
            else 0,
            "optimizer_state_bytes": sum(opt_state.get(id(p), 0) for p in own),
            "buffers_bytes": sum(
                _block(b.untyped_storage().nbytes())
                for b in module._buffers.values()
                if b is not None
            ),
        }
        rows[row["name"]] = row
    return list(rows.values())


def _nbytes(t: torch.Tensor) -> int | None:
    """The bytes of the storage behind ``t`` on the device (None when it is elsewhere:
    FSDP2's shards offloaded to the CPU)."""
    st = _storage(t)
    return st.nbytes() if st is not None else None


def _block(nbytes: int) -> int:
    return -(-max(nbytes, 1) // 512) * 512
