"""Render a Report as one self-contained HTML page: plotly charts, tables and findings.

The page opens offline: plotly.js comes from the installed ``plotly`` package and is
embedded once (gzip + base64, unpacked by the browser's DecompressionStream, so a report
weighs about 2 MB instead of 5). Tables and text are plain HTML and read without
JavaScript. The timeline and the charts in view are drawn first, the others next, nearest
to the screen first. Every string that comes from the user's code or machine is escaped,
in HTML and in the JSON handed to the charts. Long runs are thinned for drawing (min and
max per bucket, so every peak stays) and their tables capped. Knows nothing of torch.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vramscope.report.model import (
    CATEGORY_NAMES,
    MODULE_KEPT_FIELDS,
    PHASE_NAMES,
    Reconciliation,
    Report,
    StepStats,
)
from vramscope.units import format_bytes

MAX_POINTS = 2000  # per chart series (~1 bucket a pixel); min and max of each bucket are kept
MAX_BANDS = 400  # phase rectangles drawn on the timeline before they are merged (costly)
MAX_STEP_MARKERS = 300  # step boundary lines drawn before they are thinned
MAX_VISIBLE_STEP_MARKERS = 60  # with more, they start hidden: a legend click shows them
MAX_EPOCH_LABELS = 40
STEP_ROWS_HEAD = 10  # the steps table shows the first and last rows and the peak step
STEP_ROWS_TAIL = 10
MAX_MODULE_ROWS = 20

KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4

SERIES_COLORS = {
    "allocated": "#2563eb",
    "reserved": "#7c3aed",
    "device_used": "#0d9488",
    "host_rss": "#ea580c",
}
CATEGORY_COLORS = {
    "parameters": "#1e40af",
    "buffers": "#60a5fa",
    "gradients": "#7c3aed",
    "optimizer_state": "#c026d3",
    "activations": "#16a34a",
    "temporaries": "#f59e0b",
    "other": "#94a3b8",
}
CATEGORY_MEANING = {
    "parameters": "the model's weights",
    "buffers": "non-trainable state such as BatchNorm running statistics",
    "gradients": "the .grad of each trainable parameter",
    "optimizer_state": "what the optimizer keeps per parameter (AdamW: two moments)",
    "activations": "outputs the forward pass saves for the backward pass",
    "temporaries": "short-lived buffers inside operations at the peak (outputs, workspaces)",
    "other": "live tensors no other category explains",
}
PHASE_COLORS = {
    "data": "#06b6d4",
    "zero_grad": "#94a3b8",
    "forward": "#22c55e",
    "backward": "#f97316",
    "optimizer": "#a855f7",
    "other": "#64748b",
}
MODULE_FIELDS = (  # byte fields of report.modules entries, in table order
    ("peak_bytes", "at the peak"),
    ("parameters_bytes", "parameters"),
    ("buffers_bytes", "buffers"),
    ("gradients_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
    ("activations_bytes", "activations"),
    ("temporaries_peak_bytes", "temporaries (peak)"),
    ("forward_temporaries_peak_bytes", "fwd temporaries (peak)"),
    ("backward_temporaries_peak_bytes", "bwd temporaries (peak)"),
)

PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    "toImageButtonOptions": {"format": "png", "scale": 2},
}

b = format_bytes


# ---- escaping ---------------------------------------------------------------------------
def esc(value: Any) -> str:
    """Escape any value for HTML text and attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


def chart_text(value: Any) -> str:
    """Escape a string that plotly will draw: plotly reads a few HTML tags and entities."""
    return html.escape("" if value is None else str(value), quote=False)


def script_json(data: Any) -> str:
    """JSON that is safe inside <script>: no ``</script>``, no ``<!--``, no raw ``<>&``."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


# ---- numbers ----------------------------------------------------------------------------
def unit_for(max_bytes: float | None) -> tuple[str, int]:
    """The binary unit that reads best for values up to ``max_bytes``."""
    n = max_bytes or 0
    for name, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return name, scale
    return "B", 1


def _scaled(values: Sequence[float | int | None], scale: int) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            out.append(None)
        else:
            out.append(round(v / scale, 4))
    return out


def _pct(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return ""
    return f"{100 * part / whole:.1f}%"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def _max(values: Sequence[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def downsample_minmax(
    x: Sequence[float], y: Sequence[float | int | None], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float | int | None]]:
    """Thin a series to at most ``max_points`` by keeping the min and max of each bucket.

    Every peak survives (the global maximum is the maximum of its bucket); a bucket with
    no value keeps one ``None`` so gaps stay gaps.
    """
    n = len(x)
    if n <= max_points:
        return list(x), list(y)
    buckets = max(1, max_points // 2)
    out_x: list[float] = []
    out_y: list[float | int | None] = []
    for k in range(buckets):
        lo, hi = k * n // buckets, (k + 1) * n // buckets
        present = [i for i in range(lo, hi) if y[i] is not None]
        if not present:
            out_x.append(x[lo])
            out_y.append(None)
            continue
        i_min = min(present, key=lambda i: y[i])  # type: ignore[arg-type,return-value]
        i_max = max(present, key=lambda i: y[i])  # type: ignore[arg-type,return-value]
        for i in sorted({i_min, i_max}):
            out_x.append(x[i])
            out_y.append(y[i])
    return out_x, out_y


# ---- figures ----------------------------------------------------------------------------
BASE_LAYOUT: dict[str, Any] = {
    "font": {
        "family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif",
        "size": 12,
        "color": "#334155",
    },
    "paper_bgcolor": "#ffffff",
    "plot_bgcolor": "#ffffff",
    "margin": {"l": 64, "r": 24, "t": 36, "b": 48},
    "hoverlabel": {"align": "left"},
    "colorway": list(SERIES_COLORS.values()),
}
AXIS = {
    "gridcolor": "#eef2f7",
    "linecolor": "#cbd5e1",
    "zerolinecolor": "#cbd5e1",
    "automargin": True,
}


def figure_dict(fig: Any) -> dict[str, Any]:
    """A plotly Figure as plain data, without the bulky default template."""
    data = fig.to_plotly_json()
    layout = data.get("layout", {})
    layout.pop("template", None)
    merged = {**BASE_LAYOUT, **layout}
    for key, value in list(merged.items()):
        if (key.startswith("xaxis") or key.startswith("yaxis")) and isinstance(value, dict):
            merged[key] = {**AXIS, **value}
    return {"data": data.get("data", []), "layout": merged}


def _go() -> Any:
    import plotly.graph_objects as go

    return go


# ---- the page ---------------------------------------------------------------------------
CSS = """
:root{--fg:#0f172a;--muted:#64748b;--line:#e2e8f0;--bg:#f1f5f9;--card:#fff;--accent:#2563eb;
--warn:#b45309;--warnbg:#fffbeb;--err:#b91c1c;--errbg:#fef2f2;--info:#0369a1;--infobg:#f0f9ff;
--ok:#15803d;--okbg:#f0fdf4}
*{box-sizing:border-box}
body{margin:0;font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);background:var(--bg)}
.wrap{max-width:1240px;margin:0 auto;padding:0 28px}
header.top{background:linear-gradient(120deg,#0f172a,#1e3a8a);color:#fff;padding:26px 0 26px}
header.top .brand{font-size:13px;letter-spacing:.08em;text-transform:uppercase;color:#93c5fd}
header.top h1{margin:4px 0 6px;font-size:28px;font-weight:650;word-break:break-all}
header.top .meta{color:#cbd5e1;font-size:14px}
header.top code{color:#e2e8f0;background:rgba(255,255,255,.08);padding:1px 6px;border-radius:4px}
.chip{display:inline-block;background:rgba(255,255,255,.12);border-radius:999px;padding:2px 10px;
margin:6px 6px 0 0;font-size:13px;color:#e2e8f0}
.chip.bad{background:#b91c1c;color:#fff}
nav.toc{position:sticky;top:0;z-index:5;background:rgba(241,245,249,.94);backdrop-filter:blur(4px);
border-bottom:1px solid var(--line)}
nav.toc .wrap{display:flex;gap:18px;overflow-x:auto;padding-top:8px;padding-bottom:8px;font-size:14px}
nav.toc a{color:var(--muted);text-decoration:none;white-space:nowrap}
nav.toc a:hover{color:var(--accent)}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(210px,1fr));gap:14px;margin-top:20px;color:var(--fg)}
.kpi{background:var(--card);border-radius:12px;padding:14px 18px;box-shadow:0 1px 3px rgba(15,23,42,.12)}
.kpi .label{font-size:13px;color:var(--muted)}
.kpi .value{font-size:26px;font-weight:650;font-variant-numeric:tabular-nums}
.kpi .sub{font-size:12.5px;color:var(--muted)}
.kpi .bar{height:6px;background:#e2e8f0;border-radius:3px;margin-top:8px;overflow:hidden}
.kpi .bar span{display:block;height:100%;border-radius:3px}
section.card{background:var(--card);border-radius:12px;padding:20px 24px;margin:18px 0;
box-shadow:0 1px 2px rgba(15,23,42,.08)}
section.card h2{margin:0 0 4px;font-size:19px}
p.lead{margin:0 0 12px;color:var(--muted);max-width:900px}
.peakline{font-size:16px;margin:18px 2px 0}
.grid2{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:20px}
@media (max-width:900px){.grid2{grid-template-columns:1fr}}
.chart{width:100%;min-height:120px}
.chart:empty::before{content:"drawing chart…";color:var(--muted);font-size:13px}
table{border-collapse:collapse;width:100%;font-size:13.5px;font-variant-numeric:tabular-nums}
th,td{padding:5px 9px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{font-weight:600;color:var(--muted);background:#f8fafc;position:sticky;top:0}
td.l,th.l{text-align:left;white-space:normal}
tr.hl td{background:#eff6ff;font-weight:600}
tr.gap td{color:var(--muted);text-align:center;background:#fafafa}
tr.total td{font-weight:650;border-top:2px solid var(--line)}
.tablewrap{overflow-x:auto;max-height:640px;overflow-y:auto}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;vertical-align:baseline}
.finding{border-left:4px solid;padding:10px 14px;border-radius:6px;margin:8px 0}
.finding.warning{border-color:var(--warn);background:var(--warnbg)}
.finding.error{border-color:var(--err);background:var(--errbg)}
.finding.info{border-color:var(--info);background:var(--infobg)}
.finding .sev{font-size:12px;font-weight:700;text-transform:uppercase;letter-spacing:.05em;margin-right:8px}
.finding.warning .sev{color:var(--warn)} .finding.error .sev{color:var(--err)} .finding.info .sev{color:var(--info)}
.verdict{border-radius:10px;padding:14px 18px;font-size:17px;font-weight:600}
.verdict.fits{background:var(--okbg);color:var(--ok)} .verdict.nofit{background:var(--errbg);color:var(--err)}
.note{color:var(--muted);font-size:13px}
.pos{color:var(--err)} .neg{color:var(--ok)}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px;margin:0}
dl.kv dt{color:var(--muted)} dl.kv dd{margin:0;font-variant-numeric:tabular-nums}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em}
footer{color:var(--muted);font-size:12.5px;padding:8px 0 36px}
#vs-error{display:none;background:var(--errbg);color:var(--err);padding:10px 14px;border-radius:8px;margin:12px 0}
"""

LOADER_JS = """
(function(){
  var T=window.vramscopeTimings={start:performance.now()};
  function fail(msg){var e=document.getElementById('vs-error');e.textContent=msg;e.style.display='block';
    document.querySelectorAll('.chart').forEach(function(c){c.style.display='none';});}
  function painted(){  // resolves once the browser has drawn a frame (at once in a hidden tab)
    if (document.hidden) return Promise.resolve();
    return new Promise(function(r){requestAnimationFrame(function(){setTimeout(r,0);});});}
  function yieldToPage(){  // lets the page scroll and paint between two charts
    if (window.scheduler && scheduler.yield) return scheduler.yield();
    return new Promise(function(r){setTimeout(r,0);});}
  async function loadPlotly(){
    if (window.Plotly) return;
    var src=document.getElementById('vs-plotlyjs');
    if (!src) throw new Error('plotly.js is missing from this file');
    var code;
    if (src.getAttribute('data-encoding')==='gzip+base64'){
      if (typeof DecompressionStream==='undefined')
        throw new Error('the charts need a browser from 2023 or later (Chrome 80, Firefox 113, Safari 16.4); the tables below are complete');
      var text=src.textContent.trim(), bytes;
      if (Uint8Array.fromBase64) bytes=Uint8Array.fromBase64(text);
      else { var raw=atob(text); bytes=new Uint8Array(raw.length);
        for (var i=0;i<raw.length;i++) bytes[i]=raw.charCodeAt(i); }
      var stream=new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
      code=await new Response(stream).text();
    } else { code=src.textContent; }
    T.unpacked=performance.now();
    // Run as a script, not eval(): the compile hint (Chrome 136+, a comment to other
    // browsers) has every function compiled once, up front, instead of pre-parsed and then
    // parsed again when first called (eval ignores it), and opened again the page finds
    // the script compiled in the browser's memory.
    var script=document.createElement('script');
    script.text='//# allFunctionsCalledOnLoad\\n'+code;
    document.head.appendChild(script);  // runs it now
    if (!window.Plotly) throw new Error('plotly.js did not start');
    T.plotlyjs=performance.now();
  }
  function distance(el){  // how far a chart is from the visible part of the page, in pixels
    var r=el.getBoundingClientRect(), h=window.innerHeight||document.documentElement.clientHeight;
    return r.bottom<0 ? -r.bottom : r.top>h ? r.top-h : 0;
  }
  async function main(){
    try{
      var figs=JSON.parse(document.getElementById('vs-figures').textContent);
      var config=JSON.parse(document.getElementById('vs-config').textContent);
      var charts=Object.keys(figs).map(function(id){return document.getElementById(id);})
        .filter(function(el){return el;});
      if (!charts.length){ T.first=T.plotted=window.vramscopeReady=performance.now(); return; }
      await loadPlotly();
      function draw(el){
        var f=figs[el.id];
        return Plotly.newPlot(el,f.data,f.layout,config).then(function(){T[el.id]=performance.now();});
      }
      // the first screen (the timeline and every chart in view) first, then the others,
      // nearest to what is on screen first, so a chart scrolled to is drawn next
      var first=charts.filter(function(el){return el.id==='chart-timeline'||distance(el)===0;});
      var rest=charts.filter(function(el){return first.indexOf(el)<0;});
      for (var k=0;k<first.length;k++) await draw(first[k]);
      await painted();
      T.first=window.vramscopeFirstScreen=performance.now();
      while (rest.length){
        await yieldToPage();
        rest.sort(function(a,b){return distance(a)-distance(b);});
        await draw(rest.shift());
      }
      T.plotted=performance.now();
      window.vramscopeReady=T.plotted;
    }catch(err){ fail('Charts could not be drawn: '+err.message); window.vramscopeError=String(err); }
  }
  if (document.readyState==='loading') document.addEventListener('DOMContentLoaded',main); else main();
})();
"""


@functools.lru_cache(maxsize=2)
def plotlyjs_payload(compress: bool = True) -> tuple[str, str]:
    """plotly.js from the installed plotly package: (encoding, text to embed)."""
    from plotly.offline import get_plotlyjs

    source = get_plotlyjs()
    if not compress:
        # a raw script inside a JSON-free <script type="text/plain"> must not close it
        return "plain", source.replace("</script", "<\\/script")
    packed = base64.b64encode(gzip.compress(source.encode("utf-8"), compresslevel=9, mtime=0))
    return "gzip+base64", packed.decode("ascii")


def page(
    title: str,
    header_html: str,
    body_html: str,
    figures: dict[str, dict[str, Any]],
    nav: Sequence[tuple[str, str]] = (),
    footer_html: str = "",
    compress_plotlyjs: bool = True,
) -> str:
    """Assemble a whole page. ``title`` is escaped here; the HTML parts must be escaped."""
    encoding, plotlyjs = plotlyjs_payload(compress_plotlyjs)
    nav_html = ""
    if nav:
        links = "".join(f'<a href="#{esc(anchor)}">{esc(label)}</a>' for anchor, label in nav)
        nav_html = f'<nav class="toc"><div class="wrap">{links}</div></nav>'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n"
        f"<style>{CSS}</style>\n</head><body>\n"
        f"{header_html}\n{nav_html}\n"
        '<main class="wrap">\n<div id="vs-error" role="alert"></div>\n'
        '<noscript><p class="note">The charts need JavaScript; every table below is complete '
        "without it.</p></noscript>\n"
        f"{body_html}\n"
        f"<footer>{footer_html}</footer>\n</main>\n"
        f'<script type="application/json" id="vs-config">{script_json(PLOTLY_CONFIG)}</script>\n'
        f'<script type="application/json" id="vs-figures">{script_json(figures)}</script>\n'
        f'<script type="text/plain" id="vs-plotlyjs" data-encoding="{encoding}">'
        f"{plotlyjs}</script>\n"
        f"<script>{LOADER_JS}</script>\n"
        "</body></html>\n"
    )


def section(anchor: str, title: str, lead: str, content: str) -> str:
    """A card with a heading and a one-line explanation (``title`` and ``lead`` escaped)."""
    lead_html = f'<p class="lead">{esc(lead)}</p>' if lead else ""
    return (
        f'<section class="card" id="{esc(anchor)}"><h2>{esc(title)}</h2>'
        f"{lead_html}{content}</section>\n"
    )


def chart_div(chart_id: str, height: int) -> str:
    return f'<div class="chart" id="{esc(chart_id)}" style="height:{int(height)}px"></div>'


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str] | None],
    left: int = 1,
    row_classes: Sequence[str] | None = None,
    text_columns: Sequence[int] = (),
    cell_classes: Sequence[Sequence[str]] | None = None,
) -> str:
    """An HTML table; cells are escaped; a ``None`` row is drawn as an elision.

    The first ``left`` columns and those in ``text_columns`` are left-aligned and wrap.
    """

    def is_text(i: int) -> bool:
        return i < left or i in text_columns or (i - len(headers)) in text_columns

    head = "".join(
        f'<th class="l">{esc(h)}</th>' if is_text(i) else f"<th>{esc(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for n, row in enumerate(rows):
        if row is None:
            body.append(f'<tr class="gap"><td colspan="{len(headers)}">…</td></tr>')
            continue
        cls = row_classes[n] if row_classes and row_classes[n] else ""
        extra = cell_classes[n] if cell_classes else ()

        def cell(i: int, text: str, extra: Sequence[str] = extra) -> str:
            names = ["l"] if is_text(i) else []
            if i < len(extra) and extra[i]:
                names.append(extra[i])
            attr = f' class="{" ".join(names)}"' if names else ""
            return f"<td{attr}>{esc(text)}</td>"

        cells = "".join(cell(i, c) for i, c in enumerate(row))
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    return (
        f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def kv_list(items: Sequence[tuple[str, str]]) -> str:
    inner = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    return f'<dl class="kv">{inner}</dl>'


# ---- header, KPIs, the peak in words ----------------------------------------------------
def workload_title(report: Report) -> str:
    w = report.workload
    return str(w.get("spec") or w.get("script") or w.get("name") or "tracked code")


def _header(report: Report, kpis: str = "") -> str:
    w, d = report.workload, report.device
    chips = [report.kind]
    if w.get("batch_size") is not None:
        chips.append(f"batch size {w['batch_size']}")
    if w.get("precision"):
        chips.append(str(w["precision"]))
    if w.get("accumulate") not in (None, 1):
        chips.append(f"accumulate {w['accumulate']}")
    if w.get("steps") is not None:
        chips.append(
            f"{w['steps']:,} steps" if isinstance(w["steps"], int) else f"{w['steps']} steps"
        )
    elif report.steps:
        chips.append(f"{len(report.steps):,} steps")
    if w.get("training") is False:
        chips.append("inference")
    chip_html = "".join(f'<span class="chip">{esc(c)}</span>' for c in chips)
    if report.exit.status != "ok":
        chip_html += f'<span class="chip bad">run ended: {esc(report.exit.status)}</span>'
    device = str(d.get("name") or d.get("type") or "unknown device")
    if d.get("total_bytes"):
        device += f" · {b(d['total_bytes'])}"
    bits = [device]
    for key, label in (
        ("torch_version", "torch"),
        ("cuda_version", "CUDA"),
        ("driver_version", "driver"),
    ):
        if d.get(key):
            bits.append(f"{label} {d[key]}")
    if report.created_at:
        bits.append(f"recorded {report.created_at.replace('T', ' ')}")
    argv = ""
    if w.get("argv"):
        try:
            argv_text = shlex.join(str(a) for a in w["argv"])
        except TypeError:
            argv_text = " ".join(str(a) for a in w["argv"])
        argv = f'<div class="meta">arguments <code>{esc(argv_text)}</code></div>'
    error = ""
    if report.exit.error:
        error = f'<div class="meta">error: <code>{esc(report.exit.error)}</code></div>'
    return (
        '<header class="top"><div class="wrap">'
        f'<div class="brand">vramscope · {esc(report.kind)} memory report</div>'
        f"<h1>{esc(workload_title(report))}</h1>{argv}"
        f'<div class="meta">{esc(" · ".join(bits))}</div>'
        f"<div>{chip_html}</div>{error}{kpis}</div></header>"
    )


def _kpi(label: str, value: int | None, sub: str, share: float | None, color: str) -> str:
    bar = ""
    if share is not None:
        width = max(0.0, min(100.0, 100 * share))
        bar = f'<div class="bar"><span style="width:{width:.1f}%;background:{color}"></span></div>'
    return (
        f'<div class="kpi"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(b(value))}</div><div class="sub">{esc(sub)}</div>{bar}</div>'
    )


def _kpis(report: Report) -> str:
    p, total = report.peak, report.device.get("total_bytes")
    host_total = report.host.get("total_bytes")

    def share(v: int | None, whole: int | None) -> float | None:
        return v / whole if v is not None and whole else None

    def why(field: str) -> str:
        return report.unavailable.get(f"peak.{field}", "not measured")

    cards = []
    for field, label, color in (
        ("allocated_bytes", "Peak allocated", SERIES_COLORS["allocated"]),
        ("reserved_bytes", "Peak reserved", SERIES_COLORS["reserved"]),
        ("device_used_bytes", "Device used (nvidia-smi)", SERIES_COLORS["device_used"]),
    ):
        value = getattr(p, field)
        if value is None:
            sub = why(field)
        elif total:
            sub = f"{_pct(value, total)} of {b(total)}"
        else:
            sub = "tensors held by PyTorch" if field == "allocated_bytes" else ""
        cards.append(_kpi(label, value, sub, share(value, total), color))
    host_sub = f"{_pct(p.host_rss_bytes, host_total)} of {b(host_total)} RAM" if host_total else ""
    cards.append(
        _kpi(
            "Peak host RSS",
            p.host_rss_bytes,
            host_sub or "the process and its workers",
            share(p.host_rss_bytes, host_total),
            SERIES_COLORS["host_rss"],
        )
    )
    return f'<div class="kpis">{"".join(cards)}</div>'


def explain_peak(report: Report) -> str:
    """The peak in one or two plain sentences (plain text; escape it to show it)."""
    p = report.peak
    if p.allocated_bytes is None:
        why = report.unavailable.get("peak.allocated_bytes")
        text = "GPU memory was not measured" + (f" ({why})" if why else "") + "."
        if p.host_rss_bytes is not None:
            text += f" Host memory (RSS) peaked at {b(p.host_rss_bytes)}."
        return text
    where = ""
    if p.phase and p.step is not None:
        where = f" in the {p.phase} phase of step {p.step}"
    elif p.step is not None:
        where = f" in step {p.step}"
    text = f"The run peaked at {b(p.allocated_bytes)} allocated{where}"
    if p.reserved_bytes:
        text += f"; the caching allocator held {b(p.reserved_bytes)}"
    if p.device_used_bytes:
        text += f" and nvidia-smi showed {b(p.device_used_bytes)} for the process"
    text += "."
    cats = [(n, getattr(report.categories_at_peak, n)) for n in CATEGORY_NAMES]
    cats = [(n, v) for n, v in cats if v]
    cats.sort(key=lambda kv: kv[1], reverse=True)
    if cats:
        parts = [
            f"{n.replace('_', ' ')} {b(v)} ({_pct(v, p.allocated_bytes)})" for n, v in cats[:3]
        ]
        text += " At that moment: " + ", ".join(parts) + "."
    if p.step == 0 and len(report.steps) > 1:
        text += " The first step is the highest: later steps need less."
    return text


# ---- timeline ---------------------------------------------------------------------------
def _band_polygons(
    bands: Sequence[tuple[float, float]],
) -> tuple[list[float | None], list[float | None]]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for start, end in bands:
        xs += [
            round(start, 6),
            round(start, 6),
            round(end, 6),
            round(end, 6),
            round(start, 6),
            None,
        ]
        ys += [0, 1, 1, 0, 0, None]
    return xs, ys


def phase_bands(report: Report) -> tuple[dict[str, list[tuple[float, float]]], str]:
    """Rectangles to shade, by legend name, and a note when they were merged."""
    raw = [
        band
        for band in report.timeline.phases
        if isinstance(band.get("start_s"), (int, float))
        and isinstance(band.get("end_s"), (int, float))
    ]
    note = ""
    if report.timeline.dropped_phase_bands:
        note = f"{report.timeline.dropped_phase_bands} later phase bands were not recorded. "
    if len(raw) <= MAX_BANDS:
        out: dict[str, list[tuple[float, float]]] = {}
        for band in raw:
            out.setdefault(str(band.get("name", "other")), []).append(
                (float(band["start_s"]), float(band["end_s"]))
            )
        return out, note
    # too many to draw: one band per step, or per group of steps
    per_step: dict[Any, list[float]] = {}
    for band in raw:
        span = per_step.setdefault(band.get("step"), [band["start_s"], band["end_s"]])
        span[0] = min(span[0], band["start_s"])
        span[1] = max(span[1], band["end_s"])
    spans = sorted((s, e) for s, e in per_step.values())
    group = max(1, math.ceil(len(spans) / MAX_BANDS))
    merged = [
        (spans[i][0], max(e for _, e in spans[i : i + group])) for i in range(0, len(spans), group)
    ]
    unit = "step" if group == 1 else f"{group} steps"
    note += (
        f"{len(raw):,} phase bands are too many to draw: shaded bands alternate per {unit}; "
        "the --trace export keeps every phase."
    )
    return {f"{unit} (even)": merged[0::2], f"{unit} (odd)": merged[1::2]}, note


def _peak_time(report: Report) -> float | None:
    tl, p = report.timeline, report.peak
    if not tl.t:
        return None
    window = None
    for band in tl.phases:
        if band.get("step") == p.step and band.get("name") == p.phase:
            window = (band.get("start_s"), band.get("end_s"))
    best_t, best_v = None, None
    for t, v in zip(tl.t, tl.allocated_bytes, strict=False):
        if v is None:
            continue
        if window and not (window[0] - 0.05 <= t <= window[1] + 0.05):
            continue
        if best_v is None or v > best_v:
            best_t, best_v = t, v
    if best_t is None and window:
        return (window[0] + window[1]) / 2
    return best_t


def _boundary_lines(
    markers: list[dict[str, Any]], name: str, line: dict[str, Any], visible: bool | str = True
) -> Any:
    """Vertical lines across the timeline at each marker's time (one trace, gaps between)."""
    import plotly.graph_objects as go

    xs: list[float | None] = []
    ys: list[float | None] = []
    for m in markers:
        xs += [round(m["t"], 6), round(m["t"], 6), None]
        ys += [0, 1, None]
    return go.Scatter(
        x=xs,
        y=ys,
        name=name,
        mode="lines",
        line=line,
        hoverinfo="skip",
        yaxis="y3",
        visible=visible,
    )


def _timeline_figure(report: Report) -> tuple[dict[str, Any] | None, str]:
    go = _go()
    tl = report.timeline
    if not tl.t:
        return None, ""
    gpu_keys = [
        ("allocated", tl.allocated_bytes),
        ("reserved", tl.reserved_bytes),
        ("device_used", tl.device_used_bytes),
    ]
    gpu_keys = [(k, v) for k, v in gpu_keys if _max(v) is not None]
    host = tl.host_rss_bytes if _max(tl.host_rss_bytes) is not None else None
    if not gpu_keys and host is None:
        return None, ""
    names = {
        "allocated": "allocated",
        "reserved": "reserved",
        "device_used": "device used (nvidia-smi)",
        "host_rss": "host RSS",
    }
    fig = go.Figure()
    top_axis = "y" if gpu_keys else None
    host_axis = "y2" if gpu_keys else "y"
    gpu_max = max((_max(v) or 0 for _, v in gpu_keys), default=0)
    gpu_max = max(gpu_max, report.peak.allocated_bytes or 0)
    gpu_unit, gpu_scale = unit_for(gpu_max)
    for key, values in gpu_keys:
        xs, ys = downsample_minmax(tl.t, values)
        fig.add_trace(
            go.Scatter(
                x=[round(x, 4) for x in xs],
                y=_scaled(ys, gpu_scale),
                name=names[key],
                mode="lines",
                line={"color": SERIES_COLORS[key], "width": 2 if key == "allocated" else 1.6},
                hovertemplate=f"%{{y:.2f}} {gpu_unit}",
                yaxis=top_axis,
            )
        )
    host_unit, host_scale = unit_for(_max(host) if host else 0)
    if host is not None:
        xs, ys = downsample_minmax(tl.t, host)
        fig.add_trace(
            go.Scatter(
                x=[round(x, 4) for x in xs],
                y=_scaled(ys, host_scale),
                name=names["host_rss"],
                mode="lines",
                line={"color": SERIES_COLORS["host_rss"], "width": 1.6},
                hovertemplate=f"%{{y:.2f}} {host_unit}",
                yaxis=host_axis,
            )
        )
    # phase bands and boundaries live on a hidden 0..1 axis over the top panel
    bands, note = phase_bands(report)
    merged = any(name not in PHASE_COLORS for name in bands)
    for i, (name, spans) in enumerate(sorted(bands.items(), key=lambda kv: _phase_order(kv[0]))):
        xs, ys = _band_polygons(spans)
        color = PHASE_COLORS.get(name) or ("#64748b" if i % 2 else "#94a3b8")
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=chart_text(name.replace("_", " ")),
                mode="lines",
                fill="toself",
                fillcolor=_rgba(color, 0.13),
                line={"width": 0},
                hoverinfo="skip",
                yaxis="y3",
                visible="legendonly" if merged else True,  # too dense to read: on request
            )
        )
    steps = [
        m for m in tl.markers if m.get("kind") == "step" and isinstance(m.get("t"), (int, float))
    ]
    if steps:
        every = max(1, math.ceil(len(steps) / MAX_STEP_MARKERS))
        shown = steps[::every]
        if every > 1:
            note += f" Step boundaries: every {every}th of {len(steps):,} is drawn."
        fig.add_trace(
            _boundary_lines(
                shown,
                "step boundary",
                {"color": "#94a3b8", "width": 0.8, "dash": "dot"},
                visible=True if len(steps) <= MAX_VISIBLE_STEP_MARKERS else "legendonly",
            )
        )
    epochs = [
        m for m in tl.markers if m.get("kind") == "epoch" and isinstance(m.get("t"), (int, float))
    ]
    annotations: list[dict[str, Any]] = []
    if epochs:
        fig.add_trace(
            _boundary_lines(
                epochs, "epoch boundary", {"color": "#0f172a", "width": 1.4, "dash": "dash"}
            )
        )
        if len(epochs) <= MAX_EPOCH_LABELS:
            for m in epochs:
                annotations.append(
                    {
                        "x": round(m["t"], 6),
                        "y": 1,
                        "yref": "y3",
                        "text": f"epoch {int(m.get('index', 0))}",
                        "showarrow": False,
                        "textangle": -90,
                        "xanchor": "right",
                        "yanchor": "top",
                        "font": {"size": 11, "color": "#0f172a"},
                    }
                )
    p = report.peak
    t_peak = _peak_time(report)
    if gpu_keys and p.allocated_bytes is not None and t_peak is not None:
        y = round(p.allocated_bytes / gpu_scale, 4)
        where = f"{p.phase}, step {p.step}" if p.phase and p.step is not None else ""
        label = f"peak {b(p.allocated_bytes)}" + (f"<br>{chart_text(where)}" if where else "")
        fig.add_trace(
            go.Scatter(
                x=[round(t_peak, 6)],
                y=[y],
                name="peak allocated",
                mode="markers",
                marker={
                    "symbol": "star",
                    "size": 15,
                    "color": "#dc2626",
                    "line": {"width": 1, "color": "#fff"},
                },
                hovertemplate=chart_text(f"peak allocated {b(p.allocated_bytes)} {where}")
                + "<extra></extra>",
                yaxis="y",
            )
        )
        annotations.append(
            {
                "x": round(t_peak, 6),
                "y": y,
                "xref": "x",
                "yref": "y",
                "text": label,
                "showarrow": True,
                "arrowhead": 2,
                "ax": -40,
                "ay": -36,
                "bgcolor": "rgba(255,255,255,.9)",
                "bordercolor": "#dc2626",
                "font": {"size": 11, "color": "#991b1b"},
            }
        )
    xrange = None
    starts = [m["t"] for m in steps] or [s.start_s for s in report.steps if s.start_s]
    if starts:
        t_first, t_begin, t_end = min(starts), tl.t[0], tl.t[-1]
        if t_first - t_begin > 0.5 * (t_end - t_begin) and t_end > t_first:
            xs, ys = _band_polygons([(t_begin, t_first)])
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name="startup",
                    mode="lines",
                    fill="toself",
                    fillcolor="rgba(148,163,184,0.12)",
                    line={"width": 0},
                    hoverinfo="skip",
                    yaxis="y3",
                )
            )
            span = t_end - t_first
            xrange = [round(t_first - 0.04 * span, 6), round(t_end + 0.01 * span, 6)]
            note += (
                f" Zoomed to the steps: the first {t_first - t_begin:.1f} s are start-up "
                "(imports, building the model, the CUDA context on a GPU); double-click the chart "
                "to see them."
            )
    # numbers on every axis: the margins below hold them, and plotly skips measuring the
    # labels to grow the margins (a second layout pass, ~100 ms of the first screen)
    fixed = {"automargin": False}
    layout: dict[str, Any] = {
        "height": 500 if (gpu_keys and host is not None) else 400,
        "hovermode": "x unified",
        "legend": {"orientation": "h", "y": 1.01, "yanchor": "bottom", "x": 0},
        "xaxis": {
            "title": {"text": "seconds since the run began"},
            "anchor": host_axis,
            **fixed,
            **({"range": xrange} if xrange else {}),
        },
        "yaxis3": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        "annotations": annotations,
        "margin": {"l": 70, "r": 24, "t": 64, "b": 40},
    }
    if gpu_keys:
        layout["yaxis"] = {
            "title": {"text": f"GPU memory ({gpu_unit})"},
            "domain": [0.34, 1] if host is not None else [0, 1],
            "rangemode": "tozero",
            **fixed,
        }
        if host is not None:
            layout["yaxis2"] = {
                "title": {"text": f"host RSS ({host_unit})"},
                "domain": [0, 0.24],
                "rangemode": "tozero",
                **fixed,
            }
    else:
        layout["yaxis"] = {
            "title": {"text": f"host RSS ({host_unit})"},
            "rangemode": "tozero",
            **fixed,
        }
    fig.update_layout(layout)
    return figure_dict(fig), note.strip()


def _phase_order(name: str) -> int:
    return PHASE_NAMES.index(name) if name in PHASE_NAMES else len(PHASE_NAMES)


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, bl = int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    return f"rgba({r},{g},{bl},{alpha})"


# ---- categories -------------------------------------------------------------------------
def _categories_section(report: Report, figures: dict[str, Any]) -> str:
    go = _go()
    cats = report.categories_at_peak
    values = [(n, getattr(cats, n)) for n in CATEGORY_NAMES]
    known = [(n, v) for n, v in values if v]
    if not known:
        return ""
    total = report.peak.allocated_bytes or cats.total() or None
    fig = go.Figure(
        go.Pie(
            labels=[n.replace("_", " ") for n, _ in known],
            values=[v for _, v in known],
            hole=0.58,
            sort=False,
            direction="clockwise",
            marker={"colors": [CATEGORY_COLORS[n] for n, _ in known]},
            customdata=[b(v) for _, v in known],
            text=[
                f"{100 * v / (cats.total() or 1):.0f}%" if v >= 0.04 * (cats.total() or 1) else ""
                for _, v in known
            ],
            textinfo="text",
            hovertemplate="%{label}: %{customdata} (%{percent})<extra></extra>",
        )
    )
    centre = b(cats.total())
    fig.update_layout(
        height=340,
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        annotations=[
            {
                "text": f"<b>{centre}</b><br>at the peak",
                "showarrow": False,
                "font": {"size": 15},
                "x": 0.5,
                "y": 0.5,
                "xref": "paper",
                "yref": "paper",
            }
        ],
    )
    figures["chart-categories"] = figure_dict(fig)
    rows = [
        [name.replace("_", " "), b(value), _pct(value, total), CATEGORY_MEANING[name]]
        for name, value in values
    ]
    tbl = table(["category", "bytes", "share", "what it is"], rows, text_columns=[-1])
    # plain HTML table: add colour swatches after escaping
    for name in CATEGORY_NAMES:
        label = esc(name.replace("_", " "))
        tbl = tbl.replace(
            f'<td class="l">{label}</td>',
            f'<td class="l"><span class="swatch" style="background:{CATEGORY_COLORS[name]}">'
            f"</span>{label}</td>",
            1,
        )
    note = f'<p class="note">{esc(report.categories_note)}</p>' if report.categories_note else ""
    over_time = _categories_over_time(report, figures)
    body = (
        f'<div class="grid2"><div>{chart_div("chart-categories", 340)}</div>'
        f"<div>{tbl}</div></div>{note}{over_time}"
    )
    return section(
        "categories",
        "What the peak is made of",
        "Live tensors at the moment of the peak, by kind, sized as the allocator rounds them.",
        body,
    )


def categories_over_time(report: Report) -> dict[str, list[Any]] | None:
    """Per-category series, when a tracker recorded them in ``extra['categories_over_time']``.

    The expected shape is ``{"t": [seconds...], "<category>": [bytes...], ...}``;
    nothing is derived or invented when it is absent.
    """
    data = report.extra.get("categories_over_time")
    if not isinstance(data, dict) or not isinstance(data.get("t"), list) or not data["t"]:
        return None
    series = {
        n: data[n]
        for n in CATEGORY_NAMES
        if isinstance(data.get(n), list) and len(data[n]) == len(data["t"])
    }
    if not series:
        return None
    return {"t": data["t"], **series}


def _categories_over_time(report: Report, figures: dict[str, Any]) -> str:
    data = categories_over_time(report)
    if data is None:
        return ""
    go = _go()
    names = [n for n in data if n != "t"]
    top = max((sum(data[n][i] or 0 for n in names) for i in range(len(data["t"]))), default=0)
    unit, scale = unit_for(top)
    fig = go.Figure()
    for name in CATEGORY_NAMES:
        if name not in data:
            continue
        xs, ys = data["t"], data[name]
        if len(xs) > MAX_POINTS:  # keep stacking aligned: the same stride for every series
            stride = math.ceil(len(xs) / MAX_POINTS)
            xs, ys = xs[::stride], ys[::stride]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=_scaled(ys, scale),
                name=name.replace("_", " "),
                stackgroup="categories",
                mode="lines",
                line={"width": 0.5, "color": CATEGORY_COLORS[name]},
                hovertemplate=f"%{{y:.2f}} {unit}",
            )
        )
    fig.update_layout(
        height=320,
        hovermode="x unified",
        xaxis={"title": {"text": "seconds since the run began"}},
        yaxis={"title": {"text": unit}},
        legend={"orientation": "h", "y": -0.25},
    )
    figures["chart-categories-time"] = figure_dict(fig)
    return "<h3>Over time</h3>" + chart_div("chart-categories-time", 320)


# ---- reconciliation ---------------------------------------------------------------------
def reconciliation_steps(rec: Reconciliation) -> list[tuple[str, str, int, str]]:
    """(label, measure, bytes, what it is) from tensors to device used, for a waterfall."""
    steps: list[tuple[str, str, int, str]] = []
    tensors = rec.tensors.total()
    steps.append(("tensors", "absolute", tensors, "live tensors, by category"))
    if rec.allocated_bytes is not None:
        if rec.allocated_bytes - tensors:
            steps.append(
                (
                    "untracked",
                    "relative",
                    rec.allocated_bytes - tensors,
                    "allocated but in no category",
                )
            )
        steps.append(("allocated", "total", rec.allocated_bytes, "torch.cuda.memory_allocated()"))
    if rec.reserved_bytes is not None:
        base = rec.allocated_bytes if rec.allocated_bytes is not None else tensors
        cached = rec.slack.cached_free_bytes or 0
        frag = rec.slack.fragmentation_bytes or 0
        if cached:
            steps.append(("cached free", "relative", cached, "empty_cache() would release it"))
        if frag:
            steps.append(("fragmentation", "relative", frag, "free pieces of partly used segments"))
        rest = rec.reserved_bytes - base - cached - frag
        if rest:
            steps.append(
                ("other slack", "relative", rest, "reserved, neither cached nor fragmented")
            )
        steps.append(("reserved", "total", rec.reserved_bytes, "torch.cuda.memory_reserved()"))
    if rec.device_used_bytes is not None:
        below = rec.reserved_bytes if rec.reserved_bytes is not None else None
        if below is not None and rec.device_used_bytes - below:
            steps.append(
                (
                    "context and libraries",
                    "relative",
                    rec.device_used_bytes - below,
                    "CUDA context, kernels, cuBLAS/cuDNN: outside the allocator",
                )
            )
        steps.append(("device used", "total", rec.device_used_bytes, "what nvidia-smi shows"))
    return steps


TICK_LABELS = {
    "cached free": "cached<br>free",
    "fragmentation": "fragmen-<br>tation",
    "other slack": "other<br>slack",
    "context and libraries": "context and<br>libraries",
    "device used": "device<br>used",
}


def _reconciliation_section(report: Report, figures: dict[str, Any]) -> str:
    go = _go()
    recs = [r for r in report.reconciliation if r.allocated_bytes is not None or r.reserved_bytes]
    if not recs:
        why = report.unavailable.get("reconciliation")
        if not why:
            return ""
        return section(
            "reconciliation",
            "Why nvidia-smi shows more than max_memory_allocated",
            "",
            f'<p class="note">Not available: {esc(why)}</p>',
        )
    parts = []
    for rec in sorted(recs, key=lambda r: 0 if r.moment == "peak" else 1):
        steps = reconciliation_steps(rec)
        top = max(
            [s[2] for s in steps if s[1] != "relative"] + [rec.device_used_bytes or 0], default=0
        )
        unit, scale = unit_for(top)
        chart_id = f"chart-waterfall-{rec.moment}"
        fig = go.Figure(
            go.Waterfall(
                x=[TICK_LABELS.get(s[0], s[0]) for s in steps],
                measure=[s[1] for s in steps],
                y=[round(s[2] / scale, 4) for s in steps],
                text=[b(s[2], signed=s[1] == "relative") for s in steps],
                textposition="outside",
                customdata=[s[3] for s in steps],
                hovertemplate="%{x}: %{text}<br>%{customdata}<extra></extra>",
                connector={"line": {"color": "#cbd5e1"}},
                increasing={"marker": {"color": "#f59e0b"}},
                decreasing={"marker": {"color": "#16a34a"}},
                totals={"marker": {"color": "#2563eb"}},
            )
        )
        fig.update_layout(
            height=360,
            showlegend=False,
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            xaxis={"tickangle": 0},
            margin={"l": 60, "r": 20, "t": 30, "b": 50},
        )
        figures[chart_id] = figure_dict(fig)
        title = "at the peak" if rec.moment == "peak" else "at the end of the run"
        device_bar = _device_bar(rec, figures, f"chart-device-{rec.moment}")
        rows = [[s[0], b(s[2], signed=s[1] == "relative"), s[3]] for s in steps]
        extra_rows = [
            ("other processes", rec.other_processes_bytes, ""),
            (
                "driver reserved",
                rec.driver_reserved_bytes,
                "kept by the driver; nvidia-smi counts it as used",
            ),
            ("unattributed", rec.unaccounted_bytes, "used on the device, listed for no process"),
            ("free", rec.free_bytes, ""),
            ("device total", rec.total_bytes, ""),
        ]
        rows += [[n, b(v), w] for n, v, w in extra_rows if v]
        note = f'<p class="note">{esc(rec.note)}</p>' if rec.note else ""
        parts.append(
            f"<h3>{esc(title.capitalize())}</h3>"
            f'<div class="grid2"><div>{chart_div(chart_id, 360)}</div>'
            f"<div>{table(['layer', 'bytes', 'what it is'], rows, text_columns=[-1])}</div></div>"
            f"{device_bar}{note}"
        )
    return section(
        "reconciliation",
        "Why nvidia-smi shows more than max_memory_allocated",
        "From the tensors to what nvidia-smi shows: the caching allocator keeps freed memory "
        "(reserved ≥ allocated), and the CUDA context and libraries live outside it.",
        "".join(parts),
    )


def _device_bar(rec: Reconciliation, figures: dict[str, Any], chart_id: str) -> str:
    if not rec.total_bytes:
        return ""
    go = _go()
    pieces = [
        ("this process", rec.device_used_bytes, "#2563eb"),
        ("other processes", rec.other_processes_bytes, "#f97316"),
        ("driver reserved", rec.driver_reserved_bytes, "#64748b"),
        ("unattributed", rec.unaccounted_bytes, "#a8a29e"),
        ("free", rec.free_bytes, "#e2e8f0"),
    ]
    pieces = [p for p in pieces if p[1]]
    if not pieces:
        return ""
    unit, scale = unit_for(rec.total_bytes)
    fig = go.Figure()
    for name, value, color in pieces:
        fig.add_trace(
            go.Bar(
                y=["device"],
                x=[round(value / scale, 4)],
                name=f"{name} {b(value)}",
                orientation="h",
                marker={"color": color},
                hovertemplate=f"{name}: {b(value)} ({_pct(value, rec.total_bytes)})<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=130,
        # the margins plotly would grow to hold the legend and the axis: set, they save it a
        # second layout pass
        margin={"l": 60, "r": 20, "t": 28, "b": 38},
        xaxis={
            "range": [0, rec.total_bytes / scale],
            "title": {"text": f"{unit} of {b(rec.total_bytes)}"},
            "automargin": False,
        },
        yaxis={"visible": False},
        legend={"orientation": "h", "y": 1.35, "x": 0, "traceorder": "normal"},
    )
    figures[chart_id] = figure_dict(fig)
    return '<p class="note">The whole device at that moment:</p>' + chart_div(chart_id, 130)


# ---- modules ----------------------------------------------------------------------------
def _bytes_of(module: dict[str, Any], field: str) -> int | None:
    value = module.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


def module_tree(modules: Sequence[dict[str, Any]], field: str | None = None) -> dict[str, Any]:
    """Treemap arrays for one byte field, or for the sum of the kept ones when ``field`` is None.

    Module names are dotted paths ("" is the model); missing parents are added. When most
    parents hold at least the sum of their children, sizes are read as inclusive (plotly's
    "total") and a parent below its children is drawn as their sum; otherwise as each
    module's own bytes ("remainder"). ``recorded`` keeps each module's own number for
    labels, whatever its box is drawn as.
    """
    fields = list(MODULE_KEPT_FIELDS) if field is None else [field]

    def value_of(module: dict[str, Any]) -> int:
        return sum(max(0, _bytes_of(module, f) or 0) for f in fields)

    root = "(model)"
    values: dict[str, int] = {root: 0}
    parents: dict[str, str] = {}
    for module in modules:
        key = str(module.get("name") or "") or root
        values[key] = values.get(key, 0) + value_of(module)
    explicit = set(values)
    for key in list(values):
        node = key
        while node != root:
            parent = node.rsplit(".", 1)[0] if "." in node else root
            parents[node] = parent
            if parent in values:
                break  # its own chain is handled where it is visited
            values[parent] = 0
            node = parent
    recorded = dict(values)
    children: dict[str, list[str]] = {}
    for node, parent in parents.items():
        children.setdefault(parent, []).append(node)
    checked = [n for n in children if n in explicit and values[n] > 0]
    holds = [n for n in checked if values[n] >= sum(values[c] for c in children[n])]
    inclusive = bool(checked) and len(holds) >= 0.5 * len(checked)
    if inclusive:

        def fill(node: str) -> int:  # bottom-up, so plotly's "total" mode holds everywhere
            total = sum(fill(c) for c in children.get(node, []))
            values[node] = max(values[node], total)
            if node not in explicit:
                recorded[node] = values[node]
            return values[node]

        fill(root)
    ids = list(values)
    return {
        "ids": ids,
        "labels": [n.rsplit(".", 1)[-1] if n != root else root for n in ids],
        "parents": [parents.get(n, "") for n in ids],
        "values": [values[n] for n in ids],
        "recorded": [recorded[n] for n in ids],
        "branchvalues": "total" if inclusive else "remainder",
    }


def _modules_section(report: Report, figures: dict[str, Any]) -> str:
    modules = [m for m in report.modules if isinstance(m, dict)]
    if not modules:
        return ""
    go = _go()

    def present(field: str) -> bool:
        return any(_bytes_of(m, field) is not None for m in modules)

    metrics: list[tuple[str | None, str]] = []
    if present("peak_bytes"):
        metrics.append(("peak_bytes", "at the peak"))
    kept = [(f, label) for f, label in MODULE_FIELDS if f in MODULE_KEPT_FIELDS and present(f)]
    if len(kept) > 1:
        metrics.append((None, "all kept bytes"))
    metrics += kept
    trees = [(label, module_tree(modules, f)) for f, label in metrics]
    chart = ""
    if trees and any(trees[0][1]["values"]):
        first = trees[0][1]
        fig = go.Figure(
            go.Treemap(
                ids=[chart_text(i) for i in first["ids"]],
                labels=[chart_text(x) for x in first["labels"]],
                parents=[chart_text(p) for p in first["parents"]],
                values=first["values"],
                branchvalues=first["branchvalues"],
                customdata=[b(v) for v in first["recorded"]],
                texttemplate="%{label}<br>%{customdata}",
                hovertemplate="%{id}<br>%{customdata}<extra></extra>",
                maxdepth=3,
                marker={"colorscale": "Blues", "line": {"width": 1, "color": "#fff"}},
                pathbar={"visible": True},
            )
        )
        buttons = [
            {
                "label": label,
                "method": "restyle",
                "args": [
                    {
                        "values": [tree["values"]],
                        "customdata": [[b(v) for v in tree["recorded"]]],
                        "branchvalues": tree["branchvalues"],
                    }
                ],
            }
            for label, tree in trees
        ]
        menu = {"buttons": buttons, "direction": "down", "x": 0, "y": 1.1, "xanchor": "left"}
        fig.update_layout(
            height=540,
            margin={"l": 8, "r": 8, "t": 48, "b": 8},
            updatemenus=[menu] if len(buttons) > 1 else [],
        )
        figures["chart-modules"] = figure_dict(fig)
        chart = chart_div("chart-modules", 540)
    columns = [(f, label) for f, label in MODULE_FIELDS if present(f)]
    show_class = any(isinstance(m.get("class"), str) for m in modules)
    share = any(isinstance(m.get("share_of_peak"), (int, float)) for m in modules)

    def size(m: dict[str, Any]) -> int:
        if present("peak_bytes"):
            return _bytes_of(m, "peak_bytes") or 0
        return sum(max(0, _bytes_of(m, f) or 0) for f in MODULE_KEPT_FIELDS)

    top = sorted(modules, key=size, reverse=True)[:MAX_MODULE_ROWS]
    rows = []
    for m in top:
        row = [str(m.get("name") or "(model)")]
        if show_class:
            row.append(str(m.get("class") or ""))
        if share:
            v = m.get("share_of_peak")
            row.append(f"{100 * v:.1f}%" if isinstance(v, (int, float)) else "")
        row += [b(_bytes_of(m, f)) if _bytes_of(m, f) is not None else "" for f, _ in columns]
        rows.append(row)
    headers = (
        ["module"]
        + (["class"] if show_class else [])
        + (["share of peak"] if share else [])
        + [label for _, label in columns]
    )
    table_html = table(headers, rows, left=2 if show_class else 1)
    more = (
        f'<p class="note">{len(modules) - len(top)} more modules are in the treemap and the '
        "JSON.</p>"
        if len(modules) > len(top)
        else ""
    )
    notes = report.extra.get("attribution_notes")
    if isinstance(notes, list) and notes:
        more += "".join(f'<p class="note">{esc(n)}</p>' for n in notes if isinstance(n, str))
    return section(
        "modules",
        "Modules",
        "Memory by module: click a box to drill down, pick a kind of memory in the menu. "
        "Temporaries are peaks at different moments, so they are listed but not added up.",
        chart + f"<h3>Largest modules</h3>{table_html}{more}",
    )


# ---- phases, steps, epochs --------------------------------------------------------------
def _phases_section(report: Report, figures: dict[str, Any]) -> str:
    if not report.phases:
        return ""
    go = _go()
    phases = sorted(report.phases, key=lambda p: _phase_order(p.name))
    with_peaks = [p for p in phases if p.peak_allocated_bytes is not None]
    chart = ""
    if with_peaks:
        top = max((p.peak_reserved_bytes or p.peak_allocated_bytes or 0) for p in with_peaks)
        unit, scale = unit_for(top)
        fig = go.Figure()
        for field, name, color in (
            ("peak_allocated_bytes", "peak allocated", SERIES_COLORS["allocated"]),
            ("peak_reserved_bytes", "peak reserved", SERIES_COLORS["reserved"]),
        ):
            vals = [getattr(p, field) for p in with_peaks]
            if _max(vals) is None:
                continue
            fig.add_trace(
                go.Bar(
                    x=[chart_text(p.name.replace("_", " ")) for p in with_peaks],
                    y=_scaled(vals, scale),
                    name=name,
                    marker={"color": color},
                    text=[b(v) for v in vals],
                    textposition="none",
                    hovertemplate="%{x}: %{text}<extra>" + name + "</extra>",
                )
            )
        fig.update_layout(
            height=300,
            barmode="group",
            yaxis={"title": {"text": unit}},
            legend={"orientation": "h", "y": 1.12},
            margin={"l": 60, "r": 20, "t": 40, "b": 40},  # t: what the legend pushes it to
        )
        figures["chart-phases"] = figure_dict(fig)
        chart = chart_div("chart-phases", 300)
    rows = [
        [
            p.name.replace("_", " "),
            b(p.peak_allocated_bytes),
            b(p.peak_reserved_bytes),
            b(p.start_allocated_bytes),
            b(p.end_allocated_bytes),
            str(p.step) if p.step is not None else "",
            f"{p.count:,}",
            _ms(p.duration_s),
        ]
        for p in phases
    ]
    peak_rows = [
        "hl" if report.peak.phase == p.name and p.step == report.peak.step else "" for p in phases
    ]
    tbl = table(
        [
            "phase",
            "peak allocated",
            "peak reserved",
            "allocated at start",
            "allocated at end",
            "at step",
            "count",
            "time",
        ],
        rows,
        row_classes=peak_rows,
    )
    body = chart + tbl
    return section(
        "phases",
        "Phases",
        "The highest peak each phase reached over the run, and the step where it happened.",
        body,
    )


def pick_step_rows(
    steps: Sequence[StepStats], head: int = STEP_ROWS_HEAD, tail: int = STEP_ROWS_TAIL
) -> list[StepStats | None]:
    """The first and last steps and the peak step; ``None`` marks each elision."""
    if len(steps) <= head + tail + 1:
        return list(steps)
    keep = {id(s) for s in steps[:head]} | {id(s) for s in steps[-tail:]}
    with_peak = [s for s in steps if s.peak_allocated_bytes is not None]
    if with_peak:
        keep.add(id(max(with_peak, key=lambda s: s.peak_allocated_bytes or 0)))
    with_rss = [s for s in steps if s.host_rss_bytes is not None]
    if with_rss:
        keep.add(id(max(with_rss, key=lambda s: s.host_rss_bytes or 0)))
    rows: list[StepStats | None] = []
    skipped = False
    for s in steps:
        if id(s) in keep:
            if skipped:
                rows.append(None)
            rows.append(s)
            skipped = False
        else:
            skipped = True
    return rows


def _phase_peak(step: StepStats, name: str) -> int | None:
    values = [p.peak_allocated_bytes for p in step.phases if p.name == name]
    return _max(values)  # type: ignore[return-value]


def _steps_section(report: Report, figures: dict[str, Any]) -> str:
    steps = report.steps
    if not steps:
        return ""
    go = _go()
    gpu = any(s.peak_allocated_bytes is not None for s in steps)
    series = (
        [
            ("peak_allocated_bytes", "peak allocated", SERIES_COLORS["allocated"], "solid"),
            ("peak_reserved_bytes", "peak reserved", SERIES_COLORS["reserved"], "solid"),
            ("end_allocated_bytes", "allocated at step end", "#0ea5e9", "dot"),
        ]
        if gpu
        else [("host_rss_bytes", "host RSS", SERIES_COLORS["host_rss"], "solid")]
    )
    top = max((_max([getattr(s, f) for s in steps]) or 0) for f, *_ in series)
    unit, scale = unit_for(top)
    fig = go.Figure()
    index = [s.index for s in steps]
    for field, name, color, dash in series:
        xs, ys = downsample_minmax(index, [getattr(s, field) for s in steps])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=_scaled(ys, scale),
                name=name,
                mode="lines+markers" if len(xs) <= 200 else "lines",
                line={"color": color, "dash": dash, "width": 1.8},
                marker={"size": 5},
                hovertemplate=f"%{{y:.2f}} {unit}",
            )
        )
    fig.update_layout(
        height=300,
        hovermode="x unified",
        xaxis={"title": {"text": "step"}, "automargin": False},  # numbers: the margins hold them
        yaxis={"title": {"text": unit}, "rangemode": "tozero", "automargin": False},
        legend={"orientation": "h", "y": 1.14},
        margin={"l": 60, "r": 20, "t": 42, "b": 40},  # t: what the legend pushes it to
    )
    figures["chart-steps"] = figure_dict(fig)
    epochs = len({s.epoch for s in steps}) > 1
    modes = len({s.mode for s in steps}) > 1
    headers = ["step"] + (["epoch"] if epochs else []) + (["mode"] if modes else [])
    if gpu:
        headers += ["peak allocated", "peak reserved", "allocated at end", "change in step"]
        headers += ["forward peak", "backward peak", "optimizer peak"]
    headers += ["host RSS", "time"]
    rows: list[list[str] | None] = []
    classes: list[str] = []
    for s in pick_step_rows(steps):
        if s is None:
            rows.append(None)
            classes.append("")
            continue
        row = [str(s.index)] + ([str(s.epoch)] if epochs else []) + ([s.mode] if modes else [])
        if gpu:
            change = ""
            if s.end_allocated_bytes is not None and s.start_allocated_bytes is not None:
                grew = s.end_allocated_bytes - s.start_allocated_bytes
                change = b(grew, signed=True) if grew else "0 B"
            row += [
                b(s.peak_allocated_bytes),
                b(s.peak_reserved_bytes),
                b(s.end_allocated_bytes),
                change,
            ]
            row += [
                b(v) if v is not None else ""
                for v in (_phase_peak(s, n) for n in ("forward", "backward", "optimizer"))
            ]
        row += [b(s.host_rss_bytes), _ms(s.duration_s)]
        rows.append(row)
        classes.append("hl" if report.peak.step == s.index and gpu else "")
    summary = ""
    if len(steps) > STEP_ROWS_HEAD + STEP_ROWS_TAIL + 1:
        shown = sum(1 for r in rows if r is not None)
        durations = sorted(s.duration_s for s in steps)
        summary = (
            f'<p class="note">{len(steps):,} steps; {shown} shown (the first, the last and the '
            f"peak). Median step time {_ms(durations[len(durations) // 2])}; all steps are "
            "in the JSON and the --csv export.</p>"
        )
    return section(
        "steps",
        "Steps",
        "Peak and end-of-step memory for every step; a rising end-of-step line means "
        "something keeps tensors alive between steps.",
        chart_div("chart-steps", 300) + table(headers, rows, left=1, row_classes=classes) + summary,
    )


def _epochs_section(report: Report) -> str:
    if len(report.epochs) < 2:
        return ""
    rows = [
        [
            str(e.index),
            f"{e.steps:,}",
            b(e.peak_allocated_bytes),
            b(e.peak_reserved_bytes),
            b(e.end_allocated_bytes),
            b(e.host_rss_bytes),
            _ms(e.duration_s),
        ]
        for e in report.epochs
    ]
    return section(
        "epochs",
        "Epochs",
        "",
        table(
            [
                "epoch",
                "steps",
                "peak allocated",
                "peak reserved",
                "allocated at end",
                "host RSS",
                "time",
            ],
            rows,
        ),
    )


# ---- findings, startup, OOM, unavailable ------------------------------------------------
def findings_html(report: Report) -> str:
    if not report.findings:
        return ""
    order = {"error": 0, "warning": 1, "info": 2}
    items = sorted(report.findings, key=lambda f: order.get(f.severity, 3))
    cards = "".join(
        f'<div class="finding {esc(f.severity if f.severity in order else "info")}">'
        f'<span class="sev">{esc(f.severity)}</span>{esc(f.message)}</div>'
        for f in items
    )
    return section("findings", "Findings", "What vramscope noticed, in plain words.", cards)


def _startup_section(report: Report) -> str:
    s = report.startup
    items = [
        ("allocated before the first step", s.after_build_allocated_bytes),
        ("reserved before the first step", s.after_build_reserved_bytes),
        ("CUDA context and libraries", s.context_and_libraries_bytes),
        ("host RSS before the first step", s.host_rss_bytes),
    ]
    items = [(k, v) for k, v in items if v is not None]
    if not items:
        return ""
    return section(
        "startup",
        "Startup",
        "What exists before the first step: the CUDA context, the model and the optimizer.",
        kv_list([(k, b(v)) for k, v in items]),
    )


def _oom_section(report: Report) -> str:
    oom = report.oom
    if oom is None:
        return ""
    items = [
        ("phase", oom.phase),
        ("step", oom.step),
        ("module", oom.module),
        ("requested", b(oom.requested_bytes) if oom.requested_bytes is not None else None),
        ("allocated", b(oom.allocated_bytes) if oom.allocated_bytes is not None else None),
        ("reserved", b(oom.reserved_bytes) if oom.reserved_bytes is not None else None),
        (
            "stuck in fragments",
            b(oom.fragmentation_bytes) if oom.fragmentation_bytes is not None else None,
        ),
        ("free on the device", b(oom.free_bytes) if oom.free_bytes is not None else None),
        ("device total", b(oom.total_bytes) if oom.total_bytes is not None else None),
        (
            "other processes",
            b(oom.other_processes_bytes) if oom.other_processes_bytes is not None else None,
        ),
        (
            "largest free block",
            b(oom.largest_free_block_bytes) if oom.largest_free_block_bytes is not None else None,
        ),
    ]
    body = kv_list([(k, str(v)) for k, v in items if v is not None])
    if oom.message:
        body = f'<div class="finding error"><code>{esc(oom.message)}</code></div>' + body
    if oom.largest_blocks:
        keys = sorted({k for blk in oom.largest_blocks if isinstance(blk, dict) for k in blk})
        rows = [
            [
                b(blk[k])
                if k.endswith("bytes") and isinstance(blk.get(k), int)
                else str(blk.get(k, ""))
                for k in keys
            ]
            for blk in oom.largest_blocks[:20]
            if isinstance(blk, dict)
        ]
        body += "<h3>Largest blocks</h3>" + table(keys, rows)
    return section(
        "oom", "Out of memory", "Where the run ran out of memory, and what filled it.", body
    )


def _unavailable_html(report: Report) -> str:
    if not report.unavailable:
        return ""
    items = "".join(
        f"<li><code>{esc(k)}</code>: {esc(v)}</li>" for k, v in sorted(report.unavailable.items())
    )
    return (
        '<details class="note" style="margin:8px 2px"><summary>Not measured in this run '
        f"({len(report.unavailable)})</summary><ul>{items}</ul></details>"
    )


# ---- estimates, validation, fit ---------------------------------------------------------
def _verdict_section(report: Report) -> str:
    verdict = report.extra.get("verdict")
    if verdict is None:
        return ""
    if not isinstance(verdict, dict):
        return section("verdict", "Verdict", "", f'<div class="verdict">{esc(verdict)}</div>')
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
                message += f" ({_pct(abs(headroom), budget)} of {b(budget)})"
    cls = "fits" if fits is True else "nofit" if fits is False else ""
    details = [
        (
            str(k).replace("_", " "),
            b(v) if str(k).endswith("bytes") and isinstance(v, (int, float)) else str(v),
        )
        for k, v in verdict.items()
        if k not in ("message", "text", "fits", "headroom_bytes", "gpu", "budget_bytes")
        and isinstance(v, (str, int, float, bool))
    ]
    return section(
        "verdict",
        "Verdict",
        "Predicted without running on the target device.",
        f'<div class="verdict {cls}">{esc(message)}</div>' + (kv_list(details) if details else ""),
    )


def _validation_section(report: Report, figures: dict[str, Any]) -> str:
    validation = report.extra.get("validation")
    if not isinstance(validation, dict):
        return ""
    est, meas = validation.get("estimated"), validation.get("measured")
    if isinstance(est, dict) and isinstance(meas, dict):
        if isinstance(est.get("peak"), dict) and isinstance(meas.get("peak"), dict):
            est, meas = est["peak"], meas["peak"]
        keys = [
            k
            for k in est
            if isinstance(est.get(k), (int, float)) and isinstance(meas.get(k), (int, float))
        ]
        if keys:
            go = _go()
            rows = []
            for k in keys:
                e, m = est[k], meas[k]
                err = f"{100 * (e - m) / m:+.1f}%" if m else ""
                rows.append(
                    [
                        k.replace("_bytes", "").replace("_", " "),
                        b(e),
                        b(m),
                        b(e - m, signed=True),
                        err,
                    ]
                )
            top = max(max(est[k], meas[k]) for k in keys)
            unit, scale = unit_for(top)
            labels = [k.replace("_bytes", "").replace("_", " ") for k in keys]
            fig = go.Figure(
                [
                    go.Bar(
                        x=labels,
                        y=[round(est[k] / scale, 4) for k in keys],
                        name="estimated",
                        marker={"color": "#94a3b8"},
                    ),
                    go.Bar(
                        x=labels,
                        y=[round(meas[k] / scale, 4) for k in keys],
                        name="measured",
                        marker={"color": "#2563eb"},
                    ),
                ]
            )
            fig.update_layout(
                height=300,
                barmode="group",
                yaxis={"title": {"text": unit}},
                legend={"orientation": "h", "y": 1.12},
            )
            figures["chart-validation"] = figure_dict(fig)
            body = (
                f'<div class="grid2"><div>{chart_div("chart-validation", 300)}</div><div>'
                + table(["", "estimated", "measured", "difference", "error"], rows)
                + "</div></div>"
            )
            return section(
                "validation",
                "Estimated against measured",
                "The estimate checked against a real run.",
                body,
            )
    items = [
        (str(k), str(v)) for k, v in validation.items() if isinstance(v, (str, int, float, bool))
    ]
    if not items:
        return ""
    return section("validation", "Estimated against measured", "", kv_list(items))


def _fit_section(report: Report, figures: dict[str, Any]) -> str:
    fit = report.extra.get("fit")
    if not isinstance(fit, dict):
        return ""
    go = _go()
    parts = []
    budget = fit.get("budget_bytes") or report.device.get("total_bytes")
    if fit.get("max_batch_size") is not None:
        text = f"Largest batch that fits: {fit['max_batch_size']}"
        if budget:
            text += f" (budget {b(budget)})"
        parts.append(f'<div class="verdict fits">{esc(text)}</div>')
    strategies = [s for s in fit.get("strategies") or [] if isinstance(s, dict)]
    if strategies:
        fields = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
        base = (strategies[0].get("peak") or {}).get("allocated_bytes")
        per_strategy_batch = any(s.get("max_batch_size") is not None for s in strategies)
        rows = []
        for s in strategies:
            peak = s.get("peak") or {}
            alloc = peak.get("allocated_bytes")
            vs = (
                f"{100 * (alloc - base) / base:+.0f}%"
                if isinstance(alloc, (int, float))
                and isinstance(base, (int, float))
                and base
                and s is not strategies[0]
                else ""
            )
            row = [str(s.get("name", "?"))]
            row += [b(peak.get(f)) if isinstance(peak.get(f), (int, float)) else "" for f in fields]
            row.append(vs)
            if per_strategy_batch:
                batch = s.get("max_batch_size")
                row.append("" if batch is None else str(batch))
            rows.append(row)
        top = max([(s.get("peak") or {}).get(f) or 0 for s in strategies for f in fields] + [0])
        unit, scale = unit_for(top)
        fig = go.Figure()
        for f, name in zip(fields, ("allocated", "reserved", "device used"), strict=True):
            vals = [(s.get("peak") or {}).get(f) for s in strategies]
            if _max(vals) is None:
                continue
            fig.add_trace(
                go.Bar(
                    y=[chart_text(s.get("name", "?")) for s in strategies],
                    x=_scaled(vals, scale),
                    name=name,
                    orientation="h",
                    marker={"color": SERIES_COLORS[f.replace("_bytes", "")]},
                )
            )
        fig.update_layout(
            height=120 + 50 * len(strategies),
            barmode="group",
            xaxis={"title": {"text": unit}},
            yaxis={"autorange": "reversed"},
            legend={"orientation": "h", "y": 1.0, "yanchor": "bottom"},
            margin={"l": 64, "r": 24, "t": 48, "b": 48},
        )
        if budget:
            fig.add_vline(x=budget / scale, line={"color": "#dc2626", "dash": "dash"})
        figures["chart-strategies"] = figure_dict(fig)
        parts.append(
            chart_div("chart-strategies", 120 + 50 * len(strategies))
            + table(
                ["strategy", "peak allocated", "peak reserved", "device used", "vs first"]
                + (["largest batch"] if per_strategy_batch else []),
                rows,
            )
        )
    curve = [
        c for c in fit.get("curve") or [] if isinstance(c, dict) and c.get("batch_size") is not None
    ]
    if curve:
        curve.sort(key=lambda c: c["batch_size"])
        fields = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
        top = max(
            [(c.get("peak") or {}).get(f) or 0 for c in curve for f in fields] + [budget or 0]
        )
        unit, scale = unit_for(top)
        fig = go.Figure()
        for f, name in zip(fields, ("allocated", "reserved", "device used"), strict=True):
            vals = [(c.get("peak") or {}).get(f) for c in curve]
            if _max(vals) is None:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[c["batch_size"] for c in curve],
                    y=_scaled(vals, scale),
                    name=name,
                    mode="lines+markers",
                    line={"color": SERIES_COLORS[f.replace("_bytes", "")]},
                )
            )
        if budget:
            fig.add_hline(
                y=budget / scale,
                line={"color": "#dc2626", "dash": "dash"},
                annotation_text=f"budget {b(budget)}",
            )
        fig.update_layout(
            height=340,
            hovermode="x unified",
            xaxis={"title": {"text": "batch size"}},
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": 1.12},
        )
        figures["chart-fit-curve"] = figure_dict(fig)
        parts.append("<h3>Memory against batch size</h3>" + chart_div("chart-fit-curve", 340))
    if not parts:
        return ""
    return section(
        "fit",
        "What fits",
        "Batch sizes and memory-saving strategies side by side.",
        "".join(parts),
    )


# ---- the report -------------------------------------------------------------------------
def render(report: Report, compress_plotlyjs: bool = True) -> str:
    """The whole report as one self-contained HTML page."""
    figures: dict[str, Any] = {}
    body: list[str] = []
    nav: list[tuple[str, str]] = []

    def add(html_part: str, anchor: str, label: str) -> None:
        if html_part:
            body.append(html_part)
            nav.append((anchor, label))

    body.append(f'<p class="peakline">{esc(explain_peak(report))}</p>')
    body.append(_unavailable_html(report))
    add(_oom_section(report), "oom", "Out of memory")
    add(_verdict_section(report), "verdict", "Verdict")
    add(findings_html(report), "findings", "Findings")
    timeline, note = _timeline_figure(report)
    if timeline is not None:
        figures["chart-timeline"] = timeline
        height = timeline["layout"].get("height", 460)
        add(
            section(
                "timeline",
                "Timeline",
                "Memory over the whole run. Shaded bands are phases, dotted lines step "
                "boundaries; drag to zoom, double-click to reset, click a legend entry to hide "
                "or show it.",
                chart_div("chart-timeline", height)
                + (f'<p class="note">{esc(note)}</p>' if note else ""),
            ),
            "timeline",
            "Timeline",
        )
    add(_fit_section(report, figures), "fit", "What fits")
    add(_validation_section(report, figures), "validation", "Validation")
    add(_categories_section(report, figures), "categories", "Peak breakdown")
    add(_reconciliation_section(report, figures), "reconciliation", "nvidia-smi")
    add(_modules_section(report, figures), "modules", "Modules")
    add(_phases_section(report, figures), "phases", "Phases")
    add(_steps_section(report, figures), "steps", "Steps")
    add(_epochs_section(report), "epochs", "Epochs")
    add(_startup_section(report), "startup", "Startup")
    footer = (
        f"Generated by vramscope {esc(report.vramscope_version or '')} · report schema "
        f"{esc(report.schema)} · sizes in binary units (1 KiB = 1024 B, 1 MiB = 1024 KiB, "
        "1 GiB = 1024 MiB) · charts by plotly.js, embedded: this file needs no network."
    )
    return page(
        f"vramscope · {workload_title(report)}",
        _header(report, _kpis(report)),
        "\n".join(body),
        figures,
        nav=nav,
        footer_html=footer,
        compress_plotlyjs=compress_plotlyjs,
    )


def write(report: Report, path: str | Path) -> Path:
    """Write the HTML report to ``path``."""
    target = Path(path)
    target.write_text(render(report), encoding="utf-8")
    return target
