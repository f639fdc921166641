"""What changed between two reports: a pure ``diff_reports`` and its terminal and HTML views.

``diff_reports(a, b)`` compares run ``b`` against the baseline ``a``: the peaks, what the
peak is made of, the layers from tensors to nvidia-smi, each phase's peak, the modules
(when both runs attributed them) and the run itself; every row has the absolute and the
relative change. Knows nothing of torch.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from vramscope.report.model import CATEGORY_NAMES, MODULE_KEPT_FIELDS, PHASE_NAMES, Report
from vramscope.report.widths import fitting
from vramscope.units import format_bytes

DIFF_SCHEMA = "vramscope.diff/1"
MAX_MODULE_ROWS = 20
SECTION_TITLES = {
    "peak": "Peak",
    "categories": "What the peak is made of",
    "layers": "From tensors to nvidia-smi, at the peak",
    "phases": "Peak allocated by phase",
    "modules": "Modules (at the peak, else parameters to activations)",
    "run": "The run",
}


@dataclass
class DiffRow:
    """One compared quantity: its value in the baseline ``a`` and in ``b``."""

    section: str  # peak | categories | layers | phases | modules | run
    name: str
    a: float | None
    b: float | None
    unit: str = "bytes"  # bytes | seconds | count

    @property
    def delta(self) -> float | None:
        if self.a is None or self.b is None:
            return None
        return self.b - self.a

    @property
    def pct(self) -> float | None:
        """The change in percent of ``a``; None when ``a`` is missing or zero."""
        if self.delta is None or not self.a:
            return None
        return 100.0 * self.delta / self.a

    @property
    def changed(self) -> bool:
        return self.a != self.b


@dataclass
class ReportDiff:
    """``b`` against the baseline ``a``."""

    a_label: str
    b_label: str
    rows: list[DiffRow] = field(default_factory=list)
    workload_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    device_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def section(self, name: str) -> list[DiffRow]:
        return [row for row in self.rows if row.section == name]

    def row(self, section: str, name: str) -> DiffRow | None:
        return next((r for r in self.rows if r.section == section and r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": DIFF_SCHEMA,
            "a": self.a_label,
            "b": self.b_label,
            "rows": [{**dataclasses.asdict(r), "delta": r.delta, "pct": r.pct} for r in self.rows],
            "workload_changes": [{"key": k, "a": a, "b": b} for k, a, b in self.workload_changes],
            "device_changes": [{"key": k, "a": a, "b": b} for k, a, b in self.device_changes],
            "notes": list(self.notes),
        }


# ---- the comparison ---------------------------------------------------------------------
def _module_total(module: dict[str, Any]) -> int | None:
    """A module's bytes at the peak when recorded, else the sum of what it keeps."""

    def number(key: str) -> int | None:
        value = module.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return int(value) if ok else None

    if number("peak_bytes") is not None:
        return number("peak_bytes")
    values = [v for v in map(number, MODULE_KEPT_FIELDS) if v is not None]
    return sum(values) if values else None


def _median_step_time(report: Report) -> float | None:
    times = [s.duration_s for s in report.steps if s.duration_s]
    return statistics.median(times) if times else None


def _changes(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    keys = list(a) + [k for k in b if k not in a]
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def diff_reports(a: Report, b: Report, a_label: str = "a", b_label: str = "b") -> ReportDiff:
    """Compare run ``b`` against the baseline ``a``."""
    diff = ReportDiff(a_label, b_label)
    rows = diff.rows
    for name, attr in (
        ("allocated", "allocated_bytes"),
        ("reserved", "reserved_bytes"),
        ("device used", "device_used_bytes"),
        ("host RSS", "host_rss_bytes"),
    ):
        rows.append(DiffRow("peak", name, getattr(a.peak, attr), getattr(b.peak, attr)))
    for name in CATEGORY_NAMES:
        va, vb = getattr(a.categories_at_peak, name), getattr(b.categories_at_peak, name)
        if va is not None or vb is not None:
            rows.append(DiffRow("categories", name.replace("_", " "), va, vb))
    ra = next((r for r in a.reconciliation if r.moment == "peak"), None)
    rb = next((r for r in b.reconciliation if r.moment == "peak"), None)
    if ra is not None or rb is not None:
        layers = (
            ("tensors", lambda r: r.tensors.total()),
            ("allocated", lambda r: r.allocated_bytes),
            ("cached free", lambda r: r.slack.cached_free_bytes),
            ("fragmentation", lambda r: r.slack.fragmentation_bytes),
            ("reserved", lambda r: r.reserved_bytes),
            ("context and libraries", lambda r: r.context_and_libraries_bytes),
            ("device used", lambda r: r.device_used_bytes),
        )
        for name, get in layers:
            va = get(ra) if ra is not None else None
            vb = get(rb) if rb is not None else None
            if va is not None or vb is not None:
                rows.append(DiffRow("layers", name, va, vb))
    pa = {p.name: p.peak_allocated_bytes for p in a.phases}
    pb = {p.name: p.peak_allocated_bytes for p in b.phases}
    names = [n for n in PHASE_NAMES if n in pa or n in pb]
    names += sorted((set(pa) | set(pb)) - set(names))
    for name in names:
        if pa.get(name) is not None or pb.get(name) is not None:
            rows.append(DiffRow("phases", name.replace("_", " "), pa.get(name), pb.get(name)))
    if a.modules or b.modules:
        ma = {str(m.get("name", "")): _module_total(m) for m in a.modules if isinstance(m, dict)}
        mb = {str(m.get("name", "")): _module_total(m) for m in b.modules if isinstance(m, dict)}
        module_rows = [
            DiffRow("modules", name or "(model)", ma.get(name), mb.get(name))
            for name in list(ma) + [n for n in mb if n not in ma]
        ]
        # a module only one run has counts as a change of its whole size
        module_rows.sort(key=lambda r: abs((r.b or 0) - (r.a or 0)), reverse=True)
        rows.extend(module_rows)
        if not (a.modules and b.modules):
            missing = a_label if not a.modules else b_label
            diff.notes.append(f"{missing} has no per-module attribution; modules are one-sided")
    rows.append(DiffRow("run", "steps", len(a.steps), len(b.steps), "count"))
    rows.append(
        DiffRow("run", "median step time", _median_step_time(a), _median_step_time(b), "seconds")
    )
    rows.append(
        DiffRow(
            "run",
            "context and libraries at start",
            a.startup.context_and_libraries_bytes,
            b.startup.context_and_libraries_bytes,
        )
    )
    rows.append(
        DiffRow(
            "run",
            "allocated before the first step",
            a.startup.after_build_allocated_bytes,
            b.startup.after_build_allocated_bytes,
        )
    )
    diff.workload_changes = _changes(a.workload, b.workload)
    device_keys = ("name", "total_bytes", "torch_version", "cuda_version", "driver_version")
    diff.device_changes = _changes(
        {k: a.device.get(k) for k in device_keys}, {k: b.device.get(k) for k in device_keys}
    )
    if a.kind != b.kind:
        diff.notes.append(f"{a_label} is {a.kind}, {b_label} is {b.kind}")
    return diff


# ---- formatting -------------------------------------------------------------------------
def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "seconds":
        return f"{value * 1000:.1f} ms" if abs(value) < 10 else f"{value:.1f} s"
    return f"{value:,.0f}"


def format_delta(row: DiffRow) -> str:
    d = row.delta
    if d is None:
        return ""
    if d == 0:
        return "="
    if row.unit == "bytes":
        return format_bytes(d, signed=True)
    if row.unit == "seconds":
        return f"{d * 1000:+.1f} ms" if abs(d) < 10 else f"{d:+.1f} s"
    return f"{d:+,.0f}"


def format_pct(row: DiffRow) -> str:
    p = row.pct
    if p is None:
        return "new" if row.a in (None, 0) and row.b else ""
    if abs(p) < 0.05:
        return "0%"
    return f"{p:+.1f}%"


def _value_text(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "—" if value is None else str(value)


# ---- terminal ---------------------------------------------------------------------------
def render_terminal(diff: ReportDiff, all_rows: bool = False) -> Group:
    """The diff as rich renderables: one table per section."""
    parts: list[Any] = []
    head = Text()
    head.append("vramscope diff · ", style="bold")
    for letter, label in (("a", diff.a_label), ("b", diff.b_label)):
        if letter == "b":
            head.append(" → ")
        if label != letter:
            head.append(f"{letter} ", style="dim")
        head.append(label, style="bold cyan")
    head.append("\nchanges are b − a: red means b takes more, green less", style="dim")
    parts.append(head)
    changes = [("workload", c) for c in diff.workload_changes] + [
        ("device", c) for c in diff.device_changes
    ]
    if changes:
        t = Table(box=box.SIMPLE_HEAD, title="What differs in the set-up")
        for col in ("", "key", "a", "b"):
            t.add_column(col)
        for where, (key, va, vb) in changes:
            t.add_row(where, key, _value_text(va), _value_text(vb))
        parts.append(fitting(t))
    for section, title in SECTION_TITLES.items():
        rows = diff.section(section)
        if section == "modules":
            changed = [r for r in rows if r.changed]
            rows = changed if all_rows else changed[:MAX_MODULE_ROWS]
        if not rows:
            continue
        t = Table(box=box.SIMPLE_HEAD, title=title)
        t.add_column("")
        for col in ("a", "b", "change", "%"):
            t.add_column(col, justify="right")
        for r in rows:
            style = "" if not r.delta else ("red" if r.delta > 0 else "green")
            t.add_row(
                r.name,
                format_value(r.a, r.unit),
                format_value(r.b, r.unit),
                Text(format_delta(r), style=style),
                Text(format_pct(r), style=style),
            )
        parts.append(fitting(t))
    for note in diff.notes:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def print_diff(diff: ReportDiff, console: Console | None = None) -> None:
    (console or Console()).print(render_terminal(diff))


# ---- HTML ----------------------------------------------------------------------------------
def render_html(diff: ReportDiff, a: Report | None = None, b: Report | None = None) -> str:
    """The diff as one self-contained HTML page (same look as the report: ``diff.html``)."""
    import plotly.graph_objects as go

    from vramscope.report import html as h
    from vramscope.report.html.blocks import Chart, Section, table
    from vramscope.report.html.environment import render_template
    from vramscope.report.html.page import page_context

    figures: dict[str, Any] = {}
    sections: list[Section] = []
    kpis = [
        {
            "name": r.name,
            "value": format_value(r.b, r.unit),
            "was": format_value(r.a, r.unit),
            "style": "" if not r.delta else ("pos" if r.delta > 0 else "neg"),
            "change": f"{format_delta(r)} {format_pct(r)}",
        }
        for r in diff.section("peak")
    ]
    workloads = None
    if a is not None and b is not None:
        workloads = (h.workload_title(a), h.workload_title(b))

    changes = [("workload", c) for c in diff.workload_changes] + [
        ("device", c) for c in diff.device_changes
    ]
    if changes:
        rows = [[where, k, _value_text(va), _value_text(vb)] for where, (k, va, vb) in changes]
        sections.append(
            Section(
                "setup.html",
                "setup",
                "Set-up",
                "What differs in the set-up",
                "Workload and device settings that are not the same in both runs.",
                {"table": table(["", "key", diff.a_label, diff.b_label], rows, left=4)},
            )
        )

    for section, title in SECTION_TITLES.items():
        rows = diff.section(section)
        if section == "modules":
            rows = [r for r in rows if r.changed][:MAX_MODULE_ROWS]
        if not rows:
            continue
        chart = None
        byte_rows = [r for r in rows if r.unit == "bytes" and (r.a is not None or r.b is not None)]
        if section != "run" and byte_rows:
            top = max(max(r.a or 0, r.b or 0) for r in byte_rows)
            unit, scale = h.unit_for(top)
            names = [h.chart_text(r.name) for r in byte_rows]
            fig = go.Figure(
                [
                    go.Bar(
                        x=names,
                        y=[None if r.a is None else round(r.a / scale, 4) for r in byte_rows],
                        name=h.chart_text(diff.a_label),
                        marker={"color": "#94a3b8"},
                        customdata=[format_value(r.a, r.unit) for r in byte_rows],
                        hovertemplate="%{x}: %{customdata}<extra></extra>",
                    ),
                    go.Bar(
                        x=names,
                        y=[None if r.b is None else round(r.b / scale, 4) for r in byte_rows],
                        name=h.chart_text(diff.b_label),
                        marker={"color": "#2563eb"},
                        customdata=[
                            f"{format_value(r.b, r.unit)} ({format_delta(r)}, {format_pct(r)})"
                            for r in byte_rows
                        ],
                        hovertemplate="%{x}: %{customdata}<extra></extra>",
                    ),
                ]
            )
            fig.update_layout(
                height=300,
                barmode="group",
                yaxis={"title": {"text": unit}},
                legend={"orientation": "h", "y": 1.12},
                margin={"l": 60, "r": 20, "t": 30, "b": 40},
            )
            chart_id = f"chart-diff-{section}"
            figures[chart_id] = h.figure_dict(fig)
            chart = Chart(chart_id, 300)
        table_rows = [
            [
                r.name,
                format_value(r.a, r.unit),
                format_value(r.b, r.unit),
                format_delta(r),
                format_pct(r),
            ]
            for r in rows
        ]
        colours = [
            ["", "", "", *(["pos" if r.delta > 0 else "neg"] * 2)] if r.delta else [] for r in rows
        ]
        tbl = table(
            ["", diff.a_label, diff.b_label, "change", "%"], table_rows, cell_classes=colours
        )
        sections.append(
            Section(
                "compared.html",
                section,
                title.split(",")[0],
                title,
                "",
                {"chart": chart, "table": tbl},
            )
        )
    return render_template(
        "diff.html",
        diff=diff,
        kpis=kpis,
        workloads=workloads,
        sections=sections,
        **page_context(
            f"vramscope diff · {diff.a_label} → {diff.b_label}",
            figures,
            [(s.anchor, s.nav) for s in sections],
        ),
    )


def write_html(
    diff: ReportDiff, path: str | Path, a: Report | None = None, b: Report | None = None
) -> Path:
    target = Path(path)
    target.write_text(render_html(diff, a, b), encoding="utf-8")
    return target
