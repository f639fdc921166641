"""Startup: what exists before the first step (the CUDA context, the model, the optimizer)."""

from __future__ import annotations

from vramscope.report.html.blocks import Section
from vramscope.report.model import Report
from vramscope.units import format_bytes as b


def section(report: Report) -> Section | None:
    """The memory measured before the first step, as label and value pairs."""
    s = report.startup
    items = [
        ("allocated before the first step", s.after_build_allocated_bytes),
        ("reserved before the first step", s.after_build_reserved_bytes),
        ("CUDA context and libraries", s.context_and_libraries_bytes),
        ("host RSS before the first step", s.host_rss_bytes),
    ]
    items = [(k, v) for k, v in items if v is not None]
    if not items:
        return None
    return Section(
        "startup.html",
        "startup",
        "Startup",
        "Startup",
        "What exists before the first step: the CUDA context, the model and the optimizer.",
        {"entries": [(k, b(v)) for k, v in items]},
    )
