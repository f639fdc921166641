"""vramscope: how much GPU (and host) memory a PyTorch run takes, where it goes, how to fit it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Report",
    "Session",
    "Workload",
    "__version__",
    "devices",
    "measure",
    "profile",
    "track",
]

if TYPE_CHECKING:
    from vramscope.report.model import Report
    from vramscope.tracking.runner import measure
    from vramscope.tracking.session import Session, profile, track
    from vramscope.workload import Workload

_LAZY = {
    "Report": "vramscope.report.model",
    "Session": "vramscope.tracking.session",
    "track": "vramscope.tracking.session",
    "profile": "vramscope.tracking.session",
    "measure": "vramscope.tracking.runner",
    "Workload": "vramscope.workload",
}


def __getattr__(name: str) -> Any:
    """Import the public API lazily, so ``vramscope info`` starts without loading torch."""
    if name == "devices":  # a callable module: vramscope.devices() and vramscope.devices.host()
        import importlib

        return importlib.import_module("vramscope.devices")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
