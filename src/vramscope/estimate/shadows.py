"""How large a fake tensor may be for a trace to keep its real values beside it.

Integer and boolean tensors (ids, labels, masks, positions, counts, routing) decide sizes
downstream, so they are kept up to :data:`INDEX_SHADOW_LIMIT` elements; floating-point
tensors only up to :data:`SHADOW_LIMIT` (a loss, a scale, a small mask made by arithmetic).
"""

from __future__ import annotations

import torch

SHADOW_LIMIT = 4096  # elements
INDEX_SHADOW_LIMIT = 1 << 22  # elements: 32 MiB of int64


def fits_shadow(t: torch.Tensor) -> bool:
    """Whether ``t`` is small enough to keep real values beside it."""
    floating = t.dtype.is_floating_point or t.dtype.is_complex
    return t.numel() <= (SHADOW_LIMIT if floating else INDEX_SHADOW_LIMIT)
