"""Which torch versions the estimator supports, and the one line that refuses the others.

The estimator works inside torch: it emulates the CUDA device through symbols of torch's
libraries, subclasses the fake-tensor mode and builds its cache keys. Those internals change
between releases, so only the versions its tests pass on are accepted (``noxfile.py`` runs
them: torch 2.11, 2.13 CPU build, 2.14.1 and 2.15.0; 2.11 is also the GPU tests'). Measuring a
real run (``run``, ``measure``, ``track``) uses public APIs only and is not limited here.
"""

from __future__ import annotations

import os

import torch

from vramscope.errors import VramscopeError

OLDEST = (2, 11)  # the oldest minor release supported
NEWEST = (2, 15)  # the newest minor release supported
OVERRIDE = "VRAMSCOPE_ANY_TORCH"  # set to 1 to estimate with another torch anyway


def torch_release(version: str | None = None) -> tuple[int, int]:
    """``(2, 14)`` for ``"2.14.1+cu130"`` and ``"2.14.0.dev20260101"``."""
    text = str(version if version is not None else torch.__version__)
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def supported_range() -> str:
    return f">={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"


def check_torch_version(version: str | None = None) -> None:
    """Raise a one-line :class:`VramscopeError` when this torch is not one the estimator
    supports (unless ``VRAMSCOPE_ANY_TORCH=1``)."""
    release = torch_release(version)
    if OLDEST <= release <= NEWEST or os.environ.get(OVERRIDE, "") not in ("", "0"):
        return
    shown = version if version is not None else torch.__version__
    raise VramscopeError(
        f"vramscope estimates need torch {OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]} "
        f"(this is torch {shown}): install one of those, or set {OVERRIDE}=1 to try anyway"
    )
