"""``--detail modules`` on a schedule, on a real GPU: short steps place markers in a sample
of steps, the peaks stay exact, and a peak in a step without markers is said.

Run with: python -m pytest -q -m gpu tests/gpu/test_marking_gpu.py
"""

from __future__ import annotations

import gc

import pytest
import torch

import vramscope
from test_marking import steps_with_markers
from vramscope.examples import build_gpt
from vramscope.tracking.marking import FIRST_STEPS, expand
from vramscope.workload import StepRunner

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def runner_for(batch: int) -> StepRunner:
    torch.manual_seed(0)
    runner = StepRunner(build_gpt(batch, CUDA), CUDA)
    runner()
    torch.cuda.synchronize()
    return runner


def tracked_steps(
    runner: StepRunner, steps: int, batches: dict | None = None, **options
) -> tuple[vramscope.Session, int]:
    """``steps`` steps under ``track(detail="modules")``; ``batches``: step -> batch function
    for that step. Returns the session and max_memory_allocated over the run."""
    usual = runner.workload.batch
    # what earlier tests left for the collector is freed now, not inside a traced step
    # (a model freed in step 0's forward raises that step's module peaks, not the next run's)
    gc.collect()
    torch.cuda.reset_peak_memory_stats()
    with vramscope.track(detail="modules", **options) as session:
        for i in range(steps):
            runner.workload.batch = (batches or {}).get(i, usual)
            runner()
            session.step()
    runner.workload.batch = usual
    torch.cuda.synchronize()
    return session, torch.cuda.max_memory_allocated()


def test_short_steps_are_marked_on_a_sample_and_peaks_stay_exact():
    """A small GPT at batch 2 (a few ms a step): `auto` leaves most steps unmarked."""
    session, expected = tracked_steps(runner_for(2), 60)
    report = session.report()
    attribution = report.extra["attribution"]
    schedule = attribution["module_steps"]
    marked = expand(schedule["marked_steps"])
    assert schedule["policy"] == "auto" and schedule["steps"] == 60
    assert set(range(FIRST_STEPS)) <= marked
    assert schedule["interval"] > 1 and schedule["unmarked_steps"] > 20, schedule
    assert steps_with_markers(session) == marked
    assert report.peak.allocated_bytes == expected  # phase peaks never depend on markers
    assert report.categories_at_peak.total() == pytest.approx(expected, rel=0.01)
    rows = {m["name"]: m for m in report.modules}
    assert rows["blocks.0"]["activations_bytes"] > 0
    assert not [n for n in report.extra["attribution_notes"] if "failed" in n]


def test_a_peak_in_a_step_without_markers_is_said_on_cuda():
    large = build_gpt(8, CUDA).batch  # same vocabulary and length, twice the batch
    session, expected = tracked_steps(runner_for(4), 8, {4: large}, module_steps=4)
    report = session.report()
    attribution = report.extra["attribution"]
    # steps 0-2, then 1 in 4 (6); the run's peak rose in step 4, which had no markers, so
    # the step after it is marked (steps repeat: the trace sees the peak come back there),
    # and the 1-in-4 spacing counts from it (step 9: past the run)
    assert steps_with_markers(session) == {0, 1, 2, 5}
    assert report.peak.allocated_bytes == expected
    assert attribution["peak_step"] == 4
    assert attribution["module_peak"]["step"] in (0, 1, 2, 5)
    assert report.categories_at_peak.total() == pytest.approx(expected, rel=0.01)
    notes = " ".join(report.extra["attribution_notes"])
    assert "the run's peak was in step 4, which has no module markers" in notes
    assert {m["name"] for m in report.modules} >= {"blocks.0", "lm_head"}


def test_the_trace_in_windows_gives_the_tables_of_a_fully_traced_run():
    # the same steps, traced in every step or only in the marked ones (module_steps=4:
    # steps 0-2 and 6): the module tables describe the same highest point, byte for byte
    runner = runner_for(4)
    tables = {}
    for policy in ("all", 4):
        torch.manual_seed(1)
        session, expected = tracked_steps(runner, 8, module_steps=policy)
        report = session.report()
        assert report.peak.allocated_bytes == expected
        trace = session._attribution.event_log().meta["trace"]
        assert trace.get("windows", 1) == (1 if policy == "all" else 3), trace
        keys = ("activations_bytes", "parameters_bytes", "forward_peak_allocated_bytes")
        tables[policy] = {m["name"]: [m.get(k) for k in keys] for m in report.modules}
    assert tables[4] == tables["all"]


def test_a_peak_that_rises_by_a_few_blocks_is_not_traced_again():
    """The run's peak rising by less than a MiB over what a traced step saw (the allocator
    placing a step's blocks a little differently, a small leak) does not make the next step
    traced; a rise of 16 MiB does."""
    runner = runner_for(4)
    kept = []
    gc.collect()
    with vramscope.track(detail="modules", module_steps="first") as session:
        for i in range(12):
            if i == 5:
                kept.append(torch.empty(64 * 1024, device=CUDA))  # 256 KiB, kept
            if i == 8:
                kept.append(torch.empty(4 << 20, device=CUDA))  # 16 MiB, kept
            runner()
            session.step()
    assert steps_with_markers(session) == {0, 1, 2, 9}
    assert session.report().extra["attribution"]["peak_step"] in (8, 9, 10, 11)
