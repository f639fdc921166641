"""Memory figures for a trainer's log lines: the peak since the previous line, and host RSS."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vramscope.sources.host import ProcessTreeRss

MIB = 1024**2
PREFIX = "vramscope/"


def unwrap_optimizer(optimizer: object) -> torch.optim.Optimizer | None:
    """The torch optimizer inside a framework's wrapper: Lightning's ``LightningOptimizer``
    and accelerate's ``AcceleratedOptimizer`` pass as optimizers themselves and keep the
    real one as ``.optimizer``."""
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer = inner
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def _mib(n: int) -> float:
    return round(n / MIB, 2)


@dataclass
class LogWindow:
    """Memory between two log lines of a trainer.

    On a CUDA device already in use, the window resets torch's peak counters when it opens
    (``torch.cuda.reset_peak_memory_stats``, which vramscope's own tracking is immune to) and
    reads ``max_memory_allocated``/``max_memory_reserved`` when it closes: one stats read per
    log line, nothing per step. Host RSS of the process tree is read at every close; on the
    CPU that is the only figure. The largest values since :meth:`start_epoch` are kept for
    the epoch summary.
    """

    device: torch.device | None = None
    epoch_peaks: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rss = ProcessTreeRss()

    def _cuda_index(self) -> int | None:
        if self.device is not None and self.device.type != "cuda":
            return None
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None  # never create a CUDA context for a figure
        if self.device is not None and self.device.index is not None:
            return self.device.index
        return torch.cuda.current_device()

    def open(self) -> None:
        index = self._cuda_index()
        if index is not None:
            torch.cuda.reset_peak_memory_stats(index)

    def close(self) -> dict[str, int]:
        """Bytes since the window opened: ``peak_allocated``, ``peak_reserved`` and
        ``allocated`` (CUDA only), ``host_rss``; then the window opens again."""
        figures: dict[str, int] = {}
        index = self._cuda_index()
        if index is not None:
            stats = torch.cuda.memory_stats(index)
            figures["peak_allocated"] = int(stats.get("allocated_bytes.all.peak", 0))
            figures["peak_reserved"] = int(stats.get("reserved_bytes.all.peak", 0))
            figures["allocated"] = int(stats.get("allocated_bytes.all.current", 0))
        figures["host_rss"] = self._rss.read()
        for key in ("peak_allocated", "peak_reserved", "host_rss"):
            if key in figures:
                self.epoch_peaks[key] = max(self.epoch_peaks.get(key, 0), figures[key])
        self.open()
        return figures

    def start_epoch(self) -> None:
        self.epoch_peaks = {}


def as_metrics(figures: dict[str, int], prefix: str = "") -> dict[str, float]:
    """``{"vramscope/peak_allocated_mib": 1234.5, ...}``: byte figures as MiB metrics."""
    return {f"{PREFIX}{prefix}{key}_mib": _mib(value) for key, value in figures.items()}


def epoch_line(epoch: int, steps: int, figures: dict[str, int]) -> str:
    """One human line for an epoch's summary."""
    from vramscope.units import format_bytes

    parts = [f"vramscope: epoch {epoch}, {steps} steps"]
    if "peak_allocated" in figures:
        parts.append(f"peak allocated {format_bytes(figures['peak_allocated'])}")
        parts.append(f"peak reserved {format_bytes(figures['peak_reserved'])}")
    if "host_rss" in figures:
        parts.append(f"host RSS {format_bytes(figures['host_rss'])}")
    return ", ".join(parts)
