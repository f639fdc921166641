"""``torch.nn.init`` under a trace: the checks of each initializer, none of its values.

An initializer writes values into a tensor that already exists, so it allocates nothing
that matters to an estimate. Traced op by op under fake tensors it can still cost minutes:
torch 2.14's ``trunc_normal_`` is a rejection loop on ``mask.any()``, ``orthogonal_`` runs a
QR decomposition, ``dirac_`` and ``sparse_`` loop over channels and columns in Python. While
a trace runs, each of them, given a fake tensor of the trace, runs instead on a meta tensor
of the same shape, dtype and strides: the same argument checks, errors and warnings, no
values, no traced ops. A small tensor whose real values the trace keeps (for ``.item()``)
gets them from the real initializer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch
from torch.utils.weak import WeakIdKeyDictionary

# the initializers that draw values or loop; constant_, ones_ and zeros_ are one op each
INITIALIZERS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
    "eye_",
    "dirac_",
)


def _metadata_only(
    original: Callable[..., Any], mode: Any, shadows: WeakIdKeyDictionary
) -> Callable[..., Any]:
    @functools.wraps(original)
    def initializer(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(tensor, FakeTensor) or tensor.fake_mode is not mode:
            return original(tensor, *args, **kwargs)
        with no_dispatch():
            meta = torch.empty_strided(
                tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta"
            )
            original(meta, *args, **kwargs)
            shadow = shadows.get(tensor)
            if shadow is not None:
                original(shadow, *args, **kwargs)
        return tensor

    return initializer


@contextlib.contextmanager
def metadata_only_initializers(mode: Any, shadows: WeakIdKeyDictionary) -> Iterator[None]:
    """While tracing with ``mode``: ``torch.nn.init``'s initializers check their arguments
    and leave fake tensors of ``mode`` as they are; put back afterwards."""
    init = torch.nn.init
    saved = {name: getattr(init, name) for name in INITIALIZERS if hasattr(init, name)}
    for name, original in saved.items():
        setattr(init, name, _metadata_only(original, mode, shadows))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(init, name, original)
