"""Exports: a Perfetto/Chrome trace and a CSV of the steps, from reports recorded on an H200."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from vramscope.cli.main import cli
from vramscope.errors import VramscopeError
from vramscope.report import csv_export, exports, perfetto
from vramscope.report.model import Report

DATA = Path(__file__).parent / "data"


def load(name: str) -> Report:
    return Report.load(DATA / name)


@pytest.fixture(scope="module")
def trace() -> dict:
    return perfetto.to_trace(load("report_h200_leak.json"))


def test_the_trace_has_a_counter_track_per_series(trace):
    report = load("report_h200_leak.json")
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"allocated", "reserved", "device used", "host RSS"}
    allocated = [e for e in counters if e["name"] == "allocated"]
    assert len(allocated) == sum(1 for v in report.timeline.allocated_bytes if v is not None)
    assert max(e["args"]["bytes"] for e in allocated) == max(
        v for v in report.timeline.allocated_bytes if v is not None
    )


def test_trace_timestamps_are_microseconds(trace):
    report = load("report_h200_leak.json")
    first = report.timeline.phases[0]
    phase = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") == "phase")
    assert phase["ts"] == pytest.approx(first["start_s"] * 1e6, abs=0.01)
    assert phase["dur"] == pytest.approx((first["end_s"] - first["start_s"]) * 1e6, abs=0.01)
    assert phase["name"] == first["name"] and phase["args"] == {"step": 0}


def test_the_trace_has_phase_slices_step_slices_and_boundaries(trace):
    report = load("report_h200_leak.json")
    events = trace["traceEvents"]
    phases = [e for e in events if e.get("cat") == "phase"]
    steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "step"]
    instants = [e for e in events if e["ph"] == "i"]
    assert len(phases) == len(report.timeline.phases) == 93
    assert len(steps) == 18 and steps[17]["args"]["peak_allocated_bytes"] == 107277312
    assert {e["cat"] for e in instants} == {"step", "epoch"}
    assert sum(1 for e in instants if e["cat"] == "epoch") == 2


def test_the_trace_names_its_process_and_tracks(trace):
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {e["args"].get("name") for e in meta}
    assert "vramscope: tests/scripts/train_loop.py on NVIDIA H200" in names
    assert {"phases", "steps", "step and epoch boundaries"} <= names
    assert trace["displayTimeUnit"] == "ms"
    assert trace["metadata"]["peak_allocated_bytes"] == 107277312


def test_categories_over_time_become_counter_tracks_when_recorded():
    report = load("report_h200_gpt.json")
    report.extra["categories_over_time"] = {
        "t": [0.5, 1.0],
        "parameters": [10, 10],
        "activations": [0, 99],
    }
    names = {e["name"] for e in perfetto.trace_events(report) if e["ph"] == "C"}
    assert {"parameters", "activations"} <= names and "gradients" not in names


def test_the_trace_file_is_json(tmp_path):
    path = tmp_path / "t.json"
    exports.write("trace", load("report_h200_gpt.json"), path)
    assert json.loads(path.read_text())["traceEvents"]


def test_the_csv_has_a_row_per_step_and_a_column_per_phase(tmp_path):
    report = load("report_h200_leak.json")
    path = tmp_path / "steps.csv"
    exports.write("csv", report, path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 18
    assert list(rows[0])[:10] == [
        "index",
        "epoch",
        "mode",
        "micro_batches",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "start_allocated_bytes",
        "end_allocated_bytes",
        "host_rss_bytes",
        "duration_s",
    ]
    assert rows[17]["peak_allocated_bytes"] == "107277312" and rows[17]["epoch"] == "2"
    assert rows[17]["optimizer_peak_allocated_bytes"] == "107277312"
    assert rows[0]["forward_peak_allocated_bytes"] == "35050496"
    assert {"data_peak_allocated_bytes", "zero_grad_peak_allocated_bytes"} <= set(rows[0])
    assert rows[0]["count"] == "1" and rows[0]["last_index"] == ""


def test_the_csv_leaves_unmeasured_values_empty():
    report = load("report_h200_gpt.json")
    report.steps[0].peak_allocated_bytes = None
    header, first = csv_export.render(report).splitlines()[:2]
    column = header.split(",").index("peak_allocated_bytes")
    assert first.split(",")[column] == ""


def test_an_unknown_export_kind_is_refused(tmp_path):
    with pytest.raises(VramscopeError, match="unknown export format"):
        exports.write("pdf", load("report_h200_gpt.json"), tmp_path / "r.pdf")


def test_a_write_error_is_one_line_for_the_user(tmp_path):
    with pytest.raises(VramscopeError, match="cannot write"):
        exports.write("csv", load("report_h200_gpt.json"), tmp_path)  # a folder


def test_the_report_verb_writes_every_export(tmp_path):
    out = {kind: tmp_path / f"r.{kind}" for kind in ("html", "trace", "csv")}
    result = CliRunner().invoke(
        cli,
        [
            "report",
            str(DATA / "report_h200_gpt.json"),
            "-q",
            "--html",
            str(out["html"]),
            "--trace",
            str(out["trace"]),
            "--csv",
            str(out["csv"]),
        ],
    )
    assert result.exit_code == 0, result.output
    assert out["html"].read_text().startswith("<!DOCTYPE html>")
    assert json.loads(out["trace"].read_text())["traceEvents"]
    assert len(out["csv"].read_text().splitlines()) == 7


def test_an_estimates_trace_lays_its_phases_out_in_order_with_their_peaks():
    """An estimate has no clock: each step's phases in order, a millisecond each, a slice per
    phase and step, and allocated memory at each phase's peak (the process says so)."""
    from vramscope.estimate.estimator import estimate

    report = estimate("example:cnn", 4)
    events = perfetto.trace_events(report)
    phases = [e for e in events if e["ph"] == "X" and e["cat"] == "phase"]
    expected = [(p.name, s.index) for s in report.steps for p in s.phases]
    assert [(e["name"], e["args"]["step"]) for e in phases] == expected
    assert [e["ts"] for e in phases] == [1000.0 * i for i in range(len(phases))]
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert [e["name"] for e in steps] == [f"step {s.index}" for s in report.steps]
    peaks = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["name"] == "allocated"]
    assert max(peaks) == report.peak.allocated_bytes
    assert "an estimate" in events[0]["args"]["name"]


def test_an_estimates_csv_leaves_the_times_it_never_measured_empty():
    from vramscope.estimate.estimator import estimate

    table = list(csv.DictReader(csv_export.render(estimate("example:cnn", 4)).splitlines()))
    assert table and all(r["duration_s"] == "" and r["start_s"] == "" for r in table)
    assert all(int(r["peak_allocated_bytes"]) > 0 for r in table)
