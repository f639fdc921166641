"""Which steps of a run place per-module markers (``--detail modules``).

Every module call that places a marker costs a few microseconds of Python (its class's call
wrapper, the marker, a hook on the autograd node of its output, the hook's call in
backward). On a long step that is noise; on a short, launch-bound step (a small GPT, a
batch-1 inference) it adds tens of percent. The steps of a training or inference loop repeat
the same allocations, so the per-module tables need a few of them, not all:

- ``"all"``: every step is marked (as before; also what ``--detail lines`` and snapshots use);
- an integer N: the first steps, then every N-th;
- ``"first"``: the first steps only (and the steps asked for, below);
- ``"auto"`` (the default): the first steps, then steps without and with markers
  alternately until ``CALIBRATION`` of each are timed, then every step while markers add at
  most ``COST_SHARE`` to a step without them, else every N-th step with N chosen so that
  they add that much on average. What they add is read from pairs: each marked step's time
  over the mean of the unmarked steps just before and after it, the median of the last
  ``PAIRS`` pairs. A GPU's speed drifts by tens of percent over seconds on short steps;
  neighbours share the drift, so their ratio keeps only the markers' cost, and the median
  leaves out a step slowed by something else (a recompilation, an evaluation).

Steps without markers are still in every phase peak (those never depend on markers); on
CUDA the allocator's trace runs only in the marked steps (its entries cost about half a
microsecond each). When the run's peak rises in a step without markers, the next step that
reads its phases is marked (:meth:`MarkerSchedule.mark_next`): steps repeat, so the peak
comes again where the trace sees it. The report says which steps carry module markers, and
the module tables describe the highest point among them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

from vramscope.errors import VramscopeError

FIRST_STEPS = 3  # always marked: the first step differs (optimizer state, warm-up)
COST_SHARE = 0.02  # "auto": what markers may add to the run's step time, on average
MAX_INTERVAL = 50
CALIBRATION = 4  # "auto": steps timed with and without markers before the spacing is trusted
PROBE_EVERY = 16  # "auto" with every step marked: a step without markers this often
SETTLED = FIRST_STEPS + 2 * CALIBRATION - 1  # "auto": the first step on the settled spacing
PAIRS = 8  # "auto": marked steps (each against its unmarked neighbours) the cost is read from
POLICIES = ("auto", "all", "first")


def check_policy(
    policy: str | int, what: str = "module steps", names: tuple[str, ...] = POLICIES
) -> str | int:
    """One of ``names`` or a whole number of steps ≥ 1 (also given as text); ``what`` names
    the option in the error."""
    if isinstance(policy, str) and policy.strip().isdigit():
        policy = int(policy.strip())
    if isinstance(policy, bool) or not (
        policy in names or (isinstance(policy, int) and policy >= 1)
    ):
        raise VramscopeError(
            f"{what} must be {', '.join(names)} or a number of steps (1 or more), not {policy!r}"
        )
    return policy


class MarkerSchedule:
    """Says, at the start of each step, whether that step places module markers."""

    def __init__(self, policy: str | int = "auto", clock=time.perf_counter) -> None:
        self.policy = check_policy(policy)
        self.interval = policy if isinstance(policy, int) else 1
        self._clock = clock
        self._marked_s: deque[float] = deque(maxlen=8)  # step times with markers
        self._plain_s: deque[float] = deque(maxlen=8)  # and without
        # marked steps waiting for the next unmarked one: (time, the unmarked one before)
        self._waiting: list[tuple[float, float | None]] = []
        self._last_plain: float | None = None
        self._ratios: deque[float] = deque(maxlen=PAIRS)  # marked / its unmarked neighbours
        self._open: tuple[float, bool, int] | None = None  # (start, marked, count) of the open step
        self._count = 0  # steps begun
        self._since_mark = 0  # steps begun since the last marked one
        self._since_probe = 0
        self.marked_steps: list[int] = []
        self.unmarked = 0
        self._asked = False  # mark the next step that may be marked

    def mark_next(self) -> None:
        """Mark the next step (one that reads its phases): the run's peak rose in a step
        without markers."""
        self._asked = True

    def begin(self, index: int, allowed: bool = True) -> bool:
        """Step ``index`` begins (the previous one ended now): mark it or not (never when
        not ``allowed``: a step that reads no phase)."""
        now = self._clock()
        if self._open is not None:
            start, marked, count = self._open
            if count > 0:  # the first step is warm-up, not the run's step
                self._record(marked, now - start, count)
        mark = allowed and (self._decide() or self._asked)
        if mark:
            self._asked = False
        self._open = (now, mark, self._count)
        self._count += 1
        if mark:
            self.marked_steps.append(index)
            self._since_mark = 0
        else:
            self.unmarked += 1
            self._since_mark += 1
        return mark

    def charge(self, seconds: float) -> None:
        """Work done at the start of this step on behalf of the marked step before it (its
        window of the allocator's trace, taken now): counted in that step's time, not this."""
        if self._open is None or self._open[1]:
            return
        start, marked, count = self._open
        self._open = (start + seconds, marked, count)
        if self._marked_s:
            self._marked_s[-1] += seconds
        if self._waiting:
            taken, before = self._waiting[-1]
            self._waiting[-1] = (taken + seconds, before)
        self._update_interval()

    def forget(self, index: int) -> None:
        """Step ``index`` turned out empty (no forward, backward or optimizer step): it is
        not one of the run's steps."""
        if index in self.marked_steps:
            self.marked_steps.remove(index)
        elif self.unmarked:
            self.unmarked -= 1
        else:
            return
        self._count -= 1

    def _decide(self) -> bool:
        if self.policy == "all" or self._count < FIRST_STEPS:
            return True
        if self.policy == "first":
            return False
        if self.policy == "auto":
            if len(self._plain_s) < CALIBRATION or len(self._marked_s) < CALIBRATION:
                # time steps of the run's own against steps with markers, alternately, so
                # that one step slowed by something else cannot decide the spacing
                return not self._open[1] if self._open is not None else False
            self._since_probe += 1
            if self.interval == 1:
                if self._since_probe >= PROBE_EVERY:  # keep that time current
                    self._since_probe = 0
                    return False
                return True
        return self._since_mark + 1 >= self.interval

    def _record(self, marked: bool, seconds: float, count: int) -> None:
        """A step's time: kept, and paired (a marked step with its unmarked neighbours)."""
        (self._marked_s if marked else self._plain_s).append(seconds)
        if marked:
            if count >= FIRST_STEPS:  # the first steps differ from the run's (warm-up)
                self._waiting.append((seconds, self._last_plain))
                del self._waiting[:-PROBE_EVERY]
        else:
            for taken, before in self._waiting:
                reference = seconds if before is None else (before + seconds) / 2
                if reference > 0:
                    self._ratios.append(taken / reference)
            self._waiting.clear()
            self._last_plain = seconds
        self._update_interval()

    def _update_interval(self) -> None:
        if self.policy != "auto" or not self._marked_s or not self._plain_s:
            return
        if self._ratios:
            added = statistics.median_high(self._ratios) - 1
        else:
            # no pair yet: the quickest of each (a step slowed by something else, a
            # recompilation or cuDNN's first choice, says nothing about the markers)
            plain = min(self._plain_s)
            if plain <= 0:
                return
            added = min(self._marked_s) / plain - 1
        self.interval = max(1, min(MAX_INTERVAL, math.ceil(added / COST_SHARE - 1e-9)))

    def summary(self) -> dict[str, object]:
        """What the report says about the schedule."""
        return {
            "policy": self.policy,
            "interval": self.interval,
            "marked_steps": compress(self.marked_steps),
            "steps": self._count,
            "unmarked_steps": self.unmarked,
        }


def compress(indices: list[int]) -> list[list[int]]:
    """Sorted step indices as ``[first, last]`` ranges."""
    out: list[list[int]] = []
    for i in indices:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def expand(ranges: list[list[int]]) -> set[int]:
    return {i for first, last in ranges for i in range(first, last + 1)}
