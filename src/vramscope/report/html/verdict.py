"""The verdict of an estimate: does it fit on the target device, and with how much room."""

from __future__ import annotations

from vramscope.report.html.blocks import Section
from vramscope.report.html.charts import pct
from vramscope.report.model import Report
from vramscope.units import format_bytes as b

SHOWN_APART = ("message", "text", "fits", "headroom_bytes", "gpu", "budget_bytes")


def section(report: Report) -> Section | None:
    """The verdict in one line (written from its numbers when it has no message) and details."""
    verdict = report.extra.get("verdict")
    if verdict is None:
        return None
    if not isinstance(verdict, dict):
        return Section(
            "verdict.html",
            "verdict",
            "Verdict",
            "Verdict",
            "",
            {"message": verdict, "style": None, "details": []},
        )
    fits = verdict.get("fits")
    headroom = verdict.get("headroom_bytes")
    budget = verdict.get("budget_bytes") or report.device.get("total_bytes")
    message = verdict.get("message") or verdict.get("text")
    if not message:
        if fits is True:
            message = "Fits"
        elif fits is False:
            message = "Does not fit"
        else:
            message = "Estimate"
        target = verdict.get("gpu") or report.device.get("name")
        if target:
            message += f" on {target}"
        if isinstance(headroom, (int, float)):
            message += (
                f" with {b(headroom)} headroom" if headroom >= 0 else f": {b(-headroom)} short"
            )
            if budget:
                message += f" ({pct(abs(headroom), budget)} of {b(budget)})"
    details = [
        (
            str(k).replace("_", " "),
            b(v) if str(k).endswith("bytes") and isinstance(v, (int, float)) else str(v),
        )
        for k, v in verdict.items()
        if k not in SHOWN_APART and isinstance(v, (str, int, float, bool))
    ]
    return Section(
        "verdict.html",
        "verdict",
        "Verdict",
        "Verdict",
        "Predicted without running on the target device.",
        {
            "message": message,
            "style": "fits" if fits is True else "nofit" if fits is False else "",
            "details": details,
        },
    )
