"""``fit --verify``: the headline answer is the verified batch size, the estimate's stands
beside it, and the JSON holds the final answer in one place (``fit.answer``).

``fit_cpu_cnn_2g.json`` is a real estimate-only fit of the example CNN under a 2 GiB budget
(this CPU, 5% margin); the trials are the ones recorded on an H200 for the same workload and
budget (``fit_edges_h200.json``), run through the real search over the estimate's edges."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vramscope import schema
from vramscope.fit.answer import final_answer
from vramscope.fit.render import headline, render_fit
from vramscope.fit.search import _at_the_edges

DATA = Path(__file__).parent / "data"


def saved_fit() -> dict:
    return json.loads((DATA / "fit_cpu_cnn_2g.json").read_text())


def recorded_verify(edges: list[int]) -> dict:
    """What ``--verify`` returned on the H200: the search over the estimate's edges, each
    trial's outcome and peaks as recorded there."""
    doc = json.loads((DATA / "fit_edges_h200.json").read_text())
    outcome = {t["batch_size"]: t for t in doc["trials"] if t["budget_gib"] == 2}
    trials: list[dict] = []

    def fits(batch: int) -> bool:
        t = outcome[batch]
        peak = {"allocated_bytes": t["allocated_bytes"], "reserved_bytes": t["reserved_bytes"]}
        trials.append({"batch_size": batch, "status": t["status"], "peak": peak})
        return t["status"] == "fits"

    best = _at_the_edges(fits, edges, 1024)
    return {"max_batch_size": best, "trials": trials, "real_trials": len(trials)}


def test_an_estimate_only_fit_answers_with_the_estimate_and_says_so():
    data = saved_fit()
    section = data["fit"]
    assert section["answer"] == {
        "max_batch_size": 211,
        "source": "estimate",
        "real_trials": 0,
        "margin_applied": True,
    }
    assert schema.errors(data) == []
    lines = headline(section).plain.splitlines()
    assert lines[0] == "Largest batch size: 211"
    assert lines[1].startswith(
        "  fits a 2.00 GiB budget: reserved ≤ 1.90 GiB (5% margin kept free)"
    )
    assert lines[2] == "  without the margin: 217 · from the estimator, 63 estimates"


def test_a_verified_fit_answers_with_the_trials_and_keeps_the_estimate_beside_it():
    section = saved_fit()["fit"]
    without = section["max_batch_size_without_margin"]
    section["verify"] = recorded_verify([without + 1, 225])
    section["method"] = "estimate+verify"
    section["answer"] = final_answer(section)
    assert section["verify"]["max_batch_size"] == 217 and section["verify"]["real_trials"] == 2
    assert section["answer"] == {
        "max_batch_size": 217,
        "source": "verify",
        "real_trials": 2,
        "margin_applied": False,
    }
    assert section["max_batch_size"] == 211  # the estimate's key is kept as it was
    lines = headline(section).plain.splitlines()
    assert lines[0] == "Largest batch size: 217"
    assert lines[2] == (
        "  verified with 2 real trials at the full budget; the estimate said 211 with the 5% "
        "margin, 217 without, from 63 estimates"
    )
    assert "Verified with" not in str(render_fit(section))  # no second, competing answer


def test_a_report_saved_before_the_answer_key_gets_the_same_headline():
    section = saved_fit()["fit"]
    section["verify"] = recorded_verify([218, 225])
    del section["answer"]
    assert headline(section).plain.splitlines()[2].startswith("  verified with 2 real trials")


def test_a_failed_verification_leaves_the_estimate_as_the_answer():
    section = saved_fit()["fit"]
    section["verify"] = {
        "max_batch_size": None,
        "error": "trial at batch 218 crashed (not an OOM): x",
    }
    section["answer"] = final_answer(section)
    assert section["answer"]["source"] == "estimate"
    lines = headline(section).plain.splitlines()
    assert lines[0] == "Largest batch size: 211"
    assert lines[3] == (
        "Not verified: trial at batch 218 crashed (not an OOM): x; the answer is the estimate's"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_verify_without_a_gpu_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "fit", "example:cnn", "--budget", "1GiB", "--verify"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "vramscope: error: --verify runs real trials and needs a CUDA GPU; this machine has "
        "none (drop --verify for the estimate alone)"
    ]


def test_the_html_report_leads_with_the_verified_answer_too():
    from vramscope.report import html
    from vramscope.report.model import Report

    report = Report.load(DATA / "fit_cpu_cnn_2g.json")
    section = report.extra["fit"]
    section["verify"] = recorded_verify([218, 225])
    section["answer"] = final_answer(section)
    page = html.render(report)
    assert "Largest batch size: 217" in page
    assert (
        "verified with 2 real trials at the full budget; the estimate said 211 with the 5% "
        "margin, 217 without, from 63 estimates" in page
    )
