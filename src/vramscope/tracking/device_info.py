"""What a tracked run's report and journal say about its device and allocator settings.

Kept apart from :mod:`vramscope.tracking.assemble`, so that a session's journal can write
them when the session starts without importing what making a report needs."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from vramscope.sources import nvml


def allocator_config() -> str | None:
    """The caching allocator's settings, as the environment gives them."""
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")


def device_info(session: Any) -> dict[str, Any]:
    """The device a session (vramscope.tracking.session.Session) tracks."""
    info: dict[str, Any] = {
        "type": session._device_type,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    if session._device_index is None:
        info["name"] = platform.processor() or platform.machine() or "cpu"
        info["total_bytes"] = None
        return info
    props = torch.cuda.get_device_properties(session._device_index)
    info.update(
        name=props.name,
        index=session._device_index,
        total_bytes=int(props.total_memory),
        capability=f"{props.major}.{props.minor}",
        cuda_version=torch.version.cuda,
        driver_version=nvml.driver_version(),
    )
    return info
