"""The HTML report: one self-contained file, escaped, small enough for long runs."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from vramscope.report import html
from vramscope.report.model import Finding, Report

DATA = Path(__file__).parent / "data"
XSS = "<script>alert(1)</script>"


def load(name: str) -> Report:
    return Report.load(DATA / name)


def long_report(steps: int = 10_000) -> Report:
    """A run of ``steps`` steps built by repeating the steady steps recorded on the H200.

    Steps 1–5 of the GPT fixture (with their samples, phase bands and markers) are laid
    end to end after step 0, so the timeline, bands and tables grow as in a long run.
    """
    report = load("report_h200_gpt.json")
    first, steady = report.steps[0], report.steps[1:]
    t0 = steady[0].start_s
    period = steady[-1].start_s + steady[-1].duration_s - t0
    tl = report.timeline
    samples = [
        (t, a, r, u, h)
        for t, a, r, u, h in zip(
            tl.t,
            tl.allocated_bytes,
            tl.reserved_bytes,
            tl.device_used_bytes,
            tl.host_rss_bytes,
            strict=True,
        )
        if t0 <= t < t0 + period
    ]
    before = [
        (t, a, r, u, h)
        for t, a, r, u, h in zip(
            tl.t,
            tl.allocated_bytes,
            tl.reserved_bytes,
            tl.device_used_bytes,
            tl.host_rss_bytes,
            strict=True,
        )
        if t < t0
    ]
    bands = [b for b in tl.phases if b["step"] in {s.index for s in steady}]
    out_steps, out_samples, out_bands, markers = (
        [first],
        list(before),
        [b for b in tl.phases if b["step"] == first.index],
        [{"kind": "step", "index": 0, "t": first.start_s}],
    )
    index = 1
    block = 0
    while index < steps:
        shift = block * period
        for s in steady:
            if index >= steps:
                break
            step = copy.deepcopy(s)
            offset = index - s.index
            step.index = index
            step.start_s = s.start_s + shift
            for p in step.phases:
                p.step = index
            out_steps.append(step)
            markers.append({"kind": "step", "index": index, "t": step.start_s})
            out_bands += [
                {
                    **b,
                    "step": b["step"] + offset,
                    "start_s": b["start_s"] + shift,
                    "end_s": b["end_s"] + shift,
                }
                for b in bands
                if b["step"] == s.index
            ]
            index += 1
        out_samples += [(t + shift, a, r, u, h) for t, a, r, u, h in samples]
        block += 1
    report.steps = out_steps
    report.epochs[0].steps = steps
    tl.t, tl.allocated_bytes, tl.reserved_bytes, tl.device_used_bytes, tl.host_rss_bytes = [
        list(col) for col in zip(*out_samples, strict=True)
    ]
    tl.phases, tl.markers = out_bands, markers
    report.workload["steps"] = steps
    return report


def figures(page: str) -> dict:
    """The chart data embedded in a page."""
    match = re.search(r'<script type="application/json" id="vs-figures">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def trace(figure: dict, name: str) -> dict:
    return next(t for t in figure["data"] if t.get("name") == name)


@pytest.fixture(scope="module")
def gpt_page() -> str:
    return html.render(load("report_h200_gpt.json"))


def test_the_page_is_one_file_that_needs_no_network(gpt_page):
    assert gpt_page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", gpt_page)
    assert not re.search(r"<link[^>]+href=", gpt_page)
    encoding, payload = html.plotlyjs_payload()
    assert encoding == "gzip+base64" and payload in gpt_page
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", gpt_page.replace(payload, ""))


def test_the_embedded_plotlyjs_is_the_installed_one():
    import base64
    import gzip

    from plotly.offline import get_plotlyjs

    _, payload = html.plotlyjs_payload()
    assert gzip.decompress(base64.b64decode(payload)).decode() == get_plotlyjs()


def test_the_header_names_workload_device_and_peak(gpt_page):
    assert "<h1>example:gpt</h1>" in gpt_page
    assert "NVIDIA H200 · 139.80 GiB" in gpt_page
    assert "774.47 MiB" in gpt_page and "884.00 MiB" in gpt_page and "1.59 GiB" in gpt_page
    assert "batch size 16" in gpt_page


def test_the_peak_is_explained_in_words():
    text = html.explain_peak(load("report_h200_gpt.json"))
    assert text.startswith("The run peaked at 774.47 MiB allocated in the backward phase of step 1")
    assert "activations 457.60 MiB (59.1%)" in text


def test_the_timeline_has_every_series_phase_bands_and_the_peak(gpt_page):
    report = load("report_h200_gpt.json")
    timeline = figures(gpt_page)["chart-timeline"]
    allocated = trace(timeline, "allocated")
    assert len(allocated["y"]) == len(report.timeline.t)
    assert max(v for v in allocated["y"] if v is not None) == pytest.approx(
        max(v for v in report.timeline.allocated_bytes if v is not None) / 2**30, abs=1e-4
    )
    for name in (
        "reserved",
        "device used (nvidia-smi)",
        "host RSS",
        "forward",
        "backward",
        "step boundary",
    ):
        assert trace(timeline, name)
    assert trace(timeline, "host RSS")["yaxis"] == "y2"
    peak = trace(timeline, "peak allocated")
    assert peak["y"] == [pytest.approx(report.peak.allocated_bytes / 2**30, abs=1e-4)]
    # 24 phase bands, 6 polygon points each
    bands = [t for t in timeline["data"] if t.get("fill") == "toself" and t["name"] != "startup"]
    assert sum(len(t["x"]) for t in bands) == 6 * len(report.timeline.phases)


def test_epoch_boundaries_are_drawn_and_labelled():
    page = html.render(load("report_h200_leak.json"))
    timeline = figures(page)["chart-timeline"]
    assert trace(timeline, "epoch boundary")
    assert [a["text"] for a in timeline["layout"]["annotations"] if "epoch" in a["text"]] == [
        "epoch 1",
        "epoch 2",
    ]


def test_categories_reconciliation_phases_and_steps_are_charted(gpt_page):
    charts = figures(gpt_page)
    donut = charts["chart-categories"]["data"][0]
    assert donut["type"] == "pie" and sum(donut["values"]) == 812094976
    waterfall = charts["chart-waterfall-peak"]["data"][0]
    assert waterfall["type"] == "waterfall"
    assert waterfall["measure"][0] == "absolute" and waterfall["measure"][-1] == "total"
    assert waterfall["text"][-1] == "1.59 GiB"  # device used
    assert "chart-waterfall-end" in charts and "chart-device-peak" in charts
    assert len(trace(charts["chart-steps"], "peak allocated")["x"]) == 6
    assert trace(charts["chart-phases"], "peak allocated")["type"] == "bar"


def test_findings_startup_and_tables_are_plain_html(gpt_page):
    assert "would give 650.00 MiB of cached free memory back" in gpt_page
    assert 'id="startup"' in gpt_page and "742.00 MiB" in gpt_page
    assert '<tr class="hl"><td class="l">1</td>' in gpt_page  # the peak step is highlighted


def test_sections_for_data_that_is_absent_are_left_out(gpt_page):
    for anchor in ("modules", "verdict", "validation", "fit", "oom", "epochs"):
        assert f'id="{anchor}"' not in gpt_page


def test_user_strings_are_escaped_everywhere():
    report = load("report_h200_gpt.json")
    report.workload["spec"] = XSS
    report.workload["argv"] = [XSS, "--x"]
    report.device["name"] = XSS
    report.exit.status, report.exit.error = "error", XSS
    report.categories_note = XSS
    report.unavailable["peak.device_used_bytes"] = XSS
    report.peak.phase = XSS
    report.findings.append(Finding("leak", "warning", XSS))
    report.modules = [
        {"name": "", "parameters_bytes": 100},
        {"name": XSS, "parameters_bytes": 60},
        {"name": f"{XSS}.</script><!--", "activations_bytes": 10},
    ]
    report.extra["fit"] = {"strategies": [{"name": XSS, "peak": {"allocated_bytes": 1}}]}
    page = html.render(report)
    assert XSS not in page
    assert "alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text
    embedded = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.S)
    assert embedded and all("<" not in block for block in embedded)
    assert all("<!--" not in block for block in embedded)


def test_a_10000_step_run_stays_under_5_mb_and_keeps_its_peaks():
    report = long_report(10_000)
    assert len(report.steps) == 10_000 and len(report.timeline.phases) == 4 * 10_000
    page = html.render(report)
    assert len(page.encode("utf-8")) < 5 * 1000 * 1000
    charts = figures(page)
    timeline = charts["chart-timeline"]
    tl = report.timeline
    for name, values in (
        ("allocated", tl.allocated_bytes),
        ("reserved", tl.reserved_bytes),
        ("device used (nvidia-smi)", tl.device_used_bytes),
        ("host RSS", tl.host_rss_bytes),
    ):
        drawn = [v for v in trace(timeline, name)["y"] if v is not None]
        assert len(trace(timeline, name)["x"]) <= html.MAX_POINTS
        present = [v for v in values if v is not None]
        assert max(drawn) == pytest.approx(max(present) / 2**30, abs=1e-4), name  # every peak
        assert min(drawn) == pytest.approx(min(present) / 2**30, abs=1e-4), name  # and trough
    steps = trace(charts["chart-steps"], "peak allocated")
    assert len(steps["x"]) <= html.MAX_POINTS
    top_step = max(s.peak_allocated_bytes for s in report.steps)
    assert max(steps["y"]) == pytest.approx(top_step / 2**20, abs=1e-4)  # MiB on that chart
    bands = [t for t in timeline["data"] if t.get("fill") == "toself" and t["name"] != "startup"]
    assert sum(len(t["x"]) for t in bands) <= 6 * html.MAX_BANDS
    assert "alternate per" in page  # says the bands were merged
    steps_table = page[page.index('id="steps"') :]
    steps_table = steps_table[: steps_table.index("</table>")]
    assert steps_table.count("<tr") <= 1 + html.STEP_ROWS_HEAD + html.STEP_ROWS_TAIL + 2 + 3
    assert "10,000 steps" in page


def test_downsampling_keeps_the_min_and_max_of_every_bucket():
    x = list(range(100_000))
    y = [(i * 7919) % 1000 for i in x]
    y[54_321] = 10**9
    y[77_777] = -5
    xs, ys = html.downsample_minmax(x, y, max_points=1000)
    assert len(xs) <= 1000 and xs == sorted(xs)
    assert max(ys) == 10**9 and min(ys) == -5
    assert xs[ys.index(10**9)] == 54_321


def test_downsampling_keeps_gaps():
    _, ys = html.downsample_minmax(list(range(10)), [None] * 5 + [1, 2, 3, 4, 5], max_points=4)
    assert ys[0] is None and max(v for v in ys if v is not None) == 5


def test_the_module_tree_adds_missing_parents_and_reads_inclusive_sizes():
    modules = [
        {"name": "", "parameters_bytes": 100, "activations_bytes": 50},
        {"name": "encoder.layers.0", "parameters_bytes": 30, "activations_bytes": 20},
        {"name": "encoder.layers.1", "parameters_bytes": 30},
        {"name": "head", "parameters_bytes": 40, "temporaries_peak_bytes": None},
    ]
    tree = html.module_tree(modules)
    node = dict(zip(tree["ids"], tree["values"], strict=True))
    parent = dict(zip(tree["ids"], tree["parents"], strict=True))
    assert parent["encoder.layers.0"] == "encoder.layers" and parent["encoder"] == "(model)"
    assert tree["branchvalues"] == "total"
    assert node["encoder.layers"] == 80 and node["encoder"] == 80 and node["(model)"] == 150
    assert html.module_tree(modules, "parameters_bytes")["values"][0] == 100


def test_the_module_tree_copes_with_parents_below_their_children():
    # as the attribution tracker records them (CPU run of example:gpt): the ModuleList is never
    # called, so it has no activations of its own; tied embeddings count twice
    modules = [
        {"name": "", "peak_bytes": 98541776, "activations_bytes": 34674688},
        {"name": "blocks", "peak_bytes": 71528640, "activations_bytes": 0},
        {"name": "blocks.0", "peak_bytes": 17882160, "activations_bytes": 8404992},
        {"name": "blocks.1", "peak_bytes": 17882160, "activations_bytes": 8404992},
        {"name": "tok", "peak_bytes": 21000000},
        {"name": "lm_head", "peak_bytes": 21000000},
        {"name": "(outside modules)", "peak_bytes": 20000000},
    ]
    tree = html.module_tree(modules, "activations_bytes")
    node = dict(zip(tree["ids"], tree["values"], strict=True))
    assert tree["branchvalues"] == "total" and node["blocks"] == 2 * 8404992
    peak = html.module_tree(modules, "peak_bytes")
    drawn = dict(zip(peak["ids"], peak["values"], strict=True))
    shown = dict(zip(peak["ids"], peak["recorded"], strict=True))
    assert drawn["(model)"] == 71528640 + 42000000 + 20000000  # boxes never overflow
    assert shown["(model)"] == 98541776  # the label keeps the recorded number


def test_the_module_tree_reads_own_sizes_when_parents_are_smaller():
    modules = [{"name": "a", "activations_bytes": 1}, {"name": "a.b", "activations_bytes": 5}]
    assert html.module_tree(modules)["branchvalues"] == "remainder"


def test_modules_become_a_treemap_with_a_menu_per_kind_of_memory():
    report = load("report_h200_gpt.json")
    report.modules = [
        {
            "name": "transformer.h.0.attn",
            "parameters_bytes": 4 * 2**20,
            "activations_bytes": 9 * 2**20,
        },
        {"name": "transformer.h.0.mlp", "parameters_bytes": 8 * 2**20},
        {"name": "lm_head"},
    ]
    page = html.render(report)
    treemap = figures(page)["chart-modules"]
    assert treemap["data"][0]["type"] == "treemap"
    labels = [b["label"] for b in treemap["layout"]["updatemenus"][0]["buttons"]]
    assert labels == ["all kept bytes", "parameters", "activations"]
    assert "transformer.h.0.attn" in page and "13.00 MiB" in page


def test_estimates_show_the_verdict_validation_and_fit():
    report = load("report_h200_gpt.json")
    report.kind = "estimated"
    report.extra["verdict"] = {
        "fits": True,
        "headroom_bytes": 10 * 2**30,
        "gpu": "NVIDIA A100 80GB",
    }
    report.extra["validation"] = {
        "estimated": {"allocated_bytes": 800 * 2**20, "reserved_bytes": 900 * 2**20},
        "measured": {"allocated_bytes": 774 * 2**20, "reserved_bytes": 884 * 2**20},
    }
    report.extra["fit"] = {
        "max_batch_size": 48,
        "strategies": [
            {
                "name": "baseline",
                "peak": {"allocated_bytes": 8 * 2**30, "reserved_bytes": 9 * 2**30},
            },
            {
                "name": "bf16-mixed",
                "peak": {"allocated_bytes": 5 * 2**30, "reserved_bytes": 6 * 2**30},
            },
        ],
        "curve": [
            {"batch_size": 16, "peak": {"allocated_bytes": 3 * 2**30}},
            {"batch_size": 32, "peak": {"allocated_bytes": 6 * 2**30}},
        ],
    }
    page = html.render(report)
    assert "Fits on NVIDIA A100 80GB: 10.00 GiB free" in page
    assert "+3.4%" in page  # estimated against measured, allocated
    # the fit's headline, and reserved memory against the baseline's: 6 GiB against 9 GiB
    assert "Largest batch size: 48" in page and "-33.3%" in page
    charts = figures(page)
    assert {"chart-validation", "chart-strategies", "chart-fit-curve"} <= set(charts)


def test_a_report_without_gpu_numbers_renders_host_memory_only():
    report = load("report_h200_gpt.json")
    report.peak.allocated_bytes = report.peak.reserved_bytes = report.peak.device_used_bytes = None
    report.unavailable["peak.allocated_bytes"] = "no CUDA device in use"
    tl = report.timeline
    tl.allocated_bytes = tl.reserved_bytes = tl.device_used_bytes = [None] * len(tl.t)
    for step in report.steps:
        step.peak_allocated_bytes = step.peak_reserved_bytes = None
    report.reconciliation = []
    page = html.render(report)
    timeline = figures(page)["chart-timeline"]
    lines = [t["name"] for t in timeline["data"] if t.get("mode") == "lines" and "fill" not in t]
    assert lines[0] == "host RSS"
    assert "GPU memory was not measured (no CUDA device in use)" in page
    assert "host RSS" in [t["name"] for t in figures(page)["chart-steps"]["data"]]


def test_an_empty_report_still_renders():
    page = html.render(Report())
    assert "<h1>tracked code</h1>" in page and figures(page) == {}
