"""What every chart shares: colours, the plotly layout, units, number text and thinning."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from vramscope.report.model import PHASE_NAMES

MAX_POINTS = 2000  # per chart series (~1 bucket a pixel); min and max of each bucket are kept

KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4

SERIES_COLORS = {
    "allocated": "#2563eb",
    "reserved": "#7c3aed",
    "device_used": "#0d9488",
    "host_rss": "#ea580c",
}
CATEGORY_COLORS = {
    "parameters": "#1e40af",
    "buffers": "#60a5fa",
    "gradients": "#7c3aed",
    "optimizer_state": "#c026d3",
    "activations": "#16a34a",
    "temporaries": "#f59e0b",
    "other": "#94a3b8",
}
PHASE_COLORS = {
    "data": "#06b6d4",
    "zero_grad": "#94a3b8",
    "forward": "#22c55e",
    "backward": "#f97316",
    "optimizer": "#a855f7",
    "other": "#64748b",
}

PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    "toImageButtonOptions": {"format": "png", "scale": 2},
}
BASE_LAYOUT: dict[str, Any] = {
    "font": {
        "family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif",
        "size": 12,
        "color": "#334155",
    },
    "paper_bgcolor": "#ffffff",
    "plot_bgcolor": "#ffffff",
    "margin": {"l": 64, "r": 24, "t": 36, "b": 48},
    "hoverlabel": {"align": "left"},
    "colorway": list(SERIES_COLORS.values()),
}
AXIS = {
    "gridcolor": "#eef2f7",
    "linecolor": "#cbd5e1",
    "zerolinecolor": "#cbd5e1",
    "automargin": True,
}


def chart_text(value: Any) -> str:
    """Escape a string that plotly will draw: plotly reads a few HTML tags and entities."""
    return html.escape("" if value is None else str(value), quote=False)


def figure_dict(fig: Any) -> dict[str, Any]:
    """A plotly Figure as plain data, without the bulky default template."""
    data = fig.to_plotly_json()
    layout = data.get("layout", {})
    layout.pop("template", None)
    merged = {**BASE_LAYOUT, **layout}
    for key, value in list(merged.items()):
        if (key.startswith("xaxis") or key.startswith("yaxis")) and isinstance(value, dict):
            merged[key] = {**AXIS, **value}
    return {"data": data.get("data", []), "layout": merged}


def go() -> Any:
    """``plotly.graph_objects``, imported when the first chart is drawn."""
    import plotly.graph_objects

    return plotly.graph_objects


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, bl = int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    return f"rgba({r},{g},{bl},{alpha})"


def phase_order(name: str) -> int:
    """Where a phase goes in legends and tables: as ``PHASE_NAMES`` lists them, others last."""
    return PHASE_NAMES.index(name) if name in PHASE_NAMES else len(PHASE_NAMES)


# ---- numbers ----------------------------------------------------------------------------
def unit_for(max_bytes: float | None) -> tuple[str, int]:
    """The binary unit that reads best for values up to ``max_bytes``."""
    n = max_bytes or 0
    for name, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return name, scale
    return "B", 1


def scaled(values: Sequence[float | int | None], scale: int) -> list[float | None]:
    """Values divided by ``scale`` and rounded for drawing; gaps stay ``None``."""
    out: list[float | None] = []
    for v in values:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            out.append(None)
        else:
            out.append(round(v / scale, 4))
    return out


def pct(part: float | None, whole: float | None) -> str:
    """``part`` as a percentage of ``whole`` (``12.5%``), empty when either is unknown."""
    if part is None or not whole:
        return ""
    return f"{100 * part / whole:.1f}%"


def duration(seconds: float | None) -> str:
    """A duration as people read it: ``850.0 ms``, ``1.25 s``, ``12.5 s``."""
    if seconds is None:
        return ""
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def largest(values: Sequence[float | int | None]) -> float | None:
    """The largest value present, or ``None`` when all are missing."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def downsample_minmax(
    x: Sequence[float], y: Sequence[float | int | None], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float | int | None]]:
    """Thin a series to at most ``max_points`` by keeping the min and max of each bucket.

    Every peak survives (the global maximum is the maximum of its bucket); a bucket with
    no value keeps one ``None`` so gaps stay gaps.
    """
    n = len(x)
    if n <= max_points:
        return list(x), list(y)
    buckets = max(1, max_points // 2)
    out_x: list[float] = []
    out_y: list[float | int | None] = []
    for k in range(buckets):
        lo, hi = k * n // buckets, (k + 1) * n // buckets
        present = [i for i in range(lo, hi) if y[i] is not None]
        if not present:
            out_x.append(x[lo])
            out_y.append(None)
            continue
        i_min = min(present, key=lambda i: y[i])  # type: ignore[arg-type,return-value]
        i_max = max(present, key=lambda i: y[i])  # type: ignore[arg-type,return-value]
        for i in sorted({i_min, i_max}):
            out_x.append(x[i])
            out_y.append(y[i])
    return out_x, out_y
