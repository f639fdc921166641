"""transformers as it runs eagerly on the GPU, also under the estimate's fake tensors.

transformers asks whether a tensor is a ``FakeTensor`` (``utils.import_utils.is_tracing``) to
behave as under ``torch.compile``: it then never reads values of tensors, and so never skips
the attention mask. Eagerly on a GPU it does: an all-ones padding mask (what ``generate()``
and a tokenizer pass) is dropped in favour of SDPA's ``is_causal``, which lets the flash and
memory-efficient kernels run without a mask. In an estimate the fake tensors stand for real
GPU tensors, so the question is answered as it would be there: not fake. The values
transformers then reads come from :mod:`~vramscope.estimate.scalars` (an all-ones mask reads
as all ones).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


def _not_fake(_value: Any) -> bool:
    return False


@contextlib.contextmanager
def eager_transformers() -> Iterator[None]:
    """While the steps run (training, inference and generation): transformers' ``is_fake_tensor`` says no. Nothing happens when
    the build did not import transformers."""
    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_fake_tensor", None)
    if original is None:
        yield
        return
    utils.is_fake_tensor = _not_fake
    try:
        yield
    finally:
        utils.is_fake_tensor = original
