"""``--detail modules`` on a schedule: which steps place module markers, and what the report
says about the others (real CPU runs; the schedule's arithmetic with a given clock)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import vramscope
from test_attribution import TinyLM, rows_by_name
from test_cli import vramscope_here as vramscope_cli
from vramscope.errors import VramscopeError
from vramscope.report.words import ranges
from vramscope.tracking import hooks
from vramscope.tracking.events import ENTER, STEP
from vramscope.tracking.marking import (
    CALIBRATION,
    FIRST_STEPS,
    MAX_INTERVAL,
    PROBE_EVERY,
    MarkerSchedule,
    check_policy,
    compress,
)


class StepClock:
    """Time that advances by a given step time per step (marked steps take longer)."""

    def __init__(self, plain_s: float, marked_s: float) -> None:
        self.now = 0.0
        self.plain_s, self.marked_s = plain_s, marked_s

    def __call__(self) -> float:
        return self.now


def run_schedule(policy, steps: int, plain_s: float = 0.01, marked_s: float = 0.01) -> list[int]:
    clock = StepClock(plain_s, marked_s)
    schedule = MarkerSchedule(policy, clock=clock)
    for i in range(steps):
        marked = schedule.begin(i)
        clock.now += marked_s if marked else plain_s
    return schedule.marked_steps


def test_all_marks_every_step_and_a_number_marks_every_nth_after_the_first():
    assert run_schedule("all", 10) == list(range(10))
    assert run_schedule(4, 15) == [0, 1, 2, 6, 10, 14]
    assert run_schedule(1, 5) == [0, 1, 2, 3, 4]


def test_auto_marks_every_step_when_markers_are_cheap_and_probes_now_and_then():
    marked = run_schedule("auto", 200, plain_s=0.100, marked_s=0.101)  # markers add 1%
    unmarked = sorted(set(range(200)) - set(marked))
    assert marked[:FIRST_STEPS] == [0, 1, 2]
    # steps of the run's own timed against marked ones, alternately, then a probe now and then
    assert unmarked[:CALIBRATION] == [3, 5, 7, 9]
    assert len(unmarked) <= CALIBRATION + 200 // PROBE_EVERY


def test_auto_spaces_marked_steps_by_what_the_markers_cost():
    # markers add 20% to a short step: one step in 10 keeps the average near 2%
    schedule = MarkerSchedule("auto", clock=(clock := StepClock(0.01, 0.012)))
    for i in range(100):
        clock.now += clock.marked_s if schedule.begin(i) else clock.plain_s
    assert schedule.interval == 10
    settled = [i for i in schedule.marked_steps if i > FIRST_STEPS + 2 * CALIBRATION]
    assert {b - a for a, b in itertools.pairwise(settled)} == {10}
    # markers that double the step: capped
    assert MarkerSchedule("auto").interval == 1
    capped = MarkerSchedule("auto", clock=(clock := StepClock(0.001, 0.2)))
    for i in range(10):
        clock.now += clock.marked_s if capped.begin(i) else clock.plain_s
    assert capped.interval == MAX_INTERVAL


def test_policies_are_checked_and_ranges_are_written_short():
    assert check_policy("7") == 7 and check_policy("auto") == "auto"
    for bad in ("sometimes", 0, -3, "2.5", True):
        with pytest.raises(VramscopeError, match="module steps must be"):
            check_policy(bad)
    assert compress([0, 1, 2, 6, 10, 11]) == [[0, 2], [6, 6], [10, 11]]
    assert ranges([[0, 2], [6, 6], [10, 10]]) == "0–2, 6 and 10"
    assert ranges([[i, i] for i in range(9)], limit=3) == "0, 1, 2 and 6 more runs"


def train_batches(model: nn.Module, batches: list[int], seq: int = 16) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in batches:
        idx = torch.randint(0, 50, (batch, seq))
        loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def tracked_batches(batches: list[int], module_steps) -> tuple[vramscope.Session, list[float]]:
    torch.manual_seed(0)
    model = TinyLM()
    with vramscope.track(detail="modules", device="cpu", module_steps=module_steps) as session:
        losses = train_batches(model, batches)
    return session, losses


def steps_with_markers(session: vramscope.Session) -> set[int]:
    """The steps whose records hold a module's ENTER marker."""
    found, step = set(), None
    for record in session._attribution.event_log().records:
        if record[0] == STEP:
            step = record[1]
        elif record[0] == ENTER:
            found.add(step)
    return found


def test_steps_without_markers_place_none_and_leave_module_tables_unchanged():
    batches = [8] * 12
    sampled, losses = tracked_batches(batches, 4)
    full, full_losses = tracked_batches(batches, "all")
    assert losses == full_losses  # the schedule changes nothing the model computes
    assert steps_with_markers(sampled) == {0, 1, 2, 6, 10}
    assert steps_with_markers(full) == set(range(12))
    assert not hooks._INSTANCES  # every module's calls reach nn.Module directly again
    report, reference = sampled.report(), full.report()
    attribution = report.extra["attribution"]
    assert attribution["module_steps"]["marked_steps"] == [[0, 2], [6, 6], [10, 10]]
    assert attribution["module_steps"]["unmarked_steps"] == 7
    assert attribution["module_peak"] is None  # the peak is in a marked step
    assert any(
        "module markers were placed in 5 of 12 steps (0–2, 6 and 10): the first 3 steps, then "
        "one step in every 4" in n
        for n in report.extra["attribution_notes"]
    )
    rows, ref_rows = rows_by_name(report), rows_by_name(reference)
    for name in ("", "blocks.0", "blocks.1.fc2", "head"):
        for key in ("activations_bytes", "parameters_bytes", "optimizer_state_bytes", "calls"):
            assert rows[name][key] == ref_rows[name][key], (name, key)
    assert report.categories_at_peak == reference.categories_at_peak
    assert "module markers" not in " ".join(reference.extra["attribution_notes"])


def test_a_peak_in_a_step_without_markers_is_said_and_modules_describe_a_marked_one():
    # step 4 (no markers with --module-steps 4) takes twice the batch: the run's peak
    session, _ = tracked_batches([8, 8, 8, 8, 16, 8, 8, 8], 4)
    report = session.report()
    attribution = report.extra["attribution"]
    assert attribution["peak_step"] == 4
    module_peak = attribution["module_peak"]
    assert module_peak is not None and module_peak["step"] in (0, 1, 2, 6)
    assert module_peak["allocated_bytes"] < attribution["peak_bytes"]
    # the categories are the run's peak's, exact without markers
    assert report.categories_at_peak.total() == pytest.approx(attribution["peak_bytes"], rel=0.01)
    notes = " ".join(report.extra["attribution_notes"])
    assert "the run's peak was in step 4, which has no module markers" in notes
    rows = rows_by_name(report)
    assert rows["blocks.0"]["activations_bytes"] > 0 and rows["head"]["calls"] == 1


def test_bad_module_steps_is_one_line_and_exit_2():
    result = vramscope_cli(
        "measure", "example:cnn", "--detail", "modules", "--module-steps", "often"
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "module steps must be auto, all, first or a number" in lines[0]


def test_a_slow_first_marked_step_does_not_stretch_the_interval():
    """Step 1 recompiles (20x its usual time): the markers' cost is read from the quickest
    steps, so the spacing is what the markers cost, not the recompilation."""
    times = {1: 0.2}  # marked, slowed by something else
    clock = StepClock(0.01, 0.0105)  # markers add 5%
    schedule = MarkerSchedule("auto", clock=clock)
    for i in range(40):
        marked = schedule.begin(i)
        clock.now += times.get(i, clock.marked_s if marked else clock.plain_s)
    assert schedule.interval == 3  # ceil(5% / 2%)


def test_work_charged_to_the_marked_step_before_widens_the_spacing():
    # closing a marked step's window of the allocator's trace happens at the start of the
    # next step: its time belongs to the marked step, not to the step without markers
    def spacing(charge_s: float) -> int:
        clock = StepClock(0.010, 0.0105)  # markers add 5%: one step in 3
        schedule = MarkerSchedule("auto", clock=clock)
        previous = False
        for i in range(40):
            marked = schedule.begin(i)
            if previous and not marked:
                clock.now += charge_s  # the work itself, done now
                schedule.charge(charge_s)
            previous = marked
            clock.now += clock.marked_s if marked else clock.plain_s
        return schedule.interval

    assert spacing(0.0) == 3
    assert spacing(0.001) == 8  # 15% a marked step: one in 8 keeps them near 2%


def test_the_cost_is_read_against_neighbouring_steps_so_drift_cancels():
    """The device's speed drifts: here the whole run slows down by a third over 60 steps, and
    one marked step (6) ran at a moment the clock was up, faster than any step without
    markers. Markers add 20% throughout: one step in 10 keeps them near 2%."""
    clock = StepClock(0.01, 0.012)
    schedule = MarkerSchedule("auto", clock=clock)
    for i in range(60):
        marked = schedule.begin(i)
        speed = (1 + i / 180) * (0.75 if i == 6 else 1.0)
        clock.now += speed * (clock.marked_s if marked else clock.plain_s)
    assert schedule.interval == 10
    settled = [i for i in schedule.marked_steps if i > FIRST_STEPS + 2 * CALIBRATION]
    assert {b - a for a, b in itertools.pairwise(settled)} == {10}
