"""Phase reads on a schedule (CUDA, the default detail): which steps read the allocator at
their phase boundaries, and how the steps between are folded into the record before them
(the schedule's arithmetic with given times; the records' folding with given bytes; the
CPU run, which reads nothing and so keeps every step)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import vramscope
from test_cli import vramscope_here as vramscope_cli
from vramscope.errors import VramscopeError
from vramscope.report.model import PhaseStats
from vramscope.tracking.phase_reads import (
    COST_SHARE,
    FIRST_STEPS,
    MAX_INTERVAL,
    ReadSchedule,
    check_phase_policy,
)
from vramscope.tracking.records import StepHistory, StepRecord


def run(schedule: ReadSchedule, steps: int, step_s: float, cost_s: float, force=()) -> list[int]:
    """The steps read; a read step costs ``cost_s`` more at its boundaries."""
    read, now, cost = [], 0.0, 0.0
    for i in range(steps):
        if schedule.begin(now, cost, force=i in force):
            read.append(i)
            cost = cost_s
        else:
            cost = 0.0
        now += step_s + cost
    return read


def test_the_first_steps_are_read_then_one_in_n_by_what_the_reads_cost():
    schedule = ReadSchedule("auto")
    # reads take 100 µs of a 4 ms step (2.5 %): 1 step in 2.5 % / COST_SHARE (0.1 %) = 25
    read = run(schedule, 80, step_s=0.004, cost_s=0.0001)
    assert read[:FIRST_STEPS] == list(range(FIRST_STEPS))
    assert schedule.interval == round(0.025 / COST_SHARE)
    later = [i for i in read if i >= FIRST_STEPS]
    assert all(b - a == schedule.interval for a, b in itertools.pairwise(later))
    summary = schedule.summary()
    assert summary["read_steps"] + summary["unread_steps"] == summary["steps"] == 80


def test_cheap_reads_read_every_step_and_a_tiny_step_caps_the_spacing():
    assert run(ReadSchedule("auto"), 60, step_s=0.2, cost_s=0.0001) == list(range(60))
    # reads at 0.4 % of a 50 ms step: every step keeps its entry; at 0.6 %, spaced to 0.1 %
    assert run(ReadSchedule("auto"), 60, step_s=0.05, cost_s=0.0002) == list(range(60))
    schedule = ReadSchedule("auto")
    run(schedule, 60, step_s=0.05, cost_s=0.0003)
    assert schedule.interval == math.ceil(0.006 / COST_SHARE)
    schedule = ReadSchedule("auto")
    run(schedule, 60, step_s=0.0002, cost_s=0.0002)  # reads double a 0.2 ms step
    assert schedule.interval == MAX_INTERVAL


def test_the_read_that_closes_a_read_step_counts_as_its_cost():
    """A read step followed by an unread one is closed by a read at the unread step's first
    boundary: that read is the read step's cost too, so the spacing doubles where it costs as
    much as the read step's own (a batch-1 inference: one boundary a step)."""

    def spacing(told: bool) -> int:
        schedule, now, read_before = ReadSchedule("auto"), 0.0, False
        for _ in range(FIRST_STEPS + 8 * 60):
            read = schedule.begin(now, 0.0001 if read_before else 0.0)
            if told and read_before and not read:
                schedule.closing_cost(0.0001)  # the first unread step's boundary read
                schedule.closing_cost(0.0001)  # told once per read step: ignored
            read_before = read
            now += 0.004 + (0.0001 if read else 0.0)
        return schedule.interval

    assert spacing(told=False) == math.ceil(0.025 / COST_SHARE)
    assert spacing(told=True) == min(MAX_INTERVAL, math.ceil(0.05 / COST_SHARE))


def test_all_number_force_and_again():
    assert run(ReadSchedule("all"), 40, 0.001, 0.001) == list(range(40))
    read = run(ReadSchedule(4), 40, 0.001, 0.001, force={30})
    # every 4th after the first steps; 30: a new pass, read, and the spacing counts from it
    assert read == [*range(FIRST_STEPS), *range(FIRST_STEPS + 3, 30, 4), 30, 34, 38]
    schedule = ReadSchedule(8)
    run(schedule, 30, 0.001, 0.0)
    schedule.again(3)
    assert [schedule.begin(1.0, 0.0) for _ in range(5)] == [True, True, True, False, False]


def test_steps_turned_over_without_asking_are_the_steps_the_schedule_would_skip():
    """The session turns over ``ahead`` steps without calling ``begin`` (a launch-bound step
    cannot afford the call): the same steps are read, and the counts come out the same."""
    for policy, step_s, cost_s in (("auto", 0.004, 0.0001), (5, 0.001, 0.0), ("all", 0.001, 0.0)):
        asked, told = ReadSchedule(policy), ReadSchedule(policy)
        read_asked, read_told, now, cost = [], [], 0.0, 0.0
        for i in range(120):
            force = i == 70  # a new pass: read whatever the spacing
            if asked.begin(now, cost, force=force):
                read_asked.append(i)
            if told.ahead > 0 and not force:
                told.ahead -= 1
                told.skipped += 1
            elif told.begin(now, cost, force=force):
                read_told.append(i)
            cost = cost_s if read_asked and read_asked[-1] == i else 0.0
            now += step_s + cost
        assert read_told == read_asked
        assert told.summary() == asked.summary()
    schedule = ReadSchedule(6)
    run(schedule, FIRST_STEPS, 0.001, 0.0)  # the last of them read: 5 unread to come
    assert schedule.ahead == 5
    schedule.again(2)  # a peak in the steps between: nothing is skipped any more
    assert schedule.ahead == 0


def test_phase_policies_are_checked():
    assert check_phase_policy(" 12 ") == 12
    assert check_phase_policy("all") == "all"
    for bad in ("often", 0, -3, True, 2.5):
        with pytest.raises(VramscopeError, match="phase steps must be auto, all or a number"):
            check_phase_policy(bad)


def test_bad_phase_steps_is_one_line_and_exit_2():
    result = vramscope_cli("measure", "example:cnn", "--phase-steps", "often")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "phase steps must be auto, all or a number" in lines[0]


def _read_step(index: int, peak: int) -> StepRecord:
    record = StepRecord(index=index, epoch=0, start_s=index, start_allocated=100, backwards=1)
    for name, offset in (("forward", 0), ("backward", 50), ("optimizer", -30)):
        record.phases[name] = PhaseStats(
            name=name, count=1, duration_s=0.001, peak_allocated_bytes=peak + offset, step=index
        )
    record.end_s = index + 1
    return record


def _unread_step(index: int, span_peak: int | None = None) -> StepRecord:
    record = StepRecord(
        index=index, epoch=0, start_s=index, start_allocated=None, backwards=1, reads=False
    )
    record.phase_times = {"forward": [1, 0.001], "backward": [1, 0.002], "optimizer": [1, 0.0]}
    record.unread_peak_allocated = span_peak
    record.unread_peak_reserved = span_peak
    return record


def test_unread_steps_fold_into_the_read_step_before_with_their_exact_peak():
    history = StepHistory()
    kept = _read_step(0, 1000)
    history.append(kept)
    for i in (1, 2):
        history.fold_into_last(_unread_step(i))
    history.fold_into_last(_unread_step(3, span_peak=1200))  # the read that closed 1-3
    (record,) = list(history)
    assert (record.count, record.last_index, history.total) == (4, 3, 4)
    assert record.phases["backward"].peak_allocated_bytes == 1050  # the read step's
    assert record.phases["backward"].count == 4
    assert record.phases["backward"].duration_s == pytest.approx(0.001 + 3 * 0.002)
    assert record.unread_peak_allocated == 1200 and not record.reads


def test_the_record_the_session_holds_for_the_peak_is_copied_not_folded():
    history = StepHistory()
    peak_step = _read_step(0, 1000)
    history.append(peak_step)
    history.fold_into_last(_unread_step(1, span_peak=900), keep=peak_step)
    (record,) = list(history)
    assert record is not peak_step and record.count == 2
    assert peak_step.count == 1 and peak_step.phases["forward"].count == 1  # untouched


def test_a_cpu_run_reads_nothing_and_keeps_every_step() -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with vramscope.track(phase_steps=2) as session:
        for _ in range(FIRST_STEPS + 10):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    report = session.report()
    assert len(report.steps) == FIRST_STEPS + 10
    assert all(s.count == 1 and s.micro_batches == 1 for s in report.steps)
    assert "phase_reads" not in report.extra
