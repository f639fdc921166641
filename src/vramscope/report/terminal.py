"""Render a Report in the terminal with rich: peak, phases, steps, epochs, categories,
reconciliation and findings. Knows nothing of torch."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from vramscope.report import jobtext
from vramscope.report.aggregate import step_label, steps_title
from vramscope.report.freeform import mapping as _mapping
from vramscope.report.freeform import number as _n
from vramscope.report.freeform import records as _records
from vramscope.report.freeform import text as _s
from vramscope.report.model import (
    CATEGORY_NAMES,
    RankEntry,
    Reconciliation,
    Report,
    StepStats,
)
from vramscope.report.widths import fitting
from vramscope.report.words import count, duration, field_label
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
    device = d.get("name") or "?"
    if d.get("total_bytes"):
        device += f" ({b(d['total_bytes'])})"
    text = Text()
    text.append(f"vramscope · {report.kind} · ", style="bold")
    text.append(" · ".join(str(x) for x in bits), style="bold cyan")
    text.append(f"\ndevice {device} · torch {d.get('torch_version', '?')}")
    job = _job(report)
    if report.ranks:
        text.append(f"\n{len(report.ranks)} ranks; below: rank {_s(job.get('rank'))}'s report")
        if job.get("host"):
            text.append(f" (on {_s(job['host'])})")
        heaviest = job.get("heaviest_rank")
        if heaviest is not None and heaviest == job.get("rank"):
            text.append(", the heaviest")
    elif job.get("estimated") and job.get("world_size") is not None:  # a per-rank estimate
        text.append(f"\nper rank (per GPU, batch size per GPU) of {_s(job.get('summary'))}")
        text.append(f"; rank {_s(job.get('rank'))}")
        if job.get("heaviest_rank") == job.get("rank"):
            text.append(", the heaviest")
        elif heaviest is not None:
            text.append(f"; peak and categories: rank {_s(heaviest)}'s, the heaviest")
    if report.exit.status != "ok":
        text.append(f"\nrun ended: {report.exit.status}", style="bold red")
        if report.exit.error:
            text.append(f" — {report.exit.error}", style="red")
    return text


def _job(report: Report) -> dict[str, Any]:
    """The report's ``distributed`` section (a run under torchrun), or an empty dict."""
    return _mapping(report.extra.get("distributed"))


def _peak_table(report: Report) -> RenderableType:
    p = report.peak
    title = "Peak (max over every step, the first included)"
    job = _job(report)
    rank = job.get("heaviest_rank", job.get("rank"))
    if report.ranks and rank is not None:  # the heaviest rank's peak tops a job's report
        title = f"Peak of rank {_s(rank)} (max over every step, the first included)"
    where = ""
    if p.step is not None:  # a peak in steps that read no phase has no phase
        where = f"step {p.step}, {p.phase}" if p.phase else f"step {p.step} (phase not read)"
    cells = [
        ("allocated", b(p.allocated_bytes)),
        ("reserved", b(p.reserved_bytes)),
        ("device used (nvidia-smi)", b(p.device_used_bytes)),
        ("host RSS (process tree)", b(p.host_rss_bytes)),
        ("where", where),
    ]
    wide = Table(box=box.SIMPLE_HEAD, title=title)
    for name, _ in cells:
        wide.add_column(name, justify="left" if name == "where" else "right")
    wide.add_row(*(value for _, value in cells))
    narrow = Table(box=box.SIMPLE, title=title, show_header=False)
    narrow.add_column("what")
    narrow.add_column("bytes", justify="right")
    for name, value in cells:
        narrow.add_row(name, value)
    return fitting(wide, narrow)


def _timed(report: Report) -> bool:
    """Whether the report has times to show: a run does; an estimate, which runs nothing, has
    none (its phases and steps would read 0.0 ms)."""
    if report.kind == "estimated":
        return False
    return any(s.duration_s for s in report.steps) or any(p.duration_s for p in report.phases)


def _phase_table(report: Report) -> RenderableType:
    t = Table(box=box.SIMPLE_HEAD, title="Phases (highest peak over the run)")
    timed = _timed(report)
    columns = ["phase", "peak allocated", "peak reserved", "at step", "count"]
    for col in columns + ["time"] * timed:
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p in report.phases:
        t.add_row(
            p.name,
            b(p.peak_allocated_bytes),
            b(p.peak_reserved_bytes),
            str(p.step) if p.step is not None else "",
            count(p.count),
            *[duration(p.duration_s)] * timed,
        )
    return fitting(t)


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


GAP = "⋮"  # steps left out of a long run's table


def _step_table(report: Report) -> RenderableType:
    """Every step's memory; at narrow widths the per-phase peaks move to a second table."""
    title = steps_title(report.steps)
    cuda = report.peak.allocated_bytes is not None
    epochs = len(report.epochs) > 1
    rows = _pick_steps(report.steps)
    modes = any(s is not None and s.mode != "train" for s in rows)

    def row_head(s: StepStats) -> list[str]:
        return [step_label(s)] + ([str(s.epoch)] if epochs else []) + ([s.mode] if modes else [])

    head = ["step"] + (["epoch"] if epochs else []) + (["mode"] if modes else [])
    memory = ["peak alloc", "peak reserved", "alloc at end"] if cuda else []
    phases = ["forward", "backward", "optimizer"] if cuda else []

    def memory_cells(s: StepStats) -> list[str]:
        if not cuda:
            return []
        return [b(s.peak_allocated_bytes), b(s.peak_reserved_bytes), b(s.end_allocated_bytes)]

    def phase_cells(s: StepStats) -> list[str]:
        if not cuda:
            return []
        peaks = {p.name: p.peak_allocated_bytes for p in s.phases}
        return [b(peaks[name]) if name in peaks else "" for name in phases]

    def table(title: str, columns: list[str], cells: list[Any]) -> Table:
        t = Table(box=box.SIMPLE_HEAD, title=title)
        for col in columns:
            t.add_column(col, justify="right", no_wrap=True)
        for s in rows:
            if s is None:
                t.add_row(GAP, *([""] * (len(columns) - 1)))
            else:
                t.add_row(*row_head(s), *(c for cell in cells for c in cell(s)))
        return t

    timed = _timed(report)
    measured = report.kind != "estimated"  # an estimate runs nothing on the host
    tail = ["host RSS"] * measured + ["time"] * timed

    def rest(s: StepStats) -> list[str]:
        return [b(s.host_rss_bytes)] * measured + [duration(s.duration_s)] * timed

    wide_phases = ["fwd peak", "bwd peak", "opt peak"] if cuda else []
    wide = table(title, head + memory + wide_phases + tail, [memory_cells, phase_cells, rest])
    if not cuda:
        return fitting(wide)
    headers = [c.replace(" ", "\n", 1) for c in memory]  # "peak\nalloc": two lines
    narrow = Group(
        table(title, head + headers + tail, [memory_cells, rest]),
        table("Peak allocated in each phase, per step", head + phases, [phase_cells]),
    )
    return fitting(wide, narrow)


def _epoch_table(report: Report) -> RenderableType:
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
            duration(e.duration_s),
        )
    return fitting(t)


def _category_table(report: Report) -> RenderableType:
    cats = report.categories_at_peak
    total = report.peak.allocated_bytes or cats.total() or None
    t = Table(box=box.SIMPLE_HEAD, title="What the peak is made of")
    t.add_column("category")
    t.add_column("bytes", justify="right")
    t.add_column("share", justify="right")
    t.add_column("", min_width=20)
    inside = _distributed_memory_by_category(report)
    for name in CATEGORY_NAMES:
        value = getattr(cats, name)
        share = value / total if value and total else 0
        t.add_row(name.replace("_", " "), b(value), _pct(value, total), "█" * round(share * 30))
        for label, amount in inside.get(name, []):
            t.add_row(f"  of which {label}", b(amount), _pct(amount, total), "", style="dim")
    return fitting(t)


def _distributed_memory_by_category(report: Report) -> dict[str, list[tuple[str, int]]]:
    """Exact distributed memory (DDP's buckets) that sits inside a category at the peak."""
    inside: dict[str, list[tuple[str, int]]] = {}
    for item in _records(_job(report).get("memory")):
        amount = _n(item.get("bytes"))
        if item.get("exact") is True and item.get("name") == "ddp_gradient_buckets" and amount:
            category = _s(item.get("category"))
            if category == "other" and report.categories_at_peak.other is not None:
                inside.setdefault(category, []).append((_s(item.get("label")), int(amount)))
    return inside


# ---- distributed jobs: a row per rank ----------------------------------------------------------


def _ranks_table(report: Report) -> RenderableType:
    """One row per rank, the heaviest marked; memory side by side, how each rank ended."""
    job = _job(report)
    heaviest = _n(job.get("heaviest_rank"))
    rows = report.ranks
    cuda = any(r.peak.allocated_bytes is not None for r in rows)
    measures = (
        [
            ("peak alloc", "allocated_bytes"),
            ("peak reserved", "reserved_bytes"),
            ("device used", "device_used_bytes"),
            ("host RSS", "host_rss_bytes"),
        ]
        if cuda
        else [("peak host RSS", "host_rss_bytes")]
    )
    reported = sum(1 for r in rows if r.reported)
    title = f"Ranks: {reported} of {len(rows)} reported"

    def mark(row: RankEntry) -> str:
        return "◀ heaviest" if row.rank == heaviest else ""

    def style(row: RankEntry) -> str:
        if not row.reported or row.exit.status in ("error", "oom"):
            return "red"
        return "bold" if row.rank == heaviest else ""

    wide = Table(box=box.SIMPLE_HEAD, title=title)
    for col in ["rank", "host", *(name for name, _ in measures), "steps", "exit", ""]:
        wide.add_column(col, justify="left" if col in ("host", "exit", "") else "right")
    for row in rows:
        cells = [b(getattr(row.peak, key)) if row.reported else "—" for _, key in measures]
        wide.add_row(
            str(row.rank),
            _s(row.host),
            *cells,
            str(row.steps) if row.reported else "",
            row.exit.summary(),
            mark(row),
            style=style(row),
        )
    kept = [measures[0], measures[-1]] if cuda else measures  # peak alloc and host RSS
    narrow = Table(box=box.SIMPLE_HEAD, title=title, caption="◀ the heaviest rank")
    narrow.add_column("rank", justify="right")
    narrow.add_column("host")
    for name, _ in kept:
        narrow.add_column(name, justify="right")
    narrow.add_column("exit")
    for row in rows:
        narrow.add_row(
            f"{row.rank}{' ◀' if row.rank == heaviest else ''}",
            _s(row.host),
            *(b(getattr(row.peak, key)) if row.reported else "—" for _, key in kept),
            row.exit.summary(),
            style=style(row),
        )
    return fitting(wide, narrow)


def _rank_category_table(report: Report) -> RenderableType | None:
    """What each rank's peak is made of, side by side (categories measured on some rank)."""
    rows = [r for r in report.ranks if r.reported]
    names = [n for n in CATEGORY_NAMES if any(getattr(r.categories_at_peak, n) for r in rows)]
    if len(rows) < 2 or not names:
        return None
    short = {"optimizer_state": "optimizer", "temporaries": "temps", "activations": "activ."}
    t = Table(box=box.SIMPLE_HEAD, title="What each rank's peak is made of")
    t.add_column("rank", justify="right")
    for name in names:
        t.add_column(short.get(name, name), justify="right")
    for row in rows:
        t.add_row(str(row.rank), *(b(getattr(row.categories_at_peak, n)) for n in names))
    return fitting(t)


def _roles_table(report: Report) -> RenderableType | None:
    """A per-rank estimate's ranks by role: one row per role, the ranks that share it."""
    rows = jobtext.roles(_job(report))
    if not rows:
        return None
    if any(r["stage"] for r in rows):
        return _stages_table(rows)
    t = Table(box=box.SIMPLE_HEAD, title="Ranks by role (each role traced once)")
    tp = any(r["tp"] for r in rows)
    t.add_column("ranks")
    t.add_column("count", justify="right")
    if tp:
        t.add_column("tp index")
    t.add_column("dp index")
    t.add_column("traced")
    for name in ("peak allocated", "peak reserved", "device used"):
        t.add_column(name, justify="right")
    t.add_column("")
    narrow = Table(box=box.SIMPLE_HEAD, title="Ranks by role (each role traced once)")
    for name in ("ranks", "traced", "peak allocated", "peak reserved"):
        narrow.add_column(name, justify="right" if name.startswith("peak") else "left")
    for r in rows:
        cells = [r["ranks"], r["count"], *([r["tp"]] if tp else []), r["dp"], r["traced"]]
        t.add_row(*cells, r["allocated"], r["reserved"], r["device_used"], r["heaviest"])
        narrow.add_row(r["ranks"], r["traced"], r["allocated"], r["reserved"])
    return fitting(t, narrow)


def _stages_table(rows: list[dict[str, str]]) -> RenderableType:
    """A pipeline's stages: one row per stage (stages alike share one), what it holds, the
    micro-batches its schedule keeps in flight, its peaks."""
    title = "Pipeline stages (each traced once)"
    t = Table(box=box.SIMPLE_HEAD, title=title)
    for name in ("stage", "ranks", "holds", "in flight", "traced"):
        t.add_column(name, justify="right" if name == "in flight" else "left")
    for name in ("peak allocated", "peak reserved", "device used"):
        t.add_column(name, justify="right")
    t.add_column("")
    narrow = Table(box=box.SIMPLE_HEAD, title=title)
    for name in ("stage", "in flight", "peak allocated", "peak reserved"):
        narrow.add_column(name, justify="left" if name == "stage" else "right")
    for r in rows:
        t.add_row(
            r["stage"],
            r["ranks"],
            r["holds"],
            r["in_flight"],
            r["traced"],
            r["allocated"],
            r["reserved"],
            r["device_used"],
            r["heaviest"],
        )
        narrow.add_row(r["stage"], r["in_flight"], r["allocated"], r["reserved"])
    return fitting(t, narrow)


def _job_lines(report: Report) -> list[Text]:
    """The imbalance, how the ranks' reports came, and the distributed memory, in words."""
    job = _job(report)
    lines = []
    traced = jobtext.per_rank(job)
    if traced:
        lines.append(Text(traced))
    spread, gathered = jobtext.imbalance(job), jobtext.gathering(job)
    if spread:
        lines.append(Text(spread))
    if gathered:
        lines.append(Text(gathered, style="dim"))
    items = jobtext.memory(job)
    if items:
        lines.append(Text(f"Distributed memory of rank {_s(job.get('rank'))}:", style="bold"))
    for item in items:
        line = Text(f"• {item['label']}: {item['size']}")
        if item["note"]:
            line.append(f" — {item['note']}", style="dim")
        lines.append(line)
    return lines


def _reconciliation_table(rec: Reconciliation) -> RenderableType:
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
    return fitting(t)


def _findings(report: Report, shown: Collection[str] = ()) -> Group | None:
    """The findings in plain words, but those already shown above."""
    findings = [f for f in report.findings if f.message not in shown]
    if not findings:
        return None
    styles = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    lines = [Text(f"• {f.message}", style=styles.get(f.severity, "")) for f in findings]
    return Group(Text("Findings", style="bold"), *lines)


# ---- attribution (--detail): module tree, peak tensors, line tables ----------------------------


def _bz(value: Any) -> str:
    number = _n(value)
    return b(number) if number else ""


MODULE_HELD = (
    ("params", "parameters_bytes"),
    ("grads", "gradients_bytes"),
    ("optim", "optimizer_state_bytes"),
)
MODULE_MADE = (
    ("activations", "activations_bytes"),
    ("fwd temps", "forward_temporaries_peak_bytes"),
    ("bwd temps", "backward_temporaries_peak_bytes"),
)


def _module_label(m: dict[str, Any], with_class: bool = True) -> str:
    name = _s(m.get("name"))
    depth = _n(m.get("depth")) or 0
    depth = int(depth) if 0 <= depth < 64 else 0
    label = name.rsplit(".", 1)[-1] if depth > 1 else name
    if not name:
        label = _s(m.get("class")) or "model"
        if m.get("label"):  # the main model, by the name the user's code gives it
            label = f"{_s(m['label'])} ({label})" if with_class else _s(m["label"])
    elif with_class and m.get("class"):
        label = f"{label} ({_s(m['class'])})"
    return "  " * depth + label


def _module_calls(m: dict[str, Any]) -> str:
    calls = _s(m.get("calls") or "")
    if _n(m.get("recomputed")):
        calls += f" +{m['recomputed']} recomputed"
    return calls


def _module_table(report: Report) -> RenderableType:
    """The module tree; at narrow widths what modules hold and what they make are two tables."""
    modules = _records(report.modules)
    title = "Modules (largest first; activations: saved for backward; temps: peak inside)"

    def table(
        title: str,
        columns: tuple[tuple[str, str], ...],
        share: bool,
        calls: bool,
        with_class: bool = True,
    ) -> Table:
        t = Table(box=box.SIMPLE_HEAD, title=title)
        t.add_column("module", no_wrap=True)
        for header, _ in columns:
            t.add_column(header, justify="right", no_wrap=True)
        if share:
            t.add_column("of peak", justify="right", no_wrap=True)
        if calls:
            t.add_column("calls", justify="right", no_wrap=True)
        for m in modules:
            cells = [_module_label(m, with_class)] + [_bz(m.get(key)) for _, key in columns]
            if share:
                cells.append(f"{100 * (_n(m.get('share_of_peak')) or 0):.1f}%")
            if calls:
                cells.append(_module_calls(m))
            t.add_row(*cells)
        return t

    def split(with_class: bool) -> Group:
        return Group(
            table(
                "Modules: what they hold at the peak (largest first)",
                MODULE_HELD,
                share=True,
                calls=False,
                with_class=with_class,
            ),
            table(
                "Modules: what their forward and backward make (activations: saved for "
                "backward; temps: peak inside)",
                MODULE_MADE,
                share=False,
                calls=True,
                with_class=with_class,
            ),
        )

    wide = table(title, MODULE_HELD + MODULE_MADE, share=True, calls=True)
    return fitting(wide, split(with_class=True), split(with_class=False))


def _tensor_cells(x: dict[str, Any]) -> dict[str, str]:
    shape = x.get("shape")
    text = "×".join(_s(d) for d in shape) if isinstance(shape, list) else ""
    if x.get("dtype"):
        text = f"{text} {_s(x['dtype'])}".strip()
    line = _s(x.get("line"))
    if line:  # file:line (function), the file without its folder
        where, _, func = line.partition(" ")
        path, _, number = where.rpartition(":")
        line = f"{path.rsplit('/', 1)[-1]}:{number} {func}".strip()
    return {
        "bytes": b(_n(x.get("bytes"))),
        "category": _s(x.get("category")).replace("_", " "),
        "tensor / module": _s(x.get("name") or x.get("module")),
        "phase": _s(x.get("phase")),
        "shape": text,
        "created at": line,
    }


def _peak_tensor_table(tensors: list[dict[str, Any]]) -> RenderableType:
    """The largest tensors at the peak; at narrow widths one line of words per tensor."""
    title = "The tensors that made the peak (largest first)"
    rows = [_tensor_cells(x) for x in tensors]
    wide = Table(box=box.SIMPLE_HEAD, title=title)
    for col in ("bytes", "category", "tensor / module", "phase", "shape", "created at"):
        wide.add_column(col, justify="right" if col == "bytes" else "left", no_wrap=True)
    for row in rows:
        wide.add_row(*row.values())
    narrow = Table(box=box.SIMPLE_HEAD, title=title)
    narrow.add_column("bytes", justify="right", no_wrap=True)
    narrow.add_column("what, made in which phase, shape, created at", overflow="fold")
    for row in rows:
        words = [row["category"], row["tensor / module"], row["phase"], row["shape"]]
        text = ", ".join(w for w in words if w)
        if row["created at"]:
            text += f" — {row['created at']}"
        narrow.add_row(row["bytes"], text)
    return fitting(wide, narrow)


def _line_table(table: dict[str, Any]) -> RenderableType:
    """memory_profiler's columns per source line; at narrow widths a listing of the code
    with each line's numbers under it."""
    device = "GPU" if _s(table.get("device")).startswith("cuda") else "tensor"
    title = f"{_s(table.get('function'))} — {_s(table.get('file'))}"
    caption = (
        f"Mem usage: {device} memory allocated at the line's end / its peak while it ran; "
        "Increment: net change, summed over hits; host RSS likewise"
    )
    rows = _records(table.get("lines"))
    if len(rows) > 60:  # a whole script: the lines that ran
        rows = [r for r in rows if "hits" in r]
    columns = {
        "Line #": lambda r, ran: _s(r.get("line")),
        "Hits": lambda r, ran: _s(r.get("hits", "")),
        "Mem usage": lambda r, ran: b(_n(r.get("end_bytes"))) if ran else "",
        "Peak": lambda r, ran: b(_n(r.get("peak_bytes"))) if ran else "",
        "Increment": lambda r, ran: _signed(_n(r.get("increment_bytes"))) if ran else "",
        "Host RSS": lambda r, ran: b(_n(r.get("host_rss_bytes"))) if ran else "",
        "RSS incr.": lambda r, ran: _signed(_n(r.get("host_increment_bytes"))) if ran else "",
    }

    def build(title: str, names: list[str], caption: str, code_width: int) -> Table:
        t = Table(box=box.SIMPLE_HEAD, title=title, caption=caption)
        for name in names:
            t.add_column(name, justify="right", no_wrap=True, min_width=len(name))
        t.add_column("Line Contents", no_wrap=True, max_width=code_width)
        for row in rows:
            ran = "hits" in row
            t.add_row(*(columns[n](row, ran) for n in names), Text(_s(row.get("contents"))))
        return t

    wide = build(title, list(columns), caption, 90)
    # narrow: a listing of the code, each line that ran followed by its numbers
    listing = Table(
        box=box.SIMPLE_HEAD,
        title=title,
        caption=f"Under each line that ran: mem: {device} memory allocated at the line's end; "
        "peak: while it ran; incr.: net change, summed over hits; host RSS likewise",
    )
    listing.add_column("Line #", justify="right", no_wrap=True)
    listing.add_column("Line Contents", overflow="fold")
    for row in rows:
        cell = Text(_s(row.get("contents")))
        if "hits" in row:
            numbers = (
                f"hits {_s(row.get('hits'))} · mem {columns['Mem usage'](row, True)} · "
                f"peak {columns['Peak'](row, True)} · incr. {columns['Increment'](row, True)}"
                f" · host RSS {columns['Host RSS'](row, True)}"
                f" ({columns['RSS incr.'](row, True)})"
            )
            cell.append("\n" + numbers, style="dim")
        listing.add_row(_s(row.get("line")), cell)
    return fitting(wide, listing)


def _signed(value: int | float | None) -> str:
    if value is None:
        return ""
    return ("-" if value < 0 else "+") + b(abs(value)) if value else "0 B"


def _attribution_parts(report: Report) -> list:
    parts: list = []
    if _records(report.modules):
        parts.append(_module_table(report))
    tensors = _records(report.extra.get("peak_tensors"))
    if tensors:
        parts.append(_peak_tensor_table(tensors[:10]))
    for table in _records(report.extra.get("lines")):
        parts.append(_line_table(table))
    notes = report.extra.get("attribution_notes")
    for note in notes if isinstance(notes, list) else []:
        parts.append(Text(f"attribution: {_s(note)}", style="dim"))
    return parts


# ---- end attribution ---------------------------------------------------------------------------


def render(report: Report) -> Group:
    parts: list = [Panel(_header(report), box=box.ROUNDED)]
    if report.ranks:  # a distributed job: the ranks side by side first
        parts.append(_ranks_table(report))
        by_rank = _rank_category_table(report)
        if by_rank is not None:
            parts.append(by_rank)
    parts.extend(_job_lines(report))
    roles = _roles_table(report)
    if roles is not None:
        parts.append(roles)
    parts.append(_peak_table(report))
    s = report.startup
    if s.after_build_allocated_bytes is not None or s.context_and_libraries_bytes is not None:
        parts.append(
            Text(
                f"Startup: allocated before the first step {b(s.after_build_allocated_bytes)}, "
                f"reserved {b(s.after_build_reserved_bytes)}; CUDA context and libraries "
                f"{b(s.context_and_libraries_bytes)}"
                + (f"; host RSS {b(s.host_rss_bytes)}" if report.kind != "estimated" else "")
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
            parts.append(Text(f"{field_label(field)}: n/a ({why})", style="dim"))
            break
    shown: set[str] = set()
    fit = report.extra.get("fit")
    if isinstance(fit, dict):  # fit and compare: what fits
        from vramscope.fit.render import render_fit

        parts.append(render_fit(fit))
        if isinstance(fit.get("recommendation"), dict):
            shown.add(str(fit["recommendation"].get("message")))
    findings = _findings(report, shown)
    if findings is not None:
        parts.append(findings)
    return Group(*parts)


def print_report(report: Report, console: Console | None = None) -> None:
    (console or Console()).print(render(report))
