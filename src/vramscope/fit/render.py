"""Terminal tables for the ``fit`` section of a report (fit and compare); no torch here.

The section may come from a saved file (``vramscope report fit.json``), so every value is
read defensively: a field of the wrong type shows as blank instead of failing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from vramscope.fit import wording
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
    """The fit's answer (the verified one when real trials found one), the target it fits and
    how it was found, then why it is not verified or not monotone, where so: the lines of
    :func:`vramscope.fit.wording.headline_lines`, the answer in bold."""
    lines = wording.headline_lines(section)
    nothing = lines[0].startswith("Does not fit")
    text = Text(lines[0], style="bold red" if nothing else "bold green")
    for line in lines[1:]:
        if wording.is_warning(line):
            text.append(f"\n{line}", style="red" if line.startswith("Not verified") else "yellow")
        else:
            text.append(f"\n  {line}")
    return text


def _headline_block(section: dict[str, Any]) -> list[RenderableType]:
    """The headline for the terminal: its second and third lines indented, also where they
    wrap."""
    lines = wording.headline_lines(section)
    nothing = lines[0].startswith("Does not fit")
    block: list[RenderableType] = [Text(lines[0], style="bold red" if nothing else "bold green")]
    for line in lines[1:]:
        if wording.is_warning(line):
            style = "red" if line.startswith("Not verified") else "yellow"
            block.append(Text(line, style=style))
        else:
            block.append(Padding(Text(line), (0, 0, 0, 2)))
    return block


def _length_name(section: dict[str, Any]) -> str:
    return "prompt length" if _number(section.get("new_tokens")) else "sequence length"


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


def _answered(section: dict[str, Any]) -> bool:
    return "max_batch_size" in section or "max_seq_len" in section


def render_fit_report(report: Report) -> Group:
    """What ``fit`` and ``compare`` print: the fit section and the fit warnings."""
    section = report.extra.get("fit")
    return render_fit(section if isinstance(section, dict) else {}, report.findings)


def render_fit(section: dict[str, Any], findings: Sequence[Finding] = ()) -> Group:
    """The fit section as tables; ``findings``: the report's, of which the fit warnings and
    errors (what a budget would need, the closest strategy, the edge of memory) are shown."""
    parts: list[RenderableType] = []
    said = set(wording.headline_lines(section)) if _answered(section) else set()
    for f in findings:
        if f.kind == "fit" and f.severity in ("warning", "error"):
            if f.data.get("part") == "answer" or f.message in said:
                continue  # the headline says it
            style = "red" if f.severity == "error" else "yellow"
            parts.append(Text(f"{f.severity}: {f.message}", style=style))
    if "max_batch_size" in section:
        parts.extend(_headline_block(section))
        parts.extend(_curve(section, "batch_size", "batch", "Estimated memory by batch size"))
    elif "max_seq_len" in section:
        parts.extend(_headline_block(section))
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
        if isinstance(section.get("target"), dict):
            parts.append(Text(wording.compare_headline(section), style="bold"))
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
    change = wording.change_header(rows).replace(" ", "\n", 1)  # "vs\nbaseline": narrow

    def table(allocated: bool, held_columns: bool, saving_column: bool = True) -> Table:
        columns = ["strategy"] + ["parameters", "optimizer"] * held_columns
        columns += ["allocated"] * allocated
        columns += ["reserved", "device used", *[change] * saving_column, "fits"]
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
            cells = [_text(r.get("name"))]
            if held_columns:
                held = r.get("model_state") if isinstance(r.get("model_state"), dict) else {}
                cells += [b(held.get("parameters_bytes")), b(held.get("optimizer_state_bytes"))]
            cells += _peak_cells(r.get("peak"), allocated)
            if saving_column:
                cells.append(wording.reserved_change(r, rows[0]) if r is not rows[0] else "")
            cells.append("yes" if r.get("fits") else "runs out" if r.get("runs_out") else "no")
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
