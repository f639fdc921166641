"""What an out-of-memory error inside a tracked run leaves behind: where, and why it did not fit."""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import torch

from vramscope.sources import allocator
from vramscope.units import parse_size

_TRIED = re.compile(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)")


def _requested(message: str) -> int | None:
    match = _TRIED.search(message)
    if not match:
        return None
    with contextlib.suppress(Exception):
        return parse_size(match.group(1).replace(" ", ""))
    return None


def module_in_traceback(exc: BaseException, models: list[torch.nn.Module]) -> str | None:
    """The innermost module whose ``forward`` the error came through, by its dotted name."""
    module = None
    tb = exc.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, torch.nn.Module):
            module = candidate
        tb = tb.tb_next
    if module is None:
        return None
    for model in models:
        for name, sub in model.named_modules():
            if sub is module:
                return f"{type(model).__name__}.{name}" if name else type(model).__name__
    return type(module).__name__


def oom_details(
    exc: BaseException,
    device_index: int | None,
    phase: str | None,
    step: int | None,
    module: str | None,
    nvml_device: Any = None,
) -> dict[str, Any]:
    """Collect the OOM report: the allocator's state, the largest blocks, other processes."""
    message = str(exc).strip()
    details: dict[str, Any] = {
        "phase": phase,
        "step": step,
        "module": module,
        "message": message.splitlines()[0] if message else "CUDA out of memory",
        "requested_bytes": _requested(message),
    }
    if device_index is None:
        return details
    with contextlib.suppress(Exception):
        reading = allocator.read(device_index)
        details.update(
            allocated_bytes=reading.allocated_bytes,
            reserved_bytes=reading.reserved_bytes,
            fragmentation_bytes=reading.inactive_split_bytes,
        )
    with contextlib.suppress(Exception):
        free, total = torch.cuda.mem_get_info(device_index)
        details.update(free_bytes=int(free), total_bytes=int(total))
    with contextlib.suppress(Exception):
        blocks: list[dict[str, Any]] = []
        largest_free = 0
        for segment in torch.cuda.memory_snapshot():
            if segment.get("device") != device_index:
                continue
            for block in segment.get("blocks", []):
                if block.get("state") == "active_allocated":
                    blocks.append(
                        {"size_bytes": int(block["size"]), "pool": segment.get("segment_type")}
                    )
                elif block.get("state") == "inactive":
                    largest_free = max(largest_free, int(block["size"]))
        blocks.sort(key=lambda b: b["size_bytes"], reverse=True)
        details["largest_blocks"] = blocks[:10]
        details["largest_free_block_bytes"] = largest_free
    if nvml_device is not None:
        with contextlib.suppress(Exception):
            pid = os.getpid()
            details["other_processes_bytes"] = sum(
                p.used_bytes or 0 for p in nvml_device.processes() if p.pid != pid
            )
    return details
