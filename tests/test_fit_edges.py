"""The edge of memory under a cap, against what an H200 did.

``tests/data/fit_edges_h200.json`` (``tests/gpu/record_fit_edges.py``) lists, for the example
CNN under 2 GiB and 6 GiB budgets, which batch sizes ran and which ran out of memory, each a
``fit --verify`` trial in a fresh capped process; ``alloc_trace_h200_cnn_*`` are the
allocator traces of four of those trials. The ``op_trace_h200_example-cnn-b128-*`` files
are op-tagged traces of the strategies ``compare`` measures.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from vramscope.estimate.allocator import events_from_device_trace, replay
from vramscope.fit.search import Estimator, _at_the_edges, lowest_failure, make_target
from vramscope.fit.strategies import get_strategy

DATA = Path(__file__).parent / "data"
GiB = 2**30
H200_TOTAL = 150_110_011_392  # what the trials' torch reported as the GPU's total memory


def _recorded() -> dict[int, dict[int, dict]]:
    doc = json.loads((DATA / "fit_edges_h200.json").read_text())
    out: dict[int, dict[int, dict]] = {}
    for t in doc["trials"]:
        out.setdefault(t["budget_gib"], {})[t["batch_size"]] = t
    return out


RECORDED = _recorded()


def _runs(gib: int, calls: list[int] | None = None):
    def fits(b: int) -> bool:
        if calls is not None and b not in calls:
            calls.append(b)
        return RECORDED[gib][b]["status"] == "fits"

    return fits


def test_the_gpu_is_not_monotone_at_the_edge():
    ran = [b for b, t in sorted(RECORDED[2].items()) if t["status"] == "fits"]
    assert 217 in ran and 218 not in ran and 219 not in ran and 224 in ran
    assert RECORDED[2][225]["status"] == "oom"
    assert all(RECORDED[6][b]["status"] == "fits" for b in range(671, 694))
    assert RECORDED[6][694]["status"] == "oom"


@pytest.mark.parametrize(
    "name, gib, batch",
    [("2g_b217", 2, 217), ("2g_b218", 2, 218), ("6g_b693", 6, 693), ("6g_b694", 6, 694)],
)
def test_capped_replay_of_a_trial_runs_out_where_the_gpu_did(name, gib, batch):
    """The simulator, capped as the trial was, fails exactly the requests the GPU failed
    (cuDNN's workspace attempts included) and ends with the trial's peaks."""
    with gzip.open(DATA / f"alloc_trace_h200_cnn_{name}.json.gz", "rt") as f:
        rows = [tuple(r) for r in json.load(f)["trace"]]
    result = replay(
        events_from_device_trace(rows).events,
        allowed_bytes=gib * GiB,
        device_total_bytes=H200_TOTAL,
        on_oom="continue",
    )
    assert result.num_ooms == sum(1 for r in rows if r[0] == "oom") > 0
    trial = RECORDED[gib][batch]
    assert result.peak_allocated_bytes == trial["allocated_bytes"]
    assert result.peak_reserved_bytes == trial["reserved_bytes"]


@pytest.fixture(scope="module")
def cnn_2g() -> Estimator:
    target = make_target(None, 2 * GiB, 0)
    return Estimator("example:cnn", target, get_strategy("baseline"), "32-true", None, None)


@pytest.mark.parametrize("batch", [217, 218, 219, 220])
def test_the_capped_estimate_runs_out_where_the_gpu_did(cnn_2g, batch):
    """cuDNN's smaller workspaces when one does not fit, its cached choice for later calls,
    and in-place gradient sums: the estimate runs and fails at the same batch sizes."""
    assert cnn_2g.fits(batch) == (RECORDED[2][batch]["status"] == "fits")
    peak = cnn_2g.report(batch).peak
    assert abs(peak.allocated_bytes - RECORDED[2][batch]["allocated_bytes"]) <= 2**20


def test_the_answer_stays_below_the_lowest_batch_that_runs_out():
    """From 225 (the first batch the H200 ran out at from above), every batch of the window
    below is looked at: 218 and 219 run out, so the answer is 217."""
    calls: list[int] = []
    assert lowest_failure(_runs(2, calls), 225) == 218
    assert set(range(217, 225)) <= set(calls)


def test_a_single_batch_that_runs_out_below_others_that_run_counts():
    """Every batch up to the answer must fit: one that runs out among ones that run ends the
    answer below it. The 8 batch sizes below one that runs out are each looked at, then
    every third down to 3% of it (24 at most)."""
    assert lowest_failure(lambda b: b != 688 and b < 694, 694) == 688
    assert lowest_failure(lambda b: b != 677 and b < 694, 694) == 677  # every third: 683 … 674
    calls: list[int] = []
    lowest_failure(lambda b: calls.append(b) or b < 694, 694)
    assert calls == [*range(693, 685, -1), 683, 680, 677, 674]


def test_batches_that_run_out_at_a_regular_spacing_are_followed_down_as_a_class():
    """The estimate of the example CNN on an RTX 4090 needs one more segment at every eighth
    batch size: from 1,670 on those run out while their neighbours fit up to 1,745. The
    search follows the class down in a few estimates instead of one window at a time."""
    calls: list[int] = []

    def fits(b: int) -> bool:
        calls.append(b)
        return b <= 1745 and not (b % 8 == 6 and b >= 1670)

    assert lowest_failure(fits, 1746) == 1670
    assert len(set(calls)) <= 40  # the windows below 1,746, the class, and below its lowest


def test_verify_confirms_an_exact_estimate_in_two_trials():
    calls: list[int] = []
    assert _at_the_edges(_runs(2, calls), [218, 225], 2048) == 217
    assert calls == [217, 218]
    calls = []
    assert _at_the_edges(_runs(6, calls), [694], 2048) == 693
    assert calls == [693, 694]


def test_verify_moves_past_an_edge_the_gpu_refutes():
    """Had the estimate put an edge at 675 (the GPU ran it), the next edge is the answer; an
    estimate one too high leaves the search to look below."""
    calls: list[int] = []
    assert _at_the_edges(_runs(6, calls), [675, 694], 2048) == 693
    assert calls == [674, 675, 693, 694]
    calls = []
    assert _at_the_edges(_runs(2, calls), [219], 2048) is None
    assert calls == [218]


@pytest.mark.parametrize("strategy", ["bf16-mixed", "checkpointing"])
def test_compare_saving_matches_the_recorded_runs(strategy):
    """compare's estimated saving of reserved memory against the recorded runs at batch 128
    (fp32 baseline, bf16-mixed, activation checkpointing): within 5 percentage points."""

    def recorded(name: str) -> int:
        with gzip.open(DATA / f"op_trace_h200_example-cnn-b128-{name}.json.gz", "rt") as f:
            return json.load(f)["stats"]["reserved_bytes.all.peak"]

    target = make_target("h200", None, 0)

    def estimated(name: str) -> int:
        est = Estimator("example:cnn", target, get_strategy(name), "32-true", None, None)
        return est.report(128).peak.reserved_bytes

    base = recorded("fp32")
    measured = 100 * (1 - recorded({"bf16-mixed": "bf16"}.get(strategy, "ckpt")) / base)
    est_base = estimated("baseline")
    saving = 100 * (1 - estimated(strategy) / est_base)
    assert abs(saving - measured) <= 5
    assert abs(est_base / base - 1) <= 0.05


def test_the_estimate_allocates_what_the_gpu_allocated_one_for_one():
    """The example CNN at batch 217 under 2 GiB: the estimate's allocation requests, in
    order, against the trial's (allocator rounding applied). Equal but for the float32
    split-K partials of some weight gradients (within 2 MiB each)."""
    from vramscope.estimate.profiles import get_profile
    from vramscope.estimate.trace import trace_workload
    from vramscope.workload import resolve

    with gzip.open(DATA / "alloc_trace_h200_cnn_2g_b217.json.gz", "rt") as f:
        rows = json.load(f)["trace"]
    # the cap made cuDNN try other workspaces only from the second step on: compare the first
    gpu = [(r[2] + 511) // 512 * 512 for r in rows if r[0] == "alloc" and r[2] > 0]
    trace = trace_workload(resolve("example:cnn"), 217, get_profile("h200"), "32-true", steps=1)
    est = [(e[2] + 511) // 512 * 512 for e in trace.events if e[0] == "alloc" and e[2] > 0]
    n = len(est)  # build, set-up and the first step
    assert n > 300 and len(gpu) > n
    same = sum(a == b for a, b in zip(est, gpu[:n], strict=True))
    close = sum(abs(a - b) <= 2 * 2**20 for a, b in zip(est, gpu[:n], strict=True))
    assert close == n
    assert same >= 0.95 * n
