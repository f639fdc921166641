"""An estimate against a real run of the same workload: the peaks side by side, with errors.

Pure: takes the estimate's Report and the measured report as saved (a dict), returns the
``validation`` section that ``vramscope estimate --validate`` and ``vramscope demo`` write.
"""

from __future__ import annotations

from typing import Any

from vramscope.report.model import Report

PEAKS = ("allocated", "reserved", "device_used")


def validation(estimated: Report, measured: dict[str, Any], steps: int) -> dict[str, Any]:
    """The ``validation`` section: both peaks (allocated, reserved, device used), where the
    measured one was, and the estimate's error in % of the measured value."""
    peak = measured.get("peak") or {}
    device = measured.get("device") or {}
    result: dict[str, Any] = {
        "measured": {
            "allocated_bytes": peak.get("allocated_bytes"),
            "reserved_bytes": peak.get("reserved_bytes"),
            "device_used_bytes": peak.get("device_used_bytes"),
            "step": peak.get("step"),
            "phase": peak.get("phase"),
        },
        "estimated": {
            "allocated_bytes": estimated.peak.allocated_bytes,
            "reserved_bytes": estimated.peak.reserved_bytes,
            "device_used_bytes": estimated.peak.device_used_bytes,
        },
        "device": device.get("name"),
        "torch_version": device.get("torch_version"),
        "steps": steps,
        "error_pct": {},
    }
    for key in PEAKS:
        real = result["measured"][f"{key}_bytes"]
        est = result["estimated"][f"{key}_bytes"]
        if real and est is not None:
            result["error_pct"][key] = round(100 * (est / real - 1), 2)
    return result
