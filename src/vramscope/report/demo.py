"""The demo's one screen: what was measured here and what is estimated for named GPUs, one
column per example, every cell a number. Fits 80 columns. Knows nothing of torch."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from vramscope.report.model import Report
from vramscope.report.words import duration
from vramscope.units import format_bytes

if TYPE_CHECKING:
    from vramscope.demo import DemoResult

TRAINING_PHASES = ("forward", "backward", "optimizer")


def render(result: DemoResult) -> Group:
    """Header, the examples, the table, and how to read the estimates."""
    parts: list[RenderableType] = [_header(result)]
    for ex in result.examples:
        line = Text("  ")
        line.append(ex.spec, style="bold")
        line.append(f": {ex.description}")
        parts.append(line)
    parts.append(Text(""))
    parts.append(_table(result))
    parts.append(_notes(result))
    return Group(*parts)


def _header(result: DemoResult) -> Text:
    text = Text()
    text.append("vramscope demo", style="bold")
    first = result.examples[0].measured.device if result.examples else {}
    torch_version = first.get("torch_version", "?")
    others = [g for g in result.gpus if g != result.local_gpu]
    if result.device == "cuda":
        text.append(f" · measured on {result.device_name}, estimated for it")
        if others:
            text.append(f" and {len(others)} more GPU{'s' if len(others) > 1 else ''}")
    else:
        text.append(" · no GPU here: measured on the CPU, estimated for ")
        text.append(f"{len(result.gpus)} GPU{'s' if len(result.gpus) > 1 else ''}")
    text.append(f"\ntorch {torch_version} · {result.steps} steps each · {result.seconds:.0f} s")
    return text


def _table(result: DemoResult) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("", no_wrap=True)
    for ex in result.examples:
        table.add_column(ex.spec, justify="right", no_wrap=True)
    examples = result.examples

    def section(title: str, cells: list[str]) -> None:
        table.add_row(Text(title, style="bold cyan"), *(Text(c, style="cyan") for c in cells))

    def row(label: str, cells: list[str]) -> None:
        table.add_row(f"  {label}", *cells)

    measured_where = "the CPU" if result.device == "cpu" else result.device_name
    section(f"Measured on {measured_where}", [f"batch {ex.measured_batch}" for ex in examples])
    measured = [ex.measured for ex in examples]
    if result.device == "cuda":
        _peak_rows(row, measured)
    for label, key in (
        ("parameters", "parameters"),
        ("gradients", "gradients"),
        ("optimizer state", "optimizer_state"),
    ):
        values = [getattr(r.categories_at_peak, key) for r in measured]
        if any(v is not None for v in values):
            row(label, [_bytes(v) for v in values])
    rss = [r.peak.host_rss_bytes for r in measured]
    if any(v is not None for v in rss):
        row("host RSS of the process, peak", [_bytes(v) for v in rss])
    row("step time: first, then median", [_step_times(r) for r in measured])
    row("forward / backward / optimizer", [_phase_shares(r) for r in measured])

    for gpu in result.gpus:
        reports = [ex.estimates[gpu] for ex in examples]
        first = reports[0]
        name = first.device.get("name") or gpu
        total = first.device.get("total_bytes")
        title = f"Estimated for {name}"
        section(title, [f"batch {r.workload.get('batch_size')}" for r in reports])
        validations = [r.extra.get("validation") for r in reports]
        if any(validations):
            _error_rows(row, reports, validations)
        else:
            _peak_rows(row, reports, total=total)
        activations = [r.categories_at_peak.activations for r in reports]
        if all(v is not None for v in activations):
            row("activations at the peak", [_bytes(v) for v in activations])
        fits = [r.extra.get("fit") for r in reports]
        if all(isinstance(f, dict) for f in fits):
            margin = (fits[0].get("target") or {}).get("margin") or 0
            row(f"largest batch that fits ({margin:.0%} margin)", [_largest(f) for f in fits])
    return table


def _peak_rows(row: Any, reports: list[Report], total: int | None = None) -> None:
    """Peak allocated, reserved and device used, each row only when every report has it."""
    for label, key in (
        ("peak allocated", "allocated_bytes"),
        ("peak reserved", "reserved_bytes"),
        ("device used (nvidia-smi)", "device_used_bytes"),
    ):
        values = [getattr(r.peak, key) for r in reports]
        if any(v is None for v in values):
            continue
        if key == "device_used_bytes" and total:
            row(f"{label}, of {format_bytes(total)}", [_bytes(v) for v in values])
        else:
            row(label, [_bytes(v) for v in values])


def _error_rows(row: Any, reports: list[Report], validations: list[Any]) -> None:
    """The estimate's peaks with their error against the measured run."""
    for label, key in (
        ("peak allocated, error", "allocated"),
        ("peak reserved, error", "reserved"),
        ("device used, error", "device_used"),
    ):
        values = [getattr(r.peak, f"{key}_bytes") for r in reports]
        if any(v is None for v in values):
            continue
        cells = []
        for value, v in zip(values, validations, strict=True):
            err = (v or {}).get("error_pct", {}).get(key)
            cells.append(_bytes(value) + (f" {err:+.1f}%" if err is not None else ""))
        row(label, cells)


def _bytes(value: int | None) -> str:
    return format_bytes(value) if value is not None else "not measured"


def _step_times(report: Report) -> str:
    times = [s.duration_s for s in report.steps]
    if not times:
        return "no steps"
    if len(times) == 1:
        return duration(times[0])
    return f"{duration(times[0])}, {duration(statistics.median(times[1:]))}"


def _phase_shares(report: Report) -> str:
    """Each training phase's share of the time the three took, in %."""
    spent = {p.name: p.duration_s for p in report.phases if p.name in TRAINING_PHASES}
    total = sum(spent.values())
    if not total:
        return "no phases"
    return " / ".join(f"{100 * spent.get(name, 0) / total:.0f}" for name in TRAINING_PHASES) + " %"


def _largest(section: dict[str, Any]) -> str:
    answer = section.get("answer") or {}
    best = answer.get("max_batch_size", section.get("max_batch_size"))
    if not best:
        return "none"
    return f"≥ {best:,}" if section.get("capped") else f"{best:,}"


def _notes(result: DemoResult) -> Text:
    """How to read the numbers: what was measured, how the estimates were made."""
    calibrated = all(
        (ex.estimates[g].extra.get("estimate") or {}).get("calibrated")
        for ex in result.examples
        for g in result.gpus
    )
    text = Text("\n")
    if result.device == "cpu":
        text.append(
            "The CPU has no caching allocator: parameters, gradients and optimizer state are "
            "exact from the objects; the GPU's peaks come from the estimates. "
        )
    text.append(
        "An estimate traces the steps with fake tensors on an emulated GPU (no GPU needed), "
        "replays the CUDA caching allocator and adds the CUDA context"
    )
    text.append("." if calibrated else " (a guess on uncalibrated GPUs).")
    return text
