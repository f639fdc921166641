"""Findings: what vramscope noticed about the run, worst first."""

from __future__ import annotations

from vramscope.report.html.blocks import Section
from vramscope.report.model import Report

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def section(report: Report) -> Section | None:
    """One card per finding, errors first; an unknown severity is drawn as info."""
    if not report.findings:
        return None
    items = sorted(report.findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    findings = [
        {
            "style": f.severity if f.severity in SEVERITY_ORDER else "info",
            "severity": f.severity,
            "message": f.message,
        }
        for f in items
    ]
    return Section(
        "findings.html",
        "findings",
        "Findings",
        "Findings",
        "What vramscope noticed, in plain words.",
        {"findings": findings},
    )
