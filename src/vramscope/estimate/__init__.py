"""Predicting GPU memory without running: fake-tensor tracing and a caching-allocator simulator.

The package is callable: ``vramscope.estimate(workload, batch_size=..., gpu=...)`` is
:func:`vramscope.estimate.estimator.estimate`.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from vramscope.estimate.estimator import estimate

        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
