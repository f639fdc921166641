"""Which steps read the allocator at every phase boundary (the default detail, on CUDA).

A phase's exact peak takes one read of the allocator's counters, and a reset of their peaks,
at each phase boundary: about 15 µs in a tight loop, 75-110 µs with the bookkeeping around it
inside a real launch-bound step (measured on an NVIDIA H200 host). On a step of 100 ms that
is nothing; on a step of 3-15 ms (a batch-1 inference, a small GPT) it was 2-5 % of the step.
The steps of a loop repeat, so on CUDA:

- ``"all"``: every step is read phase by phase;
- an integer N: the first ``FIRST_STEPS`` steps, then every N-th;
- ``"auto"`` (the default): the first ``FIRST_STEPS`` steps, then every step while the reads
  take at most ``EVERY_STEP_SHARE`` of a step (an ordinary step of tens of milliseconds keeps
  one report entry per step), else 1 step in N, N chosen so that they take ``COST_SHARE`` on
  average. The share is vramscope's own time at the step's phase boundaries over the rest of
  the step, the median of the last ``SHARES`` read steps. A read step followed by an unread
  one costs one read more: the first boundary of the unread step reads too, to close the
  read step's last phase with its exact peak (``closing_cost``); a batch-1 inference, one
  phase a step, pays twice what its read step's own boundaries say.

A step between two read steps reads nothing. The allocator's peak counters are then not reset
until the next read, at the first boundary of the next read step, so that read returns the
exact highest point of all the steps in between. The session folds those steps into the read
step before them: the record stands for all of them, its phases keep the read step's peaks,
and its own peak is the exact highest of all. If the steps in between went above the run's
peak so far, every step is read again for ``AGAIN_STEPS`` steps, and the report says where
the peak was. A new pass over the data (an epoch, an evaluation loop) is always read.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from vramscope.tracking.marking import check_policy

# always read phase by phase: the first steps differ (optimizer state, caches); the first
# two warm up, the next ones' cost sets the spacing (each read step costs a launch-bound
# step 3-8 % of its time, so a session's start pays them all: see docs/tracking.md)
FIRST_STEPS = 5
# read again after unread steps went above the run's peak: a growing step (a leak) shows
# step by step, and a peak that comes back is caught phase by phase
AGAIN_STEPS = 16
COST_SHARE = 0.001  # "auto": what the reads may take of a step on average, once spaced
EVERY_STEP_SHARE = 0.005  # "auto": up to this share, every step is read
MAX_INTERVAL = 64
SHARES = 8  # "auto": read steps whose cost share decides the spacing


def check_phase_policy(policy: str | int) -> str | int:
    """``"auto"``, ``"all"`` or a whole number of steps ≥ 1 (also given as text)."""
    return check_policy(policy, "phase steps", ("auto", "all"))


class ReadSchedule:
    """Says, as each step begins, whether it reads the allocator at its phase boundaries."""

    def __init__(self, policy: str | int = "auto") -> None:
        self.policy = check_phase_policy(policy)
        self.interval = policy if isinstance(policy, int) else 1
        self._shares: deque[float] = deque(maxlen=SHARES)
        self._last_rest: float | None = None  # the rest of the read step whose share came last
        self._open: tuple[float, bool] | None = None  # (start, read) of the open step
        self._count = 0  # steps begun
        self._since_read = 0
        self._again = FIRST_STEPS  # steps still read whatever the spacing
        self.read_steps = 0
        self.unread_steps = 0
        self.first_unread: int | None = None  # index of the first step not read (the session's)
        # steps from now that read nothing whatever happens (unless ``again``): the session
        # turns them over without asking and counts them in ``skipped``, settled at the next
        # ``begin`` (a launch-bound step cannot afford the call)
        self.ahead = 0
        self.skipped = 0

    def begin(self, now: float, cost_s: float, force: bool = False) -> bool:
        """A step begins at ``now``; the step before took ``cost_s`` of vramscope's time at
        its boundaries. ``force``: a step that must be read (the first, a new pass)."""
        self._settle()
        self._last_rest = None
        if self._open is not None:
            start, read = self._open
            rest = now - start - cost_s
            if read and rest > 0 and self._count > 2:  # the first steps warm up
                self._shares.append(cost_s / rest)
                self._last_rest = rest
                self._update_interval()
        read = self._decide(force)
        self._open = (now, read)
        self._count += 1
        if read:
            self.read_steps += 1
            self._since_read = 0
        else:
            self.unread_steps += 1
            self._since_read += 1
        unread_next = self.interval - 1 - self._since_read  # what _decide will say
        self.ahead = unread_next if self._again == 0 and self.policy != "all" else 0
        return read

    def closing_cost(self, cost_s: float) -> None:
        """The first boundary of an unread step after a read one took ``cost_s``: it read
        the allocator to close the read step's last phase, so it is that step's cost."""
        if self._last_rest is not None and self._shares:
            self._shares[-1] += cost_s / self._last_rest
            self._last_rest = None
            self._update_interval()

    def _settle(self) -> None:
        """Count the steps turned over without ``begin`` (all unread)."""
        skipped = self.skipped
        if skipped:
            self.skipped = 0
            self._count += skipped
            self.unread_steps += skipped
            self._since_read += skipped
            self._open = None  # the step before was not read: no share to take

    def again(self, steps: int = AGAIN_STEPS) -> None:
        """Read every step from now on for ``steps`` steps (something changed)."""
        self._again = max(self._again, steps)
        self.ahead = 0

    def forget(self, read: bool) -> None:
        """A step turned out empty (no forward, backward or optimizer step): not one of the
        run's steps."""
        self._settle()
        self._count = max(0, self._count - 1)
        if read:
            self.read_steps = max(0, self.read_steps - 1)
        else:
            self.unread_steps = max(0, self.unread_steps - 1)

    def _decide(self, force: bool) -> bool:
        if self._again > 0:
            self._again -= 1
            return True
        if force or self.policy == "all":
            return True
        return self._since_read + 1 >= self.interval

    def _update_interval(self) -> None:
        if self.policy != "auto" or not self._shares:
            return
        share = statistics.median_high(self._shares)
        if share <= EVERY_STEP_SHARE:
            self.interval = 1
        else:
            self.interval = max(1, min(MAX_INTERVAL, math.ceil(share / COST_SHARE - 1e-9)))

    def summary(self) -> dict[str, object]:
        """What the report says about the schedule; ``read_cost_share``: what the reads took of
        a step, as measured on the read steps (median), spread over the spacing."""
        self._settle()
        share = statistics.median_high(self._shares) / self.interval if self._shares else None
        return {
            "policy": self.policy,
            "interval": self.interval,
            "read_cost_share": round(share, 6) if share is not None else None,
            "steps": self._count,
            "read_steps": self.read_steps,
            "unread_steps": self.unread_steps,
            "first_unread_step": self.first_unread,
        }
