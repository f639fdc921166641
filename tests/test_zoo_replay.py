"""Rows of the zoo sweep measured on an H200, estimated again on this CPU: the committed
measurements (``benchmarks/results/zoo_measured_h200.json``, from ``zoo_measure.py``) of the
quickest hand-written layers and shrunk transformers models stay within the per-model
bounds (allocated within 3 %, reserved within 5 %), or, for a row the committed accuracy
(``zoo_accuracy_h200.json``) already shows outside them, no farther off than it was then:
a change that makes any of them worse fails. Skipped until the measurements are committed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "benchmarks" / "results" / "zoo_measured_h200.json"
ESTIMATES = ROOT / "benchmarks" / "results" / "zoo_estimates_cpu.json"
ACCURACY = ROOT / "benchmarks" / "results" / "zoo_accuracy_h200.json"
SLACK = 0.005  # how much a known error may move between torch versions (2.13 here, 2.14 there)
ROWS = 6  # the quickest of each library


def _replayable() -> list[dict]:
    if not (MEASURED.exists() and ESTIMATES.exists()):
        return []
    measured = {r["id"]: r for r in json.loads(MEASURED.read_text())["rows"] if r.get("ok")}
    rows = []
    for library in ("layers", "hf"):
        done = [
            r
            for r in json.loads(ESTIMATES.read_text())["rows"]
            if r["library"] == library
            and r["id"] in measured
            and (r.get("estimate") or {}).get("ok")
        ]
        done.sort(key=lambda r: r["estimate"]["seconds"])
        rows += [{**r, "measured": measured[r["id"]]["peak"]} for r in done[:ROWS]]
    known = {}
    if ACCURACY.exists():
        known = {
            r["id"]: r.get("error_pct") or {} for r in json.loads(ACCURACY.read_text())["rows"]
        }
    return [{**r, "known": known.get(r["id"], {})} for r in rows]


def _bound(target: float, known: float | None) -> float:
    return max(target, abs(known) / 100 + SLACK) if known is not None else target


@pytest.mark.parametrize("row", _replayable() or [None], ids=lambda r: r["id"] if r else "none")
def test_recorded_zoo_rows_estimate_within_bounds(row, monkeypatch, tmp_path):
    if row is None:
        pytest.skip("no zoo measurements committed yet (benchmarks/zoo_measure.py)")
    if row["library"] == "hf":
        pytest.importorskip("transformers")
        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            import zoo_hf
        finally:
            sys.path.remove(str(ROOT / "benchmarks"))
        zoo_hf.write_config_files()
    from vramscope.estimate.estimator import estimate

    monkeypatch.chdir(ROOT)  # specs name files relative to the repository
    report = estimate(row["spec"], row["batch"], gpu="h200", precision=row["precision"])
    measured = row["measured"]
    allocated = report.peak.allocated_bytes / measured["allocated_bytes"] - 1
    reserved = report.peak.reserved_bytes / measured["reserved_bytes"] - 1
    known = row["known"]
    assert abs(allocated) <= _bound(0.03, known.get("allocated")), f"allocated {allocated:+.2%}"
    assert abs(reserved) <= _bound(0.05, known.get("reserved")), f"reserved {reserved:+.2%}"
