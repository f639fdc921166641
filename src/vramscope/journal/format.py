"""What a journal's lines hold: one JSON object per line, the header first.

Every line is ``{"k": KIND, "t": SECONDS, ...}``, ``t`` counted from the session's start
(the report's clock). The header (``k`` ``"journal"``) names the schema, the versions, the
process and its command line, and the field names of the positional records that follow,
so that a reader needs nothing else:

- ``step``: a step entry of the report's step table, ``v`` positional (``fields.step``); a
  later line with the same index replaces it (a long run folds steps together, as the
  report's table does), and one whose ``last_index`` covers others replaces them;
- ``samples``: timeline samples (``fields.sample``), written at least once a second;
- ``peak``, ``objects``, ``startup``, ``device``, ``allocator``: the latest value of each;
- ``exit``: how the script ended (``exit``, and ``oom`` for an out-of-memory error), once
  it is known; ``end``: the same when the session stopped.

Step lines are positional (a list, about half the bytes and half the time to write of an
object with names); the others are written rarely and keep their names.
"""

from __future__ import annotations

from typing import Any

from vramscope.report.model import PhaseStats
from vramscope.tracking.records import StepRecord

SCHEMA = "vramscope.journal/1"
HEADER = "journal"

STEP_FIELDS = (
    "index",
    "epoch",
    "start_s",
    "end_s",
    "start_allocated",
    "end_allocated",
    "forwards",
    "backwards",
    "saw_optimizer",
    "grad_forward",
    "grads_live_at_start",
    "count",
    "last_index",
    "reads",
    "unread_peak_allocated",
    "unread_peak_reserved",
    "phases",
    "phase_times",
)
PHASE_FIELDS = (
    "name",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "start_allocated_bytes",
    "end_allocated_bytes",
    "duration_s",
    "count",
    "step",
)
SAMPLE_FIELDS = ("t", "allocated_bytes", "reserved_bytes", "device_used_bytes", "host_rss_bytes")
FIELDS = {"step": list(STEP_FIELDS), "phase": list(PHASE_FIELDS), "sample": list(SAMPLE_FIELDS)}


class BadRecord(ValueError):
    """A line that is JSON but not the record it says it is; the message says which part."""


def _time(value: float | None, t0: float) -> float | None:
    # not rounded: the report made from the journal computes the same times to the bit
    return None if value is None else value - t0


def encode_step(record: StepRecord, t0: float) -> list[Any]:
    """A step record as the positional list of ``STEP_FIELDS`` (times from ``t0``)."""
    return [
        record.index,
        record.epoch,
        _time(record.start_s, t0),
        _time(record.end_s, t0),
        record.start_allocated,
        record.end_allocated,
        record.forwards,
        record.backwards,
        record.saw_optimizer,
        record.grad_forward,
        record.grads_live_at_start,
        record.count,
        record.last_index,
        record.reads,
        record.unread_peak_allocated,
        record.unread_peak_reserved,
        [
            [
                p.name,
                p.peak_allocated_bytes,
                p.peak_reserved_bytes,
                p.start_allocated_bytes,
                p.end_allocated_bytes,
                p.duration_s,
                p.count,
                p.step,
            ]
            for p in list(record.phases.values())
        ],
        {name: [times[0], times[1]] for name, times in list(record.phase_times.items())},
    ]


def _whole(value: Any, what: str, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecord(f"{what} should be a whole number, not {value!r:.30}")
    return value


def _number(value: Any, what: str, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(f"{what} should be a number, not {value!r:.30}")
    return float(value)


def _flag(value: Any, what: str, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise BadRecord(f"{what} should be true or false, not {value!r:.30}")
    return value


def _named(values: Any, names: list[str], what: str) -> dict[str, Any]:
    if not isinstance(values, list) or len(values) < len(names):
        raise BadRecord(f"{what} should be a list of {len(names)} values")
    return dict(zip(names, values, strict=False))


def decode_step(values: Any, fields: dict[str, list[str]]) -> StepRecord:
    """A step record from its positional list, by the header's field names (BadRecord when
    a value is not what the field holds)."""
    v = _named(values, fields["step"], "a step")
    phases: dict[str, PhaseStats] = {}
    raw_phases = v.get("phases")
    if not isinstance(raw_phases, list):
        raise BadRecord("a step's phases should be a list")
    for raw in raw_phases:
        p = _named(raw, fields["phase"], "a phase")
        name = p["name"]
        if not isinstance(name, str):
            raise BadRecord(f"a phase's name should be text, not {name!r:.30}")
        phases[name] = PhaseStats(
            name=name,
            peak_allocated_bytes=_whole(p["peak_allocated_bytes"], "peak_allocated_bytes"),
            peak_reserved_bytes=_whole(p["peak_reserved_bytes"], "peak_reserved_bytes"),
            start_allocated_bytes=_whole(p["start_allocated_bytes"], "start_allocated_bytes"),
            end_allocated_bytes=_whole(p["end_allocated_bytes"], "end_allocated_bytes"),
            duration_s=_number(p["duration_s"], "duration_s", optional=False) or 0.0,
            count=_whole(p["count"], "a phase's count", optional=False) or 0,
            step=_whole(p["step"], "a phase's step"),
        )
    times = v.get("phase_times")
    if not isinstance(times, dict) or not all(
        isinstance(t, list)
        and len(t) == 2
        and all(_number(x, "a phase time") is not None for x in t)
        for t in times.values()
    ):
        raise BadRecord("a step's phase_times should map names to [count, seconds]")
    index = _whole(v["index"], "a step's index", optional=False)
    count = _whole(v["count"], "a step's count", optional=False)
    if index is None or index < 0 or count is None or count < 1:
        raise BadRecord("a step's index should be 0 or more and its count 1 or more")
    last = _whole(v["last_index"], "a step's last_index")
    if last is not None and last < index:
        raise BadRecord("a step's last_index is below its index")
    return StepRecord(
        index=index,
        epoch=_whole(v["epoch"], "a step's epoch", optional=False) or 0,
        start_s=_number(v["start_s"], "a step's start_s", optional=False) or 0.0,
        start_allocated=_whole(v["start_allocated"], "start_allocated"),
        end_s=_number(v["end_s"], "a step's end_s"),
        end_allocated=_whole(v["end_allocated"], "end_allocated"),
        forwards=_whole(v["forwards"], "forwards", optional=False) or 0,
        backwards=_whole(v["backwards"], "backwards", optional=False) or 0,
        saw_optimizer=bool(_flag(v["saw_optimizer"], "saw_optimizer")),
        grad_forward=bool(_flag(v["grad_forward"], "grad_forward")),
        grads_live_at_start=_flag(v["grads_live_at_start"], "grads_live_at_start", True),
        phases=phases,
        count=count,
        last_index=last,
        reads=bool(_flag(v["reads"], "reads")),
        unread_peak_allocated=_whole(v["unread_peak_allocated"], "unread_peak_allocated"),
        unread_peak_reserved=_whole(v["unread_peak_reserved"], "unread_peak_reserved"),
        phase_times={name: [t[0], t[1]] for name, t in times.items()},
    )


def decode_sample(values: Any, fields: dict[str, list[str]]) -> tuple[Any, ...]:
    """A timeline sample ``(t, allocated, reserved, device_used, host_rss)``."""
    v = _named(values, fields["sample"], "a sample")
    return (
        _number(v["t"], "a sample's t", optional=False),
        *(_whole(v[name], f"a sample's {name}") for name in SAMPLE_FIELDS[1:]),
    )
