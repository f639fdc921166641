"""ResNet-18 (SGD, fp32) under a 10 GiB cap, against what an H200 did.

``tests/data/fit_edge_h200_resnet18_b468.json.gz`` and ``..._b469.json.gz`` are the allocator
traces (``vramscope.fit.trial`` ``--history``, torch 2.11, cuDNN 9.19) of two ``fit --verify``
trials in fresh processes capped at 10 GiB: batch 468 ran its three steps (cuDNN's workspace
attempts ran out 46 times and it took other engines), batch 469 ran out in step 0's backward
on a 44.9 MiB gradient (46 MiB with the allocator's rounding), 123 MiB reserved but free in
pieces too small for it.

The simulator, replaying those traces capped as the trials were, runs out exactly where the
GPU did. The estimate allocates the same tensors (its peak at 468 is the trial's within
0.4 MiB) but still runs 469. cuDNN's heuristics pick engines by batch size: those of the 1x1
stride-2 downsamplings are modelled from a sweep over batch 32-512
(``tests/data/conv_batch_sweep_h200_resnet18.json.gz``), which moved the estimate's answer
from 470 to 469; the 512-channel 3x3 convolutions on 7x7 took 7.5 MiB more forward workspace
at 466-470 than the rules give (see ``test_the_capped_estimate_runs_out_at_469``), and the
segments those workspaces leave behind decide where the next 44.9 MiB block fits.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from vramscope.estimate.allocator import events_from_device_trace, replay
from vramscope.fit.search import Estimator, make_target
from vramscope.fit.strategies import get_strategy

DATA = Path(__file__).parent / "data"
GiB = 2**30
H200_TOTAL = 150_110_011_392  # what the trials' torch reported as the GPU's total memory
BUDGET = 10 * GiB

# the trials' peaks (memory_stats), as vramscope.fit.trial reported them
TRIALS = {
    468: {"status": "fits", "allocated_bytes": 10_592_677_888, "reserved_bytes": 10_733_223_936},
    469: {"status": "oom", "allocated_bytes": 10_573_498_368, "reserved_bytes": 10_703_863_808},
}


def _rows(batch: int) -> list[tuple[str, int, int, int]]:
    with gzip.open(DATA / f"fit_edge_h200_resnet18_b{batch}.json.gz", "rt") as f:
        doc = json.load(f)
    assert doc["schema"] == "vramscope.alloc_trace/1"
    return [tuple(r) for r in doc["trace"]]


@pytest.mark.parametrize("batch", [468, 469])
def test_capped_replay_of_resnet18_runs_out_where_the_gpu_did(batch: int) -> None:
    rows = _rows(batch)
    events = events_from_device_trace(rows)
    result = replay(
        events.events, allowed_bytes=BUDGET, device_total_bytes=H200_TOTAL, on_oom="continue"
    )
    trial = TRIALS[batch]
    assert result.num_ooms == events.num_ooms == sum(1 for r in rows if r[0] == "oom")
    assert result.peak_allocated_bytes == trial["allocated_bytes"]
    assert result.peak_reserved_bytes == trial["reserved_bytes"]
    assert result.oom_event_index is not None
    failed = events.events[result.oom_event_index]
    if trial["status"] == "oom":
        # the step's one failure: a gradient (no workspace, no other engine to fall back on),
        # whose 46 MiB segment no longer fits under the cap
        assert result.num_ooms == 1 and failed[2] == 469 * 512 * 7 * 7 * 4
        assert BUDGET - trial["reserved_bytes"] < 46 * 2**20
    else:
        # every failure was a cuDNN workspace attempt in a backward convolution, the least
        # of them input, output and weight of a 512-channel layer (its data gradient), after
        # which cuDNN took another engine and the step went on
        failures = [
            e[2]
            for e, addr in zip(
                (e for e in events.events if e[0] == "alloc"), events.alloc_addresses, strict=True
            )
            if addr is None
        ]
        assert len(failures) == 46
        assert min(failures) == 2 * 468 * 512 * 7 * 7 * 4 + 512 * 512 * 9 * 4 + 512


@pytest.fixture(scope="module")
def resnet18_10g() -> Estimator:
    pytest.importorskip("torchvision", reason="torchvision: workloads need torchvision")
    target = make_target(None, BUDGET, 0)
    return Estimator(
        "torchvision:resnet18@sgd", target, get_strategy("baseline"), "32-true", None, None
    )


def test_the_capped_estimate_allocates_what_the_gpu_allocated(resnet18_10g: Estimator) -> None:
    """Same tensors, same order: at batch 468 the capped estimate's peak allocated is the
    trial's within 1 MiB, and it runs, as the GPU did."""
    peak = resnet18_10g.report(468).peak
    assert abs(peak.allocated_bytes - TRIALS[468]["allocated_bytes"]) <= 2**20
    assert resnet18_10g.fits(468)


@pytest.mark.xfail(
    strict=True,
    reason="cuDNN's engines at batch 469 differ from those the estimator models: the "
    "512-channel 3x3 convolutions on 7x7 took 111.4 MB of forward workspace (input, output "
    "and weight and 7.5 MiB more; the estimate: 103.6 MB). The 1x1 stride-2 downsamplings' "
    "batch-dependent engines are modelled now (tests/data/conv_batch_sweep_h200_resnet18): "
    "the estimate's answer moved from 470 to 469, one batch above the GPU's 468",
)
def test_the_capped_estimate_runs_out_at_469(resnet18_10g: Estimator) -> None:
    assert not resnet18_10g.fits(469)
