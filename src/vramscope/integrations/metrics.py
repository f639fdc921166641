"""Memory figures for a trainer's log lines: the peak since the previous line, and host RSS."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vramscope.tracking.session import Session

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

    The figures come from :meth:`Session.window`: the exact peaks since the previous line,
    one allocator read per log line and nothing per step, and nothing the user reads is
    reset (their own ``torch.cuda.max_memory_allocated()`` stays theirs). Host RSS of the
    process is read at every close; on the CPU that is the only figure. The largest values
    since :meth:`start_epoch` are kept for the epoch summary.
    """

    session: Session | None = None
    epoch_peaks: dict[str, int] = field(default_factory=dict)

    def open(self) -> None:
        if self.session is not None:
            self.session.window()  # what came before belongs to no line

    def close(self) -> dict[str, int]:
        """Bytes since the window opened: ``peak_allocated``, ``peak_reserved`` and
        ``allocated`` (CUDA only), ``host_rss``; then the window opens again."""
        if self.session is None:
            return {}
        window = self.session.window()
        figures: dict[str, int] = {}
        if window["peak_allocated_bytes"] is not None:
            figures["peak_allocated"] = int(window["peak_allocated_bytes"])
            figures["peak_reserved"] = int(window["peak_reserved_bytes"] or 0)
            figures["allocated"] = int(window["allocated_bytes"] or 0)
        if window["host_rss_bytes"] is not None:
            figures["host_rss"] = int(window["host_rss_bytes"])
        for key in ("peak_allocated", "peak_reserved", "host_rss"):
            if key in figures:
                self.epoch_peaks[key] = max(self.epoch_peaks.get(key, 0), figures[key])
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
