"""Batch search, micro-batch × accumulation plans, and strategy comparison.

The package is callable: ``vramscope.fit(workload, gpu=... | budget=...)`` is
:func:`vramscope.fit.search.fit`.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from vramscope.fit.search import fit

        return fit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
