"""Render a Report in the terminal with rich: peak, phases, steps, epochs, categories,
reconciliation and findings. Knows nothing of torch."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from vramscope.report.model import CATEGORY_NAMES, Reconciliation, Report, StepStats
from vramscope.units import format_bytes

b = format_bytes


def _pct(part: int | None, whole: int | None) -> str:
    if not part or not whole:
        return ""
    return f"{100 * part / whole:.1f}%"


def _header(report: Report) -> Text:
    w, d = report.workload, report.device
    spec = w.get("spec") or w.get("script") or "tracked code"
    bits = [f"{spec}"]
    for key in ("batch_size", "precision", "accumulate"):
        if w.get(key) is not None:
            bits.append(f"{key.replace('_', ' ')} {w[key]}")
    device = d.get("name", "?")
    if d.get("total_bytes"):
        device += f" ({b(d['total_bytes'])})"
    text = Text()
    text.append(f"vramscope · {report.kind} · ", style="bold")
    text.append(" · ".join(str(x) for x in bits), style="bold cyan")
    text.append(f"\ndevice {device} · torch {d.get('torch_version', '?')}")
    if report.exit.status != "ok":
        text.append(f"\nrun ended: {report.exit.status}", style="bold red")
        if report.exit.error:
            text.append(f" — {report.exit.error}", style="red")
    return text


def _peak_table(report: Report) -> Table:
    p = report.peak
    t = Table(box=box.SIMPLE_HEAD, title="Peak (max over every step, the first included)")
    t.add_column("allocated", justify="right")
    t.add_column("reserved", justify="right")
    t.add_column("device used (nvidia-smi)", justify="right")
    t.add_column("host RSS (process tree)", justify="right")
    t.add_column("where")
    where = ""
    if p.step is not None:
        where = f"step {p.step}, {p.phase}"
    t.add_row(
        b(p.allocated_bytes),
        b(p.reserved_bytes),
        b(p.device_used_bytes),
        b(p.host_rss_bytes),
        where,
    )
    return t


def _phase_table(report: Report) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title="Phases (highest peak over the run)")
    for col in ("phase", "peak allocated", "peak reserved", "at step", "count", "time"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p in report.phases:
        t.add_row(
            p.name,
            b(p.peak_allocated_bytes),
            b(p.peak_reserved_bytes),
            str(p.step) if p.step is not None else "",
            str(p.count),
            f"{p.duration_s * 1000:.1f} ms",
        )
    return t


def _pick_steps(steps: list[StepStats], limit: int = 12) -> list[StepStats | None]:
    if len(steps) <= limit:
        return list(steps)
    peak = max(steps, key=lambda s: s.peak_allocated_bytes or 0)
    keep = {s.index for s in steps[:4]} | {s.index for s in steps[-4:]} | {peak.index}
    rows: list[StepStats | None] = []
    last = None
    for s in steps:
        if s.index in keep:
            if last is not None and s.index != last + 1:
                rows.append(None)
            rows.append(s)
            last = s.index
    return rows


def _step_table(report: Report) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=f"Steps ({len(report.steps)})")
    cuda = report.peak.allocated_bytes is not None
    epochs = len(report.epochs) > 1
    columns = ["step"] + (["epoch"] if epochs else []) + ["mode"]
    if cuda:
        columns += [
            "peak alloc",
            "peak reserved",
            "alloc at end",
            "fwd peak",
            "bwd peak",
            "opt peak",
        ]
    columns += ["host RSS", "time"]
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)
    for s in _pick_steps(report.steps):
        if s is None:
            t.add_row(*(["…"] + [""] * (len(columns) - 1)))
            continue
        phase = {p.name: p for p in s.phases}

        def pk(name: str, phase: dict = phase) -> str:
            return b(phase[name].peak_allocated_bytes) if name in phase else ""

        row = [str(s.index)] + ([str(s.epoch)] if epochs else []) + [s.mode]
        if cuda:
            row += [
                b(s.peak_allocated_bytes),
                b(s.peak_reserved_bytes),
                b(s.end_allocated_bytes),
                pk("forward"),
                pk("backward"),
                pk("optimizer"),
            ]
        row += [b(s.host_rss_bytes), f"{s.duration_s * 1000:.1f} ms"]
        t.add_row(*row)
    return t


def _epoch_table(report: Report) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title="Epochs")
    for col in (
        "epoch",
        "steps",
        "peak allocated",
        "peak reserved",
        "alloc at end",
        "host RSS",
        "time",
    ):
        t.add_column(col, justify="right")
    for e in report.epochs:
        t.add_row(
            str(e.index),
            str(e.steps),
            b(e.peak_allocated_bytes),
            b(e.peak_reserved_bytes),
            b(e.end_allocated_bytes),
            b(e.host_rss_bytes),
            f"{e.duration_s:.2f} s",
        )
    return t


def _category_table(report: Report) -> Table:
    cats = report.categories_at_peak
    total = report.peak.allocated_bytes or cats.total() or None
    t = Table(box=box.SIMPLE_HEAD, title="What the peak is made of")
    t.add_column("category")
    t.add_column("bytes", justify="right")
    t.add_column("share", justify="right")
    t.add_column("", min_width=20)
    for name in CATEGORY_NAMES:
        value = getattr(cats, name)
        share = value / total if value and total else 0
        t.add_row(name.replace("_", " "), b(value), _pct(value, total), "█" * round(share * 30))
    return t


def _reconciliation_table(rec: Reconciliation) -> Table:
    t = Table(
        box=box.SIMPLE_HEAD,
        title=f"Why nvidia-smi shows more than max_memory_allocated ({rec.moment})",
    )
    t.add_column("layer")
    t.add_column("bytes", justify="right")
    t.add_column("what it is")
    tensors = rec.tensors.total()
    t.add_row("tensors", b(tensors), "live tensors, by category above (allocator-rounded sizes)")
    if rec.slack.rounding_bytes is not None:
        t.add_row(
            "  of which rounding",
            b(rec.slack.rounding_bytes),
            "requested sizes rounded up to 512 B blocks",
        )
    t.add_row("= allocated", b(rec.allocated_bytes), "torch.cuda.memory_allocated()", style="bold")
    t.add_row(
        "+ cached free",
        b(rec.slack.cached_free_bytes),
        "free, kept by the caching allocator; empty_cache() releases it",
    )
    t.add_row(
        "+ fragmentation",
        b(rec.slack.fragmentation_bytes),
        "free pieces of partly used segments (inactive_split)",
    )
    t.add_row("= reserved", b(rec.reserved_bytes), "torch.cuda.memory_reserved()", style="bold")
    t.add_row(
        "+ context and libraries",
        b(rec.context_and_libraries_bytes),
        "CUDA context, kernels, cuBLAS/cuDNN handles: outside the allocator",
    )
    t.add_row(
        "= device used",
        b(rec.device_used_bytes),
        "what nvidia-smi shows for this process",
        style="bold",
    )
    t.add_row("+ other processes", b(rec.other_processes_bytes), "")
    if rec.driver_reserved_bytes:
        t.add_row(
            "+ driver reserved",
            b(rec.driver_reserved_bytes),
            "kept by the driver; nvidia-smi counts it as used",
        )
    if rec.unaccounted_bytes:
        t.add_row(
            "+ unattributed",
            b(rec.unaccounted_bytes),
            "used on the device but listed for no process",
        )
    t.add_row("+ free", b(rec.free_bytes), "")
    t.add_row("= device total", b(rec.total_bytes), "", style="bold")
    if rec.note:
        t.caption = rec.note
    return t


def _findings(report: Report) -> Group | None:
    if not report.findings:
        return None
    styles = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    lines = [Text(f"• {f.message}", style=styles.get(f.severity, "")) for f in report.findings]
    return Group(Text("Findings", style="bold"), *lines)


# ---- attribution (--detail): module tree, peak tensors, line tables ----------------------------


def _module_table(report: Report) -> Table:
    t = Table(
        box=box.SIMPLE_HEAD,
        title="Modules (largest first; activations: saved for backward; temps: peak inside)",
    )
    for col in (
        "module",
        "params",
        "grads",
        "optim",
        "activations",
        "fwd temps",
        "bwd temps",
        "of peak",
        "calls",
    ):
        t.add_column(col, justify="left" if col == "module" else "right", no_wrap=True)
    for m in report.modules:
        name = m.get("name") or ""
        depth = m.get("depth", 0) or 0
        label = name.rsplit(".", 1)[-1] if depth > 1 else name
        if not name:
            label = m.get("class", "model")
        elif m.get("class"):
            label = f"{label} ({m['class']})"
        calls = str(m.get("calls") or "")
        if m.get("recomputed"):
            calls += f" +{m['recomputed']} recomputed"
        t.add_row(
            "  " * depth + label,
            _bz(m.get("parameters_bytes")),
            _bz(m.get("gradients_bytes")),
            _bz(m.get("optimizer_state_bytes")),
            _bz(m.get("activations_bytes")),
            _bz(m.get("forward_temporaries_peak_bytes")),
            _bz(m.get("backward_temporaries_peak_bytes")),
            f"{100 * (m.get('share_of_peak') or 0):.1f}%",
            calls,
        )
    return t


def _bz(value: int | None) -> str:
    return b(value) if value else ""


def _peak_tensor_table(tensors: list[dict]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title="The tensors that made the peak (largest first)")
    for col in ("bytes", "category", "tensor / module", "phase", "shape", "created at"):
        t.add_column(col, justify="right" if col == "bytes" else "left", no_wrap=col == "bytes")
    for x in tensors:
        module = x.get("name") or x.get("module") or ""
        shape = "×".join(str(d) for d in x["shape"]) if x.get("shape") is not None else ""
        if x.get("dtype"):
            shape = f"{shape} {x['dtype']}".strip()
        line = x.get("line") or ""
        if line:  # file:line (function), the file without its folder
            where, _, func = line.partition(" ")
            path, _, number = where.rpartition(":")
            line = f"{path.rsplit('/', 1)[-1]}:{number} {func}"
        t.add_row(
            b(x.get("bytes")),
            (x.get("category") or "").replace("_", " "),
            module,
            x.get("phase") or "",
            shape,
            line,
        )
    return t


def _line_table(table: dict) -> Table:
    device = "GPU" if str(table.get("device", "")).startswith("cuda") else "tensor"
    t = Table(
        box=box.SIMPLE_HEAD,
        title=f"{table.get('function')} — {table.get('file')}",
        caption=f"Mem usage: {device} memory allocated at the line's end / its peak while it ran; "
        "Increment: net change, summed over hits; host RSS likewise",
    )
    for col in (
        "Line #",
        "Hits",
        "Mem usage",
        "Peak",
        "Increment",
        "Host RSS",
        "RSS incr.",
        "Line Contents",
    ):
        if col == "Line Contents":
            t.add_column(col, no_wrap=True, overflow="ellipsis", max_width=90)
        else:
            t.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    rows = table.get("lines", [])
    if len(rows) > 60:  # a whole script: the lines that ran
        rows = [r for r in rows if "hits" in r]
    for row in rows:
        ran = "hits" in row
        t.add_row(
            str(row["line"]),
            str(row.get("hits", "")),
            b(row.get("end_bytes")) if ran else "",
            b(row.get("peak_bytes")) if ran else "",
            _signed(row.get("increment_bytes")) if ran else "",
            b(row.get("host_rss_bytes")) if ran else "",
            _signed(row.get("host_increment_bytes")) if ran else "",
            Text(row.get("contents", "")),
        )
    return t


def _signed(value: int | None) -> str:
    if value is None:
        return ""
    return ("-" if value < 0 else "+") + b(abs(value)) if value else "0 B"


def _attribution_parts(report: Report) -> list:
    parts: list = []
    if report.modules:
        parts.append(_module_table(report))
    tensors = report.extra.get("peak_tensors")
    if tensors:
        parts.append(_peak_tensor_table(tensors[:10]))
    for table in report.extra.get("lines") or []:
        parts.append(_line_table(table))
    for note in report.extra.get("attribution_notes") or []:
        parts.append(Text(f"attribution: {note}", style="dim"))
    return parts


# ---- end attribution ---------------------------------------------------------------------------


def render(report: Report) -> Group:
    parts: list = [Panel(_header(report), box=box.ROUNDED)]
    parts.append(_peak_table(report))
    s = report.startup
    if s.after_build_allocated_bytes is not None or s.context_and_libraries_bytes is not None:
        parts.append(
            Text(
                f"Startup: allocated before the first step {b(s.after_build_allocated_bytes)}, "
                f"reserved {b(s.after_build_reserved_bytes)}; CUDA context and libraries "
                f"{b(s.context_and_libraries_bytes)}; host RSS {b(s.host_rss_bytes)}"
            )
        )
    if report.phases:
        parts.append(_phase_table(report))
    if report.steps:
        parts.append(_step_table(report))
    if len(report.epochs) > 1:
        parts.append(_epoch_table(report))
    parts.append(_category_table(report))
    if report.categories_note:
        parts.append(Text(report.categories_note, style="dim"))
    parts.extend(_attribution_parts(report))  # attribution: empty without --detail
    for rec in report.reconciliation:
        parts.append(_reconciliation_table(rec))
    for field, why in report.unavailable.items():
        if field.startswith("peak."):
            parts.append(Text(f"{field}: n/a — {why}", style="dim"))
            break
    findings = _findings(report)
    if findings is not None:
        parts.append(findings)
    return Group(*parts)


def print_report(report: Report, console: Console | None = None) -> None:
    (console or Console()).print(render(report))
