"""vramscope: how much GPU (and host) memory a PyTorch run takes, where it goes, how to fit it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Report",
    "Session",
    "Workload",
    "__version__",
    "compare",
    "devices",
    "estimate",
    "fit",
    "measure",
    "profile",
    "track",
]

if TYPE_CHECKING:
    from vramscope.contract import Workload
    from vramscope.fit.compare import compare
    from vramscope.report.model import Report
    from vramscope.tracking.runner import measure
    from vramscope.tracking.session import Session, profile, track

_LAZY = {
    "Report": "vramscope.report.model",
    "Session": "vramscope.tracking.session",
    "track": "vramscope.tracking.session",
    "profile": "vramscope.tracking.session",
    "measure": "vramscope.tracking.runner",
    "compare": "vramscope.fit.compare",
    "Workload": "vramscope.contract",
}


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext vramscope`` in IPython or Jupyter: adds the ``%%vramscope`` cell magic."""
    from vramscope.integrations.ipython import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    """Import the public API lazily, so ``vramscope info`` starts without loading torch."""
    if name in ("devices", "estimate", "fit"):  # callable modules: vramscope.fit(...) and
        import importlib  # vramscope.fit.search both work

        return importlib.import_module(f"vramscope.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
