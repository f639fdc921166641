"""What remaking an optimizer over other parameters needs (sharding and pipeline stages
both make the user's optimizer again over the parameters they keep)."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its constructor accepts (to make one of the same kind)."""
    try:
        accepted = inspect.signature(type(optimizer).__init__).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}
