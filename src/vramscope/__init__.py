"""vramscope: how much GPU (and host) memory a PyTorch run takes, where it goes, how to fit it."""

from __future__ import annotations

__version__ = "0.1.0"
