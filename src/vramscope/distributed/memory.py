"""The memory DDP and FSDP add, named: DDP's gradient buckets, FSDP2's all-gathered
parameters and reduce-scatter buffers, read from the objects while the models live.

DDP copies each gradient into a flat bucket to all-reduce it. The buckets are made when
DDP wraps the model (and remade, in the order gradients arrive, after the first step) and
live as long as it: unless ``gradient_as_bucket_view=True``, when the gradients are views
of the buckets, they hold the gradients' size a second time. Their sizes are what DDP
logs (``_get_ddp_logging_data()``), so the figure is exact (each bucket one block).

FSDP2 (``fully_shard``) keeps each parameter as this rank's shard. Around a group's
forward and backward it all-gathers the group's parameters (world size × the padded shard,
in the mixed-precision parameter dtype) and, in backward, packs the group's gradients
into one reduce-scatter input of the same numel in the reduce dtype. Each group's sizes
are exact from its parameters; how many groups are gathered at the peak is not exposed
(one, two with prefetching; every group between forward and backward when
``reshard_after_forward=False``), and that memory counts as activations or temporaries,
never as parameters (which are the shards).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import torch

from vramscope.tracking.categories import block_bytes

DDP_NOTE = (
    "DDP copies each gradient into flat buckets to all-reduce them; the buckets live as "
    "long as the DDP model, so they hold the gradients' size once more (part of 'other' at "
    "the peak on a GPU: made before the first step). gradient_as_bucket_view=True makes the gradients views of "
    "the buckets and saves this copy."
)
DDP_VIEW_NOTE = (
    "DDP's flat gradient buckets; with gradient_as_bucket_view=True the gradients are "
    "views of them, so they are the gradients (no extra copy)."
)
FSDP_PARAMS_NOTE = (
    "FSDP2 all-gathers a group's parameters (world size × this rank's padded shard) for its "
    "forward and backward: bytes is the largest group, exact; one or two groups (with "
    "prefetching) are gathered at once{resharding}. They count as activations or "
    "temporaries at the peak, never as parameters (those are this rank's shards)."
)
FSDP_REDUCE_NOTE = (
    "In backward FSDP2 packs a group's unsharded gradients into one reduce-scatter input "
    "(in the reduce dtype) before scattering the shards: bytes is the largest group, "
    "exact; one group's at a time, counted as temporaries."
)


def _category(name: str, device_type: str) -> str | None:
    """The category at the peak that holds an item: on the CPU, where only the objects'
    bytes are split into categories, none does (it is in the host RSS)."""
    if name == "gradients" or device_type == "cuda":
        return name
    return None


def _sizes(text: Any) -> list[int]:
    return [int(x) for x in re.split(r"[,\s]+", str(text or "")) if x.isdigit()]


def ddp_buckets(model: torch.nn.Module, device_type: str) -> dict[str, Any] | None:
    """DDP's gradient buckets of ``model`` (a DistributedDataParallel), from its logging data."""
    getter = getattr(model, "_get_ddp_logging_data", None)
    if getter is None:
        return None
    try:
        data = getter()
    except Exception:
        return None
    sizes = _sizes(data.get("rebuilt_bucket_sizes")) if data.get("has_rebuilt_buckets") else []
    sizes = sizes or _sizes(data.get("bucket_sizes"))
    if not sizes:
        return None
    view = bool(data.get("gradient_as_bucket_view"))
    return {
        "name": "ddp_gradient_buckets",
        "label": "DDP gradient buckets",
        "bytes": sum(block_bytes(s, device_type) for s in sizes),
        "category": _category("gradients" if view else "other", device_type),
        "exact": True,
        "buckets": len(sizes),
        "bucket_sizes": sizes,
        "bucket_cap_bytes": data.get("bucket_cap_bytes"),
        "gradient_as_bucket_view": view,
        "note": DDP_VIEW_NOTE if view else DDP_NOTE,
    }


def _fsdp_groups(model: torch.nn.Module, device_type: str) -> list[dict[str, Any]]:
    """Each FSDP2 group under ``model``: its module, all-gathered and reduce-scatter bytes."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    groups = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        with contextlib.suppress(Exception):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            world = int(group.mesh_info.shard_mesh_size)
            gathered = reduce_numel = 0
            reduce_size = 1
            for param in group.fsdp_params:
                numel = world * param.padded_sharded_param_size.numel()
                dtype = param.param_dtype or param.orig_dtype
                gathered += block_bytes(numel * dtype.itemsize, device_type)
                reduce_numel += numel
                reduce_size = (param.reduce_dtype or dtype).itemsize
            groups.append(
                {
                    "module": name,
                    "gathered_bytes": gathered,
                    "reduce_scatter_bytes": block_bytes(reduce_numel * reduce_size, device_type),
                    "reshard_after_forward": bool(getattr(group, "_reshard_after_forward", True)),
                }
            )
    return groups


def fsdp_items(model: torch.nn.Module, device_type: str) -> list[dict[str, Any]]:
    """FSDP2's all-gathered parameters and reduce-scatter buffers under ``model``."""
    groups = _fsdp_groups(model, device_type)
    if not groups:
        return []
    largest = max(groups, key=lambda g: g["gathered_bytes"])
    largest_rs = max(groups, key=lambda g: g["reduce_scatter_bytes"])
    kept = [g["module"] or "the root" for g in groups if not g["reshard_after_forward"]]
    resharding = ""
    if kept:
        resharding = (
            "; groups with reshard_after_forward=False keep theirs from forward to backward: "
            + ", ".join(kept[:5])
            + (", …" if len(kept) > 5 else "")
        )
    return [
        {
            "name": "fsdp_unsharded_parameters",
            "label": "FSDP all-gathered parameters",
            "bytes": largest["gathered_bytes"],
            "total_bytes": sum(g["gathered_bytes"] for g in groups),
            "category": _category("activations" if kept else "temporaries", device_type),
            "exact": True,
            "groups": len(groups),
            "largest_group": largest["module"] or "the root",
            "note": FSDP_PARAMS_NOTE.format(resharding=resharding),
        },
        {
            "name": "fsdp_reduce_scatter_buffers",
            "label": "FSDP reduce-scatter buffers",
            "bytes": largest_rs["reduce_scatter_bytes"],
            "total_bytes": sum(g["reduce_scatter_bytes"] for g in groups),
            "category": _category("temporaries", device_type),
            "exact": True,
            "groups": len(groups),
            "largest_group": largest_rs["module"] or "the root",
            "note": FSDP_REDUCE_NOTE,
        },
    ]


ITEM_ORDER = ("ddp_gradient_buckets", "fsdp_unsharded_parameters", "fsdp_reduce_scatter_buffers")


class DistributedMemory:
    """Reads DDP and FSDP memory from the models a Session sees, while they live.

    A Session calls it (``Session.object_probes``) whenever it counts the objects' bytes:
    when a model is first seen, after the first optimizer step and at the end. The largest
    figure seen per model is kept, so a model gone by the end keeps its items. It also
    notes the default process group's backend while one exists.
    """

    def __init__(self) -> None:
        self._items: dict[tuple[int, str], dict[str, Any]] = {}
        self.backend: str | None = None

    def __call__(self, models: list[torch.nn.Module], device_type: str) -> None:
        self._note_backend()
        for model in models:
            found: list[dict[str, Any]] = []
            ddp = ddp_buckets(model, device_type)
            if ddp is not None:
                found.append(ddp)
                model = getattr(model, "module", model)  # FSDP inside DDP (HSDP-like)
            found.extend(fsdp_items(model, device_type))
            for item in found:
                key = (id(model), item["name"])
                old = self._items.get(key)
                if old is None or (item["bytes"] or 0) >= (old["bytes"] or 0):
                    self._items[key] = item

    def _note_backend(self) -> None:
        if self.backend is not None:
            return
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.backend = str(dist.get_backend())

    def items(self) -> list[dict[str, Any]]:
        """The named pieces, DDP's first, each model's once."""
        return sorted(self._items.values(), key=lambda item: ITEM_ORDER.index(item["name"]))
