"""Memory by module: a treemap with a menu per kind of memory, and the largest modules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vramscope.report.html import charts
from vramscope.report.html.blocks import Chart, Section, table
from vramscope.report.html.charts import chart_text, figure_dict
from vramscope.report.model import MODULE_KEPT_FIELDS, Report
from vramscope.units import format_bytes as b

MAX_MODULE_ROWS = 20
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


def section(report: Report, figures: dict[str, Any]) -> Section | None:
    """The treemap (first kind of memory shown, the others in its menu) and the largest modules."""
    modules = [m for m in report.modules if isinstance(m, dict)]
    if not modules:
        return None
    go = charts.go()

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
    chart = None
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
        chart = Chart("chart-modules", 540)
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
        row = [str(m.get("name") or m.get("label") or "(model)")]
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
    notes = []
    if len(modules) > len(top):
        notes.append(f"{len(modules) - len(top)} more modules are in the treemap and the JSON.")
    attribution_notes = report.extra.get("attribution_notes")
    if isinstance(attribution_notes, list) and attribution_notes:
        notes += [n for n in attribution_notes if isinstance(n, str)]
    return Section(
        "modules.html",
        "modules",
        "Modules",
        "Modules",
        "Memory by module: click a box to drill down, pick a kind of memory in the menu. "
        "Temporaries are peaks at different moments, so they are listed but not added up.",
        {
            "chart": chart,
            "table": table(headers, rows, left=2 if show_class else 1),
            "notes": notes,
        },
    )
