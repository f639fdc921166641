"""Terminal tables for the ``fit`` section of a report (fit and compare); no torch here.

The section may come from a saved file (``vramscope report fit.json``), so every value is
read defensively: a field of the wrong type shows as blank instead of failing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from vramscope.fit.answer import final_answer
from vramscope.report.freeform import number as _number
from vramscope.report.freeform import records as _records
from vramscope.report.freeform import text as _text
from vramscope.report.model import Finding, Report
from vramscope.report.widths import fitting
from vramscope.units import format_bytes


def b(value: Any, signed: bool = False) -> str:
    return format_bytes(_number(value), signed=signed)


def _peak_cells(peak: Any, allocated: bool = True) -> list[str]:
    peak = peak if isinstance(peak, dict) else {}
    keys = ("allocated_bytes",) * allocated + ("reserved_bytes", "device_used_bytes")
    return [b(peak.get(key)) for key in keys]


def _yes(value: Any) -> str:
    return "" if value is None else "yes" if value else "no"


def headline(section: dict[str, Any]) -> Text:
    """ "Largest batch size: N", the verified answer when real trials found one, with what the
    estimate said beside it."""
    target = section.get("target") if isinstance(section.get("target"), dict) else {}
    margin = _number(target.get("margin")) or 0
    answer = section.get("answer") if isinstance(section.get("answer"), dict) else None
    answer = answer or final_answer(section)
    estimated = _text(section.get("max_batch_size"))
    without = _text(section.get("max_batch_size_without_margin"))
    estimates = f"{_text(section.get('estimates') or 0)} estimates"
    text = Text()
    per_rank = section.get("per_rank") if isinstance(section.get("per_rank"), dict) else None
    if per_rank is not None:
        size = _number(answer.get("max_batch_size"))
        world = _number(per_rank.get("world_size"))
        text.append(
            f"Largest batch size per GPU: {_text(answer.get('max_batch_size'))}",
            style="bold green",
        )
        text.append(f" ({_text(per_rank.get('summary'))}")
        if size is not None and world is not None:
            text.append(f": {size * world:,} samples a step over the job")
        text.append(")\n")
    else:
        text.append(
            f"Largest batch size: {_text(answer.get('max_batch_size'))}", style="bold green"
        )
    if answer.get("source") == "verify":
        limit = "budget" if target.get("kind") == "budget" else "GPU memory"
        text.append(
            f"  (verified with {_text(answer.get('real_trials'))} real trials at the full "
            f"{limit}; the estimate said {estimated} with the {margin:.0%} margin, "
            f"{without} without, from {estimates})"
        )
        return text
    text.append(
        f"  (without the {margin:.0%} margin: {without}; {_text(section.get('method'))}, "
        f"{estimates})"
    )
    verify = section.get("verify")
    if isinstance(verify, dict) and verify.get("error"):
        text.append(
            f"\nNot verified: {_text(verify['error'])}; the answer is the estimate's", style="red"
        )
    return text


def _length_name(section: dict[str, Any]) -> str:
    return "prompt length" if _number(section.get("new_tokens")) else "sequence length"


def sequence_headline(section: dict[str, Any]) -> Text:
    """ "Longest sequence: N tokens" (``fit --seq-len``), with its new tokens for generation."""
    target = section.get("target") if isinstance(section.get("target"), dict) else {}
    margin = _number(target.get("margin")) or 0
    best = _number(section.get("max_seq_len"))
    new = _number(section.get("new_tokens"))
    text = Text()
    if new:
        total = f" + {new:.0f} new = {best + new:.0f} tokens" if best else ""
        text.append(
            f"Longest prompt: {_text(section.get('max_seq_len'))}{total}", style="bold green"
        )
    else:
        text.append(
            f"Longest sequence: {_text(section.get('max_seq_len'))} tokens", style="bold green"
        )
    text.append(
        f"  (batch {_text(section.get('batch_size'))}; without the {margin:.0%} margin: "
        f"{_text(section.get('max_seq_len_without_margin'))}; {_text(section.get('method'))}, "
        f"{_text(section.get('estimates') or 0)} estimates)"
    )
    return text


def _curve(section: dict[str, Any], key: str, column: str, title: str) -> list[RenderableType]:
    """The estimates the search made, by the size it searched."""
    curve = _records(section.get("curve"))
    if not curve:
        return []
    t = Table(box=box.SIMPLE_HEAD, title=title)
    for col in (column, "allocated", "reserved", "device used", "fits"):
        t.add_column(col, justify="right")
    for point in curve:
        t.add_row(_text(point.get(key)), *_peak_cells(point.get("peak")), _yes(point.get("fits")))
    return [fitting(t)]


def render_fit_report(report: Report) -> Group:
    """What ``fit`` and ``compare`` print: the fit section and the fit warnings."""
    section = report.extra.get("fit")
    return render_fit(section if isinstance(section, dict) else {}, report.findings)


def render_fit(section: dict[str, Any], findings: Sequence[Finding] = ()) -> Group:
    """The fit section as tables; ``findings``: the report's, of which the fit warnings and
    errors (what a budget would need, the closest strategy, the edge of memory) are shown."""
    parts: list[RenderableType] = []
    for f in findings:
        if f.kind == "fit" and f.severity in ("warning", "error"):
            style = "red" if f.severity == "error" else "yellow"
            parts.append(Text(f"{f.severity}: {f.message}", style=style))
    if "max_batch_size" in section:
        parts.append(headline(section))
        parts.extend(_curve(section, "batch_size", "batch", "Estimated memory by batch size"))
    elif "max_seq_len" in section:
        parts.append(sequence_headline(section))
        title = f"Estimated memory by {_length_name(section)} at batch {_text(section.get('batch_size'))}"
        parts.extend(_curve(section, "seq_len", "length", title))
    plans = _records(section.get("plans"))
    if plans:
        title = "micro-batch × accumulation plans"
        if section.get("plans_per_gpu_of") is not None:
            title += f" per GPU, for {_text(section['plans_per_gpu_of'])} samples over the job"
        t = Table(box=box.SIMPLE_HEAD, title=title)
        for col in ("micro-batch", "accumulate", "allocated", "reserved", "device used", "fits"):
            t.add_column(col, justify="right")
        for p in plans:
            t.add_row(
                _text(p.get("micro_batch")),
                _text(p.get("accumulate")),
                *_peak_cells(p.get("peak")),
                _yes(p.get("fits")),
            )
        parts.append(fitting(t))
        rec = section.get("recommended_plan")
        if isinstance(rec, dict):
            parts.append(
                Text(
                    f"Recommended: micro-batch {_text(rec.get('micro_batch'))} × "
                    f"{_text(rec.get('accumulate'))} accumulation steps",
                    style="bold",
                )
            )
    rows = _records(section.get("strategies"))
    if rows:
        parts.append(_strategy_table(section, rows))
        rec = section.get("recommendation")
        if isinstance(rec, dict) and rec.get("message"):
            parts.append(Text(_text(rec["message"]), style="bold"))
    diff = _records(section.get("module_diff"))
    if diff:
        labels = [k for k in diff[0] if k not in ("name", "difference_bytes")]
        t = Table(box=box.SIMPLE_HEAD, title="Per-module difference between the variants")
        t.add_column("module")
        for label in labels:
            t.add_column(label, justify="right")
        t.add_column("difference", justify="right")
        for row in diff[:20]:
            t.add_row(
                _text(row.get("name")) or "(model)",
                *(b(row.get(label)) for label in labels),
                b(row.get("difference_bytes"), signed=True),
            )
        parts.append(fitting(t))
    return Group(*parts)


def _strategy_table(section: dict[str, Any], rows: list[dict[str, Any]]) -> RenderableType:
    """Strategies side by side; at narrow widths without the allocated column (reserved and
    device used are what must fit); per rank, what each rank holds of the model goes last."""
    method = _text(section.get("method") or "estimated")
    title = f"Strategies at batch {_text(section.get('batch_size'))} ({method})"
    per_rank = section.get("per_rank") if isinstance(section.get("per_rank"), dict) else None
    if per_rank is not None:
        strategy = _text(per_rank.get("strategy"))
        title = (
            f"Per rank of {_text(per_rank.get('world_size'))} GPUs"
            + (f" ({strategy})" if per_rank.get("strategy") else "")
            + f", batch {_text(section.get('batch_size'))} per GPU ({method})"
        )
    timed = any(_number(r.get("step_time_s")) for r in rows)
    noted = any(r.get("error") or r.get("skipped") for r in rows)

    state = any(isinstance(r.get("model_state"), dict) for r in rows)

    def table(allocated: bool, held_columns: bool, saving_column: bool = True) -> Table:
        columns = ["strategy"] + ["parameters", "optimizer"] * held_columns
        columns += ["allocated"] * allocated
        columns += ["reserved", "device used", *["saving"] * saving_column, "fits"]
        columns += ["step time"] if timed else []
        columns += ["note"] if noted else []
        t = Table(box=box.SIMPLE_HEAD, title=title)
        for col in columns:
            t.add_column(
                col,
                justify="left" if col in ("strategy", "note") else "right",
                no_wrap=col != "note",
            )
        for r in rows:
            if "skipped" in r:
                blanks = [""] * (len(columns) - 2)
                t.add_row(_text(r.get("name")), *blanks, f"skipped: {_text(r['skipped'])}")
                continue
            saving_pct = r.get("saving_pct") if isinstance(r.get("saving_pct"), dict) else {}
            saving = _number(saving_pct.get("reserved_bytes"))
            cells = [_text(r.get("name"))]
            if held_columns:
                held = r.get("model_state") if isinstance(r.get("model_state"), dict) else {}
                cells += [b(held.get("parameters_bytes")), b(held.get("optimizer_state_bytes"))]
            cells += _peak_cells(r.get("peak"), allocated)
            if saving_column:
                cells.append(f"{saving:+.1f}%" if saving is not None else "")
            cells.append("yes" if r.get("fits") else "no")
            if timed:
                step = _number(r.get("step_time_s"))
                cells.append(f"{step * 1000:.0f} ms" if step else "")
            if noted:
                cells.append(_text(r.get("error")))
            t.add_row(*cells)
        return t

    held = [table(False, True), table(False, True, saving_column=False)] if state else []
    layouts = [table(True, state), *held, table(False, False)]
    return fitting(*layouts)
