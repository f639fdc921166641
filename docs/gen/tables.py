"""Markdown tables for the docs, made from the committed benchmark results and the report
schema: every number in them is read from ``benchmarks/results/*.json`` or
``src/vramscope/schema/report.schema.json``, none is typed by hand.

Each table is a function ``(root) -> str`` registered in ``TABLES`` under the name a page
uses in its marker: ``<!-- generated: table NAME -->`` … ``<!-- end generated -->``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path("benchmarks") / "results"
SCHEMA = Path("src") / "vramscope" / "schema" / "report.schema.json"

TABLES: dict[str, Callable[[Path], str]] = {}


def table(name: str) -> Callable[[Callable[[Path], str]], Callable[[Path], str]]:
    def register(fn: Callable[[Path], str]) -> Callable[[Path], str]:
        TABLES[name] = fn
        return fn

    return register


def load(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / RESULTS / name).read_text(encoding="utf-8"))


def markdown(header: list[str], rows: list[list[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter per column (l, r), default left then right."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def block(*parts: str) -> str:
    """A table and the notes under it, as paragraphs."""
    return "\n\n".join(parts)


def pct(value: float | None, signed: bool = True, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f} %" if signed else f"{value:.{digits}f} %"


def gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


def measured_on(meta: dict[str, Any]) -> str:
    """One line naming where and when a result was measured."""
    bits = [meta.get("gpu") or meta.get("machine") or meta.get("cpu") or ""]
    if meta.get("driver"):
        bits.append(f"driver {meta['driver']}")
    if meta.get("torch"):
        bits.append(f"torch {meta['torch']}")
    dates = meta.get("dates") or []
    if len(dates) > 1:  # joined from several runs
        bits.append(f"{dates[0]} to {dates[-1]}")
    elif meta.get("date"):
        bits.append(meta["date"])
    return ", ".join(b for b in bits if b)


# the three peaks an accuracy table compares, as its rows name them
PEAK_NAMES = {
    "allocated": "peak allocated",
    "reserved": "peak reserved",
    "device_used": "device used",
}


def source(name: str) -> str:
    return f"<small>From `{RESULTS / name}`.</small>"


# --------------------------------------------------------------------------- the estimator


@table("accuracy-summary")
def accuracy_summary(root: Path) -> str:
    data = load(root, "accuracy_h200.json")
    summary, meta = data["summary"], data["meta"]
    rows = []
    for key, label in PEAK_NAMES.items():
        col = summary["columns"][key]
        rows.append(
            [
                label,
                pct(col["median_abs_error_pct"], signed=False),
                pct(col["p90_abs_error_pct"], signed=False),
                pct(col["max_abs_error_pct"], signed=False),
                f"{col['target']}: {'met' if col['met'] else 'missed'}",
            ]
        )
    under = summary["reserved_under_5pct"]["cases"]
    measured = meta["measured"]
    on = meta["estimated_on"]
    return block(
        markdown(["", "median \\|error\\|", "90th percentile", "worst", "target"], rows),
        f"{summary['estimated']} of {summary['cases']} workloads estimated on a "
        f"{on['cpus']}-core {on['cpu']} CPU (torch {on['torch']}) against "
        f"`vramscope measure --steps 3` on an {measured_on(measured)}. "
        f"Reserved under-predicted by more than 5 %: "
        f"{', '.join(under) if under else 'in no workload'}. Estimate time: median "
        f"{summary['seconds']['median']:.1f} s, worst {summary['seconds']['max']:.1f} s.",
        source("accuracy_h200.json"),
    )


@table("accuracy-cases")
def accuracy_cases(root: Path) -> str:
    data = load(root, "accuracy_h200.json")
    measured = {c["name"]: c for c in load(root, "accuracy_measured_h200.json")["cases"]}
    rows = []
    for case in data["cases"]:
        workload = (measured.get(case["name"]) or {}).get("workload") or {}
        err = case.get("error_pct") or {}
        setting = workload.get("precision", "")
        if (workload.get("accumulate") or 1) > 1:
            setting += f", accumulate {workload['accumulate']}"
        if workload.get("allocator_config"):
            setting += f", {workload['allocator_config']}"
        rows.append(
            [
                f"`{case['spec']}`",
                workload.get("batch_size", ""),
                setting,
                gib(case["measured"]["allocated_bytes"]),
                pct(err.get("allocated")),
                pct(err.get("reserved")),
                pct(err.get("device_used")),
            ]
        )
    header = [
        "workload",
        "batch",
        "precision",
        "measured allocated",
        "allocated",
        "reserved",
        "device used",
    ]
    return block(
        markdown(header, rows, "lrlrrrr"),
        "Errors are (estimate − measured) / measured: negative is an under-estimate.",
        source("accuracy_h200.json") + " " + source("accuracy_measured_h200.json"),
    )


@table("accuracy-worst")
def accuracy_worst(root: Path) -> str:
    """The workloads whose estimate is off by 1 % or more on any peak, worst first."""
    data = load(root, "accuracy_h200.json")
    off = []
    for case in data["cases"]:
        err = case.get("error_pct") or {}
        worst = max((abs(v) for v in err.values() if v is not None), default=0.0)
        if worst >= 1.0:
            off.append((worst, case))
    if not off:
        return "No workload is off by 1 % or more on any peak. " + source("accuracy_h200.json")
    rows = []
    for _, case in sorted(off, key=lambda item: -item[0]):
        err = case["error_pct"]
        rows.append(
            [
                case["name"],
                pct(err.get("allocated")),
                pct(err.get("reserved")),
                pct(err.get("device_used")),
            ]
        )
    return block(
        markdown(["workload", "allocated", "reserved", "device used"], rows),
        f"The {len(off)} of {len(data['cases'])} workloads off by 1 % or more on some peak. "
        + source("accuracy_h200.json"),
    )


@table("zoo-summary")
def zoo_summary(root: Path) -> str:
    data = load(root, "zoo_accuracy_h200.json")
    summary, meta = data["summary"], data["meta"]
    libraries = [
        [name, lib["ran"], lib["estimated"], pct(lib["coverage_pct"], signed=False, digits=1)]
        for name, lib in summary["libraries"].items()
    ]
    libraries.append(
        [
            "**all**",
            summary["ran_a_real_step"],
            summary["estimated"],
            f"{pct(summary['coverage_pct'], signed=False)} (target {summary['coverage_target']})",
        ]
    )
    columns = []
    for key, label in PEAK_NAMES.items():
        col = summary["columns"].get(key)
        if col is None:
            continue
        columns.append(
            [
                label,
                pct(col["median_abs_error_pct"], signed=False),
                pct(col["p90_abs_error_pct"], signed=False),
                pct(col["p95_abs_error_pct"], signed=False),
                f"{col['target']}: {'met' if col['met'] else 'missed'}",
            ]
        )
    under = summary["allocated_under_3pct"]["models"]
    used = summary["device_used_under"]
    seconds = sorted(r["estimate_seconds"] for r in data["rows"] if r.get("estimate_seconds"))
    parts = (meta["estimated"].get("reestimated") or {}).get("parts")
    if parts:  # estimated again in parts: the latest ones, enough to cover every row
        latest: list[dict] = []
        for part in reversed(parts):
            latest.insert(0, part)
            if sum(p["workloads"] for p in latest) >= len(data["rows"]):
                break
        where = "last in parts: " + "; ".join(
            f"{p['workloads']} on {p['cpus']} CPUs with torch {p['libraries']['torch']}"
            + (f" ({p['date']})" if p.get("date") else "")
            for p in latest
        )
    else:
        where = (
            f"on a {meta['estimated']['estimated_on']['cpus']}-core CPU with torch "
            f"{meta['estimated']['libraries']['torch']}"
        )
    bound = ""
    if used.get("point_under_models") is not None:
        bound = (
            f" by its upper bound; the point estimate: {used['point_under_models']} "
            f"({used['point_under_share_pct']} %)"
        )
    notes = [
        f"{summary['compared']} models compared with a measurement (estimated {where}; "
        f"measured on an {measured_on(meta['measured'])}). Allocated under-estimated by more "
        f"than 3 %: {len(under)}. Device used under-estimated{bound}: {used['models']} models "
        f"({used['share_pct']} %; target {used['target']}).",
    ]
    ranged = summary.get("data_dependent")
    if ranged:
        notes.append(
            f"Estimated as a range (values assumed both ways, judged apart): "
            f"{ranged['models']} models, {ranged['allocated_within_range_3pct']} of which hold "
            f"the measured allocated peak within 3 %."
        )
    if seconds:
        median = seconds[len(seconds) // 2]
        notes.append(
            f"Estimate time on the sweep: median {median:.1f} s, worst {seconds[-1]:.1f} s "
            f"({'machines as above, several estimates at a time' if parts else '2 estimates at a time on 2 cores'}, which were also running other work: "
            f"`benchmarks/estimate_speed.py` gives the times of one estimate alone)."
        )
    return block(
        markdown(["library", "ran a real step", "estimated", "coverage"], libraries),
        markdown(["", "median \\|error\\|", "p90", "p95", "target"], columns),
        *notes,
        source("zoo_accuracy_h200.json"),
    )


@table("zoo-worst")
def zoo_worst(root: Path) -> str:
    data = load(root, "zoo_accuracy_h200.json")
    rows = [r for r in data["rows"] if r.get("error_pct") and "range_error_pct" not in r]
    rows.sort(key=lambda r: -abs(r["error_pct"].get("allocated", 0)))
    table_rows = [
        [
            f"`{r['id']}`",
            gib(r["measured"]["allocated_bytes"]),
            pct(r["error_pct"].get("allocated")),
            pct(r["error_pct"].get("reserved")),
            pct(r["error_pct"].get("device_used")),
        ]
        for r in rows[:20]
    ]
    return block(
        markdown(
            [
                "model (batch, precision)",
                "measured allocated",
                "allocated",
                "reserved",
                "device used",
            ],
            table_rows,
        ),
        "The 20 models of the zoo farthest off in allocated memory. Errors are (estimate − "
        "measured) / measured: negative is an under-estimate.",
        source("zoo_accuracy_h200.json"),
    )


@table("estimate-speed")
def estimate_speed(root: Path) -> str:
    data = load(root, "estimate_speed.json")
    rows = []
    for m in data["models"]:
        if "seconds" not in m:
            continue
        rows.append(
            [
                f"`{m['spec']}`",
                f"{m['parameters'] / 1e6:,.0f} M",
                m["batch_size"],
                m["precision"],
                f"{m['seconds']:.2f} s",
            ]
        )
    meta = data["meta"]
    cold, big = data["cold_gpt2"], data["llama_7b"]
    return block(
        markdown(["workload", "parameters", "batch", "precision", "estimate"], rows, "lrrlr"),
        f"Once torch is imported, on a {meta['cpus']}-core {meta['cpu']} CPU (torch "
        f"{meta['torch']}, {meta['date']}). A 7 B Llama from its config: "
        f"{big['seconds']:.1f} s with a peak RSS of {gib(big['max_rss_bytes'])} in a fresh "
        f"process; `hf:gpt2` in a fresh process, imports included: {cold['seconds']:.1f} s.",
        source("estimate_speed.json"),
    )


# --------------------------------------------------------------------------- per rank


@table("distributed-estimate-speed")
def distributed_estimate_speed(root: Path) -> str:
    data = load(root, "distributed_estimate_speed.json")
    rows = []
    for case in data["cases"]:
        if "seconds" not in case:
            rows.append([_plan(case["plan"]), case["precision"], "failed", "", "", "", "", ""])
            continue
        cats = case["categories_at_peak"]
        rows.append(
            [
                _plan(case["plan"]),
                case["precision"],
                f"{case['seconds']:.1f} s",
                gib(case["max_rss_bytes"]),
                gib(cats["parameters"]),
                gib(cats["optimizer_state"]),
                gib(case["peak"]["allocated_bytes"]),
                gib(case["peak"]["device_used_bytes"]) + ("" if case["fits"] else " (runs out)"),
            ]
        )
    meta, target = data["meta"], data["target"]
    return block(
        markdown(
            [
                "strategy × ranks",
                "precision",
                "estimate",
                "host RSS",
                "parameters at the peak",
                "optimizer state at the peak",
                "allocated",
                "device used",
            ],
            rows,
            "llrrrrrr",
        ),
        "`hf:llama-7b/seq=1024` (6.7 B parameters, AdamW), batch 1 per GPU, for an H100 80GB; "
        "the memory columns are per rank. Each case in a fresh process, imports included, on a "
        f"{meta['cpus']}-core {meta['cpu']} CPU (torch {meta['torch']}, {meta['date']}). A case "
        "that *runs out* does not fit the H100: its columns are the memory where it ran out. "
        f"Target: the 64-rank FSDP estimate in ≤{target['seconds']:.0f} s: "
        f"{'met' if target['met'] else 'missed'}"
        + "".join(
            f"; the {_plan(case['plan'])} estimate: {'met' if case['target_met'] else 'missed'}"
            for case in data["cases"]
            if "target_met" in case
        )
        + f". Load average before the run: {', '.join(map(str, data.get('load_before', [])))}.",
        source("distributed_estimate_speed.json"),
    )


def _plan(plan: dict[str, Any]) -> str:
    """A per-rank plan in a few words: ``fsdp × 64, param bf16, reduce fp32``."""
    words = [plan["strategy"] + (f" × {plan['world_size']}" if "world_size" in plan else "")]
    if plan.get("shard_size"):
        words.append(f"shard groups of {plan['shard_size']}")
    if plan.get("pp", 1) > 1:
        words.append(f"{plan['pp']} pipeline stages ({plan.get('microbatches')} micro-batches)")
    if plan.get("tp", 1) > 1:
        words.append(f"tensor parallel {plan['tp']} ({'3-D' if plan.get('pp', 1) > 1 else '2-D'})")
    for key in ("param_dtype", "reduce_dtype"):
        if plan.get(key):
            words.append(f"{key.split('_')[0]} {plan[key]}")
    return ", ".join(words)


@table("distributed-accuracy")
def distributed_accuracy(root: Path) -> str:
    path = root / RESULTS / "distributed_accuracy_h200.json"
    if not path.exists():
        return (
            "Not measured yet: `python benchmarks/distributed_accuracy.py` on a GPU writes "
            "`benchmarks/results/distributed_accuracy_h200.json`, and `python docs/gen/sync.py` "
            "puts it here."
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    held = any(case.get("held_built_parameter_bytes") for case in data["cases"])
    rows = []
    for case in data["cases"]:
        if "ranks" not in case:
            reason = case.get("error") or case.get("skipped") or "?"
            rows.append([case["case"], "failed" if "error" in case else "skipped", reason])
            rows[-1] += [""] * (7 if held else 6)
            continue
        strategy = _plan({**case["settings"], "strategy": case["strategy"]})
        for row in case["ranks"]:
            errors = row["error_pct"]
            cells = [
                f"`{case['workload']}`",
                strategy + (" (target)" if case.get("target_case") else ""),
                case["batch_size"],
                case["precision"],
                row["rank"],
                gib(row["measured"]["allocated_bytes"]),
                pct(errors["allocated"]),
            ]
            if held:
                without = errors.get("allocated_without_held")
                cells.append(pct(without) if without is not None else "")
            cells += [
                pct(errors["reserved"]),
                pct(errors.get("device_used", errors.get("device_used_without_nccl"))),
            ]
            rows.append(cells)
    meta, targets = data["meta"], data["targets"]
    columns = ["workload", "strategy", "batch per GPU", "precision", "rank"]
    columns += ["measured allocated", "allocated"] + (["allocated†"] if held else [])
    columns += ["reserved", "device used*"]
    estimated = meta.get("estimated")
    notes = [
        f"{meta['world_size']} ranks sharing one {meta['device']} over {meta['backend']}, "
        f"{measured_on({k: v for k, v in meta.items() if k != 'device'})}; estimated over "
        f"{meta.get('estimate_backend', 'nccl')}"
        + (
            f" (recomputed on the CPU against these measurements, torch {estimated['torch']}, "
            f"{estimated['date']})"
            if estimated
            else ""
        )
        + "; errors are (estimate − measured) / measured. *Device used: both ranks' CUDA "
        "contexts share the GPU."
    ]
    if held:
        notes.append(
            "†Against measured allocated less the parameters as built, which these FSDP and "
            "ZeRO-2 ranks kept on the device (the workload as built held them through its "
            "optimizer; the benchmark's rank job drops it now)."
        )
    notes.append(
        f"Targets, per rank: allocated within {targets['allocated_pct']:.0f} %, reserved "
        f"within {targets['reserved_pct']:.0f} %: {'met' if targets['met'] else 'missed'}."
    )
    return block(
        markdown(columns, rows, "llrlrrr" + ("r" if held else "") + "rr"),
        " ".join(notes),
        source("distributed_accuracy_h200.json"),
    )


# --------------------------------------------------------------------------- fit and compare


def _fit_rows(root: Path) -> list[dict[str, Any]]:
    """fit_h200.json, with the rows re-run in fit_h200_cnn.json taking their place."""
    rows = load(root, "fit_h200.json")["fit"]
    rerun = {(r["spec"], r["budget_gib"]): r for r in load(root, "fit_h200_cnn.json")["fit"]}
    return [rerun.get((r["spec"], r["budget_gib"]), r) for r in rows]


def _scan(scan: dict[str, str]) -> str:
    sizes = sorted(int(b) for b in scan)
    marks = "".join("r" if scan[str(b)] == "fits" else "x" for b in sizes)
    return f"{sizes[0]}–{sizes[-1]}: `{marks}`"


@table("fit-accuracy")
def fit_accuracy(root: Path) -> str:
    rows = []
    # the estimate-only answers re-run on a CPU after the estimator changed (no trials needed)
    now = {
        (r["workload"], r["budget_gib"]): r["estimate"]
        for r in load(root, "fit_estimates_cpu.json")["results"]
    }
    for r in _fit_rows(root):
        rows.append(
            [
                f"`{r['spec']}`",
                r["precision"],
                f"{r['budget_gib']} GiB",
                r["true"],
                r["estimate"],
                pct(r["estimate_error_pct"], digits=1),
                now.get((r["workload"], r["budget_gib"]), "–"),
                r["verify"],
                r["verify_trials"],
                r["estimates"],
                _scan(r["scan"]),
            ]
        )
    meta = load(root, "fit_h200.json")["meta"]
    header = [
        "workload",
        "precision",
        "budget",
        "true",
        "estimate only",
        "error",
        "estimate only, now",
        "`--verify`",
        "real trials",
        "estimates",
        "scanned (r runs, x out of memory)",
    ]
    return block(
        markdown(header, rows, "llrrrrrrrrl"),
        f"Measured on an {measured_on(meta)}. *True* is the first batch size that runs "
        "while the next one runs out, each scanned batch a fresh capped process. *Estimate "
        "only, now*: the same answer from today's estimator, re-run without a GPU "
        f"({load(root, 'fit_estimates_cpu.json')['meta']['date']}).",
        source("fit_h200.json")
        + " "
        + source("fit_h200_cnn.json")
        + " "
        + source("fit_estimates_cpu.json"),
    )


@table("compare-savings")
def compare_savings(root: Path) -> str:
    data = load(root, "fit_h200.json")
    rows = []
    for r in data["compare_savings"]:
        if r.get("skipped") or r["strategy"] == "baseline":
            continue
        rows.append(
            [
                f"`{r['spec']}`",
                r["batch_size"],
                r["strategy"],
                pct(r["estimated_saving_pct"], signed=False, digits=1),
                pct(r["measured_saving_pct"], signed=False, digits=1),
                f"{r['difference_pp']:+.2f}",
            ]
        )
    worst = max(abs(r["difference_pp"]) for r in data["compare_savings"] if not r.get("skipped"))
    header = [
        "workload",
        "batch",
        "strategy",
        "estimated saving",
        "measured saving",
        "difference (points)",
    ]
    return block(
        markdown(header, rows, "lrlrrr"),
        f"Savings in peak reserved memory against the baseline, each measured in a fresh "
        f"process on an {measured_on(data['meta'])}; worst difference {worst:.1f} points.",
        source("fit_h200.json"),
    )


# --------------------------------------------------------------------------- tracking cost

_WORKLOADS = {
    "mlp-4096x8": "MLP 8×4096",
    "resnet50-fp32": "ResNet-50 fp32",
    "resnet50-bf16-mixed": "ResNet-50 bf16-mixed",
    "vit_b_16-fp32": "ViT-B/16 fp32",
    "gpt2-seq1024-bf16-mixed": "GPT-2 small, seq 1024, bf16-mixed",
    "llama-1b-bf16-true": "Llama-shaped 1.1 B, bf16-true",
    "chargpt-b64-bf16": "10.7 M GPT (nanoGPT char), bf16, fused AdamW",
    "chargpt-b8-bf16": "the same, batch 8",
    "chargpt-infer-b1-64tok": "the same, inference, 64 tokens",
    "chargpt-b64-bf16-compiled": "the same, batch 64, torch.compile'd",
}


def _overhead(root: Path, name: str, methods: tuple[str, ...], step: bool) -> str:
    """``step``: with the untracked step's time and the default's absolute cost a step."""
    data = load(root, name)
    rows, by_method = [], {m: [] for m in methods}
    for r in data["results"]:
        row = [_WORKLOADS.get(r["workload"], r["workload"]), r["batch_size"]]
        if step:
            row.append(f"{r['step_ms_baseline']:.2f}")
            cost = (r["methods"].get("default") or {}).get("cost_us_per_step")
            row.append(f"{cost:.0f}" if cost is not None else "")
        for m in methods:
            value = (r["methods"].get(m) or {}).get("overhead_pct")
            by_method[m].append(value)
            row.append(pct(value, digits=1))
        rows.append(row)
    summary = ["**median / worst**", ""] + (["", ""] if step else [])
    for m in methods:
        values = [v for v in by_method[m] if v is not None]
        summary.append(f"**{statistics.median(values):+.1f} % / {max(values):+.1f} %**")
    rows.append(summary)
    header = ["workload", "batch"] + (["step (ms)", "default (µs a step)"] if step else [])
    header += [_METHODS.get(m, f"`--detail {m}`") for m in methods]
    return block(
        markdown(header, rows),
        f"Overhead on the median step time, tracked against untracked steps interleaved in "
        f"one process, on an {measured_on(data['meta'])}.",
        source(name),
    )


_METHODS = {
    "default": "default",
    "memtracker": "MemTracker",
    "profiler": "torch.profiler (memory, shapes, stacks)",
    "naive-hooks": "per-module hooks reading the allocator",
}


@table("overhead-modules-before")
def overhead_modules_before(root: Path) -> str:
    return _overhead(
        root,
        "attribution_overhead_h200.json",
        ("default", "modules", "lines", "memtracker", "profiler", "naive-hooks"),
        step=False,
    )


@table("overhead")
def overhead(root: Path) -> str:
    return _overhead(root, "overhead_h200.json", ("default", "modules", "lines"), step=True)


@table("overhead-modules-after")
def overhead_modules_after(root: Path) -> str:
    return _overhead(
        root, "attribution_overhead_after_h200.json", ("default", "modules", "lines"), step=False
    )


@table("overhead-modules-depth")
def overhead_modules_depth(root: Path) -> str:
    return _overhead(
        root, "attribution_overhead_depth_h200.json", ("default", "modules"), step=False
    )


@table("read-cost")
def read_cost(root: Path) -> str:
    data = load(root, "overhead_h200.json")
    rows = [[f"`{k}`", f"{v:.1f} µs"] for k, v in data["read_cost_us"].items()]
    return block(
        markdown(["one read", "cost"], rows),
        f"On an {measured_on(data['meta'])}. " + source("overhead_h200.json"),
    )


@table("long-run")
def long_run(root: Path) -> str:
    data = load(root, "long_run_cpu.json")
    rows = [
        [
            f"{c['steps']:,}",
            f"{c['vramscope_python_mib']:.1f} MiB",
            f"{c['rss_mib']:.0f} MiB",
            f"{c['untracked_rss_mib']:.0f} MiB",
        ]
        for c in data["checkpoints"]
    ]
    return block(
        markdown(["steps", "vramscope's Python memory", "RSS tracked", "RSS untracked"], rows),
        f"{data['steps']:,} steps over {data['report_epochs']} epochs on the CPU "
        f"({measured_on(data['meta'])}): the report keeps {data['report_steps_entries']:,} "
        f"step entries standing for {data['report_steps_counted']:,} steps, "
        f"{data['report_json_bytes'] / 2**20:.1f} MiB of JSON.",
        source("long_run_cpu.json"),
    )


@table("journal-cost")
def journal_cost(root: Path) -> str:
    data = load(root, "journal_cost_cpu.json")
    cost, long = data["side_by_side"], data["long_run"]
    low, high = cost["overhead_p10_p90_pct"]
    rows = [
        [
            "in the journal's code, a stored step (training thread)",
            f"{cost['journal_us_per_step_training_thread']:.0f} µs",
        ],
        *(
            [
                [
                    "steps that waited, written by the sampler's flush "
                    f"({cost['sampler_step_flushes']} flushes)",
                    f"{cost['sampler_step_flush_us']:.0f} µs",
                ]
            ]
            if "sampler_step_flush_us" in cost
            else []
        ),
        [
            f"step time with against without, {cost['rounds']} rounds side by side",
            f"{cost['overhead_pct']:+.1f} % (p10..p90 {low:+.1f}..{high:+.1f} %)",
        ],
        [
            "a flush of the samples (sampler thread, twice a second)",
            f"{cost['sampler_flush_us']:.0f} µs",
        ],
        ["a step's line", f"{long['step_line_bytes']} bytes"],
        [
            f"the largest file over {long['steps']:,} steps ({long['compactions']} compactions)",
            f"{long['largest_bytes'] / 2**20:.2f} MiB",
        ],
        ["the slowest compaction", f"{long['slowest_compaction_ms']:.0f} ms"],
        [
            f"the report made from it ({long['report_steps_counted']:,} steps)",
            f"{long['report_from_journal_s']:.2f} s",
        ],
    ]
    return block(
        markdown(["the journal on the CPU", "cost"], rows, "lr"),
        f"A {cost['step_us_without'] / 1000:.2f} ms CPU training step, every step stored "
        f"(the most the journal costs; a step stored within "
        f"{1e3 * cost.get('step_write_gap_s', 0.0):.0f} ms of the last write waits for the "
        f"next), {measured_on(data['meta'])}, load average "
        f"{data['meta']['load_average'][0]:.1f}. " + source("journal_cost_cpu.json"),
    )


@table("html-open")
def html_open(root: Path) -> str:
    data = load(root, "html_open.json")
    columns = {
        "cold, median": data["median"],
        "again in the same tab": data.get("again") or {},
        "cold, under chromedriver": data.get("chromedriver") or {},
    }
    moments = (
        ("readable (text and tables)", "content"),
        ("first screen drawn (timeline)", "first"),
        ("every chart drawn", "plotted"),
    )
    rows = [
        [label, *(f"{col[key]:,.0f} ms" if key in col else "–" for col in columns.values())]
        for label, key in moments
    ]
    meta = data["meta"]
    return block(
        markdown(["opened in headless Chromium", *columns], rows),
        f"A {meta['bytes'] / 1e6:.2f} MB page on a {meta['cpus']}-core machine, "
        f"{len(data['runs'])} cold opens, {meta['date']}. " + source("html_open.json"),
    )


# --------------------------------------------------------------------------- the report schema


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    ref = node.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        return name, schema["$defs"][name]
    return None, node


def _type(schema: dict[str, Any], node: dict[str, Any]) -> str:
    name, target = _resolve(schema, node)
    if name:
        return f"[{name}](#{name})"
    if "enum" in target:
        return " \\| ".join(f"`{v}`" for v in target["enum"])
    if "const" in target:
        return f"`{target['const']}`"
    kind = target.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and isinstance(target.get("items"), dict):
        inner = _type(schema, target["items"])
        kinds = [f"array of {inner}" if k == "array" else k for k in kinds]
    if "anyOf" in target or "oneOf" in target:
        kinds = [_type(schema, n) for n in target.get("anyOf") or target.get("oneOf")]
    return " \\| ".join(str(k) for k in kinds)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _properties(schema: dict[str, Any], node: dict[str, Any]) -> str:
    required = set(node.get("required") or ())
    rows = []
    for key, sub in (node.get("properties") or {}).items():
        _, target = _resolve(schema, sub)
        text = sub.get("description") or target.get("description") or ""
        rows.append(
            [
                f"`{key}`" + (" **required**" if key in required else ""),
                _type(schema, sub),
                _cell(text),
            ]
        )
    return markdown(["key", "type", "meaning"], rows, "lll")


@table("report-schema")
def report_schema(root: Path) -> str:
    schema = json.loads((root / SCHEMA).read_text(encoding="utf-8"))
    parts = [
        f"**{schema['title']}** (`{schema['$id']}`, JSON Schema "
        f"{schema['$schema'].split('/')[-2]}): {_cell(schema['description'])}",
        "",
        "### The report",
        "",
        _properties(schema, schema),
    ]
    for name, node in schema["$defs"].items():
        if node.get("type") == "object" or "properties" in node:
            parts += ["", f"### {name}", ""]
            if node.get("description"):
                parts += [_cell(node["description"]), ""]
            parts.append(_properties(schema, node) if node.get("properties") else "(any keys)")
        elif node.get("type") == "array" and isinstance(node.get("items"), dict):
            _, item = _resolve(schema, node["items"])
            parts += ["", f"### {name}", "", _cell(node.get("description", "")), ""]
            parts.append(_properties(schema, item))
        else:
            parts += [
                "",
                f"### {name}",
                "",
                f"{_type(schema, node)}. {_cell(node.get('description', ''))}",
            ]
    return "\n".join(parts)


# --------------------------------------------------------------------------- the oracle


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:.2f}"


def _oracle(root: Path, name: str) -> str:
    """vramscope against benchmarks/peak_oracle.py: what the peak is made of, per detail."""
    data = load(root, name)
    objects = ("parameters", "buffers", "gradients", "optimizer_state")
    rows = []
    for row in data["rows"]:
        if "error" in row:
            rows.append([row["script"], "", "oracle failed", "", "", "", ""])
            continue
        steps = row["oracle"]["steps"]
        instant = (row["oracle"]["instant"].get("instant") or {}) if row.get("faithful") else {}
        truth = instant.get("categories") or {}
        peak = steps["run_peak"] if steps["device"] == "cuda" else instant.get("allocated_bytes")
        oracle = "/".join(_mib(truth.get(k)) for k in objects) if truth else "not judged"
        for detail, run in row["runs"].items():
            cats = run.get("categories") or {}
            rest = (run.get("differences") or {}).get("rest")
            rows.append(
                [
                    row["script"],
                    detail,
                    _mib(peak),
                    oracle,
                    "/".join(_mib(cats.get(k)) for k in objects),
                    "–" if rest is None or not peak else f"{100 * rest / peak:+.2f} %",
                    "yes" if run.get("ok") else "no: " + "; ".join(run.get("problems", []))[:120],
                ]
            )
    return block(
        markdown(
            [
                "script",
                "detail",
                "peak MiB",
                "oracle P/B/G/O MiB",
                "vramscope P/B/G/O MiB",
                "rest vs oracle",
                "in target",
            ],
            rows,
            "llrllrl",
        ),
        f"Parameters / buffers / gradients / optimizer state at the peak; rest: vramscope's "
        f"activations + temporaries + other against the oracle's activations + temporaries, "
        f"as a share of the peak ({measured_on(data['meta'])}"
        + (", the scripts' small sizes" if data["meta"].get("small") else "")
        + ").",
        source(name),
    )


@table("oracle-cpu")
def oracle_cpu(root: Path) -> str:
    return _oracle(root, "peak_oracle_cpu.json")


@table("oracle-h200")
def oracle_h200(root: Path) -> str:
    return _oracle(root, "peak_oracle_h200.json")


@table("exit-codes")
def exit_codes(root: Path) -> str:
    """The exit codes, from the one policy the commands use (``vramscope.cli.exits``)."""
    import ast

    tree = ast.parse((root / "src" / "vramscope" / "cli" / "exits.py").read_text(encoding="utf-8"))
    codes = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "EXIT_CODES" for t in node.targets)
    )
    names = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, int)
    }
    rows = []
    for pair in codes.elts:
        code, meaning = pair.elts
        number = names[code.id] if isinstance(code, ast.Name) else code.value
        rows.append([f"`{number}`", meaning.value])
    return markdown(["code", "meaning"], rows, align="rl")
