"""The memory peak of each phase of one standard step, measured by hand around it."""

from __future__ import annotations

import torch

from vramscope.workload import StepRunner


def manual_phase_peaks(runner: StepRunner) -> dict[str, int]:
    """The same step, untracked, with max_memory_allocated windows at the phase edges."""
    w = runner.workload
    peaks: dict[str, int] = {}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    x, y = w.batch()
    loss = w.loss(w.model, x, y)
    peaks["forward"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    peaks["backward"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    w.optimizer.step()
    peaks["optimizer"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    w.optimizer.zero_grad(set_to_none=True)
    peaks["zero_grad"] = torch.cuda.max_memory_allocated()
    return peaks
