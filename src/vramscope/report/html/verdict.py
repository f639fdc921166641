"""The verdict of an estimate: does it fit on the target device, and with how much room."""

from __future__ import annotations

from vramscope.report.freeform import text
from vramscope.report.html.blocks import Section
from vramscope.report.model import Report
from vramscope.report.verdict import details, sentence


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
    # the estimator's and the command line's sentence, word for word, and its figures
    message = text(verdict.get("message") or verdict.get("text")) or sentence(verdict)
    message = message[:1].upper() + message[1:]
    rows = details(verdict)
    return Section(
        "verdict.html",
        "verdict",
        "Verdict",
        "Verdict",
        "Predicted without running on the target device.",
        {
            "message": message,
            "style": "fits" if fits is True else "nofit" if fits is False else "",
            "details": rows,
        },
    )
