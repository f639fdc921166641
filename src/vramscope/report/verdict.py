"""An estimate's verdict in words: does it fit, with how much room, and when it does not, what
it needs on a GPU large enough and where the named one runs out. Written once from the
report's ``verdict`` section (the estimator's finding, the ``estimate`` command's last line
and the HTML page all use it); pure, and a field of the wrong type reads as missing."""

from __future__ import annotations

from typing import Any

from vramscope.report.freeform import mapping, number, text
from vramscope.report.words import a
from vramscope.units import format_bytes


def target_name(verdict: dict[str, Any]) -> str:
    """The GPU as the device calls itself (its profile's name in files saved before)."""
    return text(verdict.get("gpu_name") or verdict.get("gpu")) or "the GPU"


def _budget(verdict: dict[str, Any]) -> int | None:
    return number(verdict.get("reserved_limit_bytes"))


def runs_out(verdict: dict[str, Any]) -> str:
    """Where the step runs out of memory: ``in the forward phase of step 0, allocating
    1.95 GiB`` (empty when it does not)."""
    oom = mapping(verdict.get("oom_at"))
    if not oom:
        return ""
    phase, step = text(oom.get("phase")), number(oom.get("step"))
    where = "while building the model" if phase == "build" or step == -1 else ""
    if not where:
        where = f"in the {phase} phase" if phase else "in a step"
        if step is not None:
            where += f" of step {step}"
    request = number(oom.get("request_bytes"))
    if request is not None:
        where += f", allocating {format_bytes(request)}"
    held = number(oom.get("reserved_bytes"))
    if held is not None:
        where += f" with {format_bytes(held)} reserved"
    return where


def upper_words(verdict: dict[str, Any]) -> str:
    """The upper bound of device used, when it says more than the point: ``up to 8.57 GiB
    with the allowances for what an estimate cannot know (cuDNN's engine choice)`` when the
    bound is 1 % above the point or more, or when it does not fit though the point does
    (empty otherwise, and for a verdict saved before the bound existed)."""
    used = number(verdict.get("device_used_bytes"))
    upper = number(verdict.get("device_used_upper_bytes"))
    total = number(verdict.get("total_bytes"))
    if used is None or upper is None or upper <= used:
        return ""
    over = total is not None and upper > total
    if upper - used < 0.01 * used and not over:
        return ""
    words = f"up to {format_bytes(upper)} with the allowances for what an estimate cannot know"
    if over:
        words += f", more than its {format_bytes(total)}: it may not fit"
    return words


def sentence(verdict: dict[str, Any]) -> str:
    """The verdict in one sentence.

    Fits: ``fits on NVIDIA H200: device used 1.04 GiB of 139.80 GiB, 138.77 GiB (99.3%)
    free``. Does not: ``does not fit on NVIDIA GeForce RTX 4090: it needs 33.10 GiB (device
    used on a GPU large enough), 9.11 GiB more than its 23.99 GiB; it runs out in the
    forward phase of step 0, allocating 1.95 GiB with 23.10 GiB reserved``. Under a budget
    (what ``fit --budget`` caps), reserved memory against the budget instead."""
    total = number(verdict.get("total_bytes"))
    used = number(verdict.get("device_used_bytes"))
    budget = _budget(verdict)
    name = target_name(verdict)
    needs = mapping(verdict.get("needs"))
    if verdict.get("fits"):
        if budget is not None:
            reserved = number(verdict.get("reserved_bytes"))
            return f"fits {a(format_bytes(budget))} budget: reserved {format_bytes(reserved)}"
        headroom = number(verdict.get("headroom_bytes"))
        pct = number(verdict.get("headroom_pct"))
        parts = []
        if used is not None and total is not None:
            parts.append(f"device used {format_bytes(used)} of {format_bytes(total)}")
        if headroom is not None:
            shown = f" ({pct:.1f}%)" if pct is not None else ""
            parts.append(f"{format_bytes(headroom)}{shown} free")
        line = f"fits on {name}" + (f": {', '.join(parts)}" if parts else "")
        bound = upper_words(verdict)
        return f"{line}; {bound}" if bound else line
    if budget is not None:
        line = f"does not fit {a(format_bytes(budget))} budget"
        need = number(needs.get("reserved_bytes"))
        if need is not None:
            line += (
                f": it needs {format_bytes(need)} reserved (on a GPU large enough), "
                f"{format_bytes(need - budget)} more"
            )
    else:
        line = f"does not fit on {name}"
        need = number(needs.get("device_used_bytes"))
        if need is not None and total is not None:
            line += (
                f": it needs {format_bytes(need)} (device used on a GPU large enough), "
                f"{format_bytes(need - total)} more than its {format_bytes(total)}"
            )
        elif used is not None and total is not None:
            line += f": device used {format_bytes(used)} of {format_bytes(total)}"
        elif (number(verdict.get("headroom_bytes")) or 0) < 0:
            short = -(number(verdict.get("headroom_bytes")) or 0)
            line += f": it needs {format_bytes(short)} more than it has"
    where = runs_out(verdict)
    return f"{line}; it runs out {where}" if where else line


def details(verdict: dict[str, Any]) -> list[tuple[str, str]]:
    """The verdict's figures as labelled rows (the HTML page's key–value list)."""
    rows: list[tuple[str, str]] = []
    total = number(verdict.get("total_bytes"))
    budget = _budget(verdict)
    if budget is not None:
        rows.append(("budget (reserved)", format_bytes(budget)))
    if total is not None:
        rows.append((f"memory of {target_name(verdict)}", format_bytes(total)))
    used = number(verdict.get("device_used_bytes"))
    if used is not None:
        rows.append(("device used (nvidia-smi), peak", format_bytes(used)))
    upper = number(verdict.get("device_used_upper_bytes"))
    if upper is not None and used is not None and upper > used:
        rows.append(("device used, upper bound", format_bytes(upper)))
    if verdict.get("fits"):
        headroom = number(verdict.get("headroom_bytes"))
        pct = number(verdict.get("headroom_pct"))
        if headroom is not None:
            shown = format_bytes(headroom) + (f" ({pct:.1f}%)" if pct is not None else "")
            rows.append(("free", shown))
        return rows
    needs = mapping(verdict.get("needs"))
    for key, label in (
        ("device_used_bytes", "needs on a GPU large enough: device used"),
        ("reserved_bytes", "needs on a GPU large enough: reserved"),
        ("allocated_bytes", "needs on a GPU large enough: allocated"),
    ):
        value = number(needs.get(key))
        if value is not None:
            rows.append((label, format_bytes(value)))
    where = runs_out(verdict)
    if where:
        rows.append(("runs out", where))
    return rows
