"""The Report: one serializable value that every verb produces and every renderer reads.

A Report is plain data (dataclasses of ints, floats, strings, lists and dicts). It knows
nothing of torch. ``to_dict``/``from_dict`` round-trip it through JSON; unknown keys from a
newer minor version are kept in ``extra`` so nothing is lost on re-save.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.errors import VramscopeError


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (a loss that became NaN, an infinite
    ratio) as None: JSON has no NaN nor infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def strict_json(data: Any, **options: Any) -> str:
    """Standard JSON of ``data``, a float that is not finite written as null (looked for
    only when there is one)."""
    try:
        return json.dumps(data, allow_nan=False, **options)
    except ValueError:
        return json.dumps(finite(data), allow_nan=False, **options)


SCHEMA = "vramscope.report/1"
# the other files vramscope writes, for a report's reader that is given one of them
_OTHER_FILES = {
    "demo": "vramscope demo's file: its reports are under 'reports' and 'estimates' "
    "(`vramscope demo --example cnn` writes one report)",
    "diff": "the comparison `vramscope report A --diff B` wrote: render A and B themselves",
    "devices": "`vramscope info --json`'s reading of the devices",
    "journal": "a run's journal: `vramscope report JOURNAL` reads it as a journal",
    "status": "the status file `vramscope watch` reads",
}

CATEGORY_NAMES = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "other",
)
PHASE_NAMES = ("forward", "backward", "optimizer", "zero_grad", "data", "other")
# per-module memory held at the same time, so it adds up (temporaries are peaks at
# different moments and never added)
MODULE_KEPT_FIELDS = (
    "parameters_bytes",
    "buffers_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "activations_bytes",
)


@dataclass
class Peak:
    """The maximum over every step of the run, the first step included."""

    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None  # what nvidia-smi shows for this process
    host_rss_bytes: int | None = None  # the process tree: DataLoader workers count
    step: int | None = None  # step whose allocated peak this is
    phase: str | None = None  # phase of that step


@dataclass
class Categories:
    """Bytes by kind of tensor at one moment, sized as the allocator rounds them."""

    parameters: int | None = None
    buffers: int | None = None
    gradients: int | None = None
    optimizer_state: int | None = None
    activations: int | None = None
    temporaries: int | None = None
    other: int | None = None

    def total(self) -> int:
        return sum(getattr(self, name) or 0 for name in CATEGORY_NAMES)


@dataclass
class PhaseStats:
    """One phase: a single occurrence inside a step, or aggregated over the run."""

    name: str
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    start_allocated_bytes: int | None = None
    end_allocated_bytes: int | None = None
    duration_s: float = 0.0
    count: int = 1  # occurrences aggregated (micro-batches, steps)
    step: int | None = None  # for the run-level list: the step with the highest peak


@dataclass
class StepStats:
    index: int
    epoch: int = 0
    mode: str = "train"  # "train" (a backward ran) or "eval"
    micro_batches: int = 0
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    start_allocated_bytes: int | None = None  # allocated at the step boundary
    end_allocated_bytes: int | None = None
    host_rss_bytes: int | None = None
    duration_s: float = 0.0
    start_s: float = 0.0  # seconds since the session began
    phases: list[PhaseStats] = field(default_factory=list)
    count: int = 1  # steps this entry stands for (a long run's later steps merged in pairs)
    last_index: int | None = None  # the last of them when merged


@dataclass
class EpochStats:
    index: int
    steps: int = 0
    first_step: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    end_allocated_bytes: int | None = None
    host_rss_bytes: int | None = None
    duration_s: float = 0.0


@dataclass
class Startup:
    """What exists before the first step: context, libraries, model and optimizer."""

    context_and_libraries_bytes: int | None = None
    after_build_allocated_bytes: int | None = None  # model and optimizer created
    after_build_reserved_bytes: int | None = None
    host_rss_bytes: int | None = None


@dataclass
class AllocatorSlack:
    """reserved − allocated, split by why the allocator holds it."""

    cached_free_bytes: int | None = None  # whole free segments: empty_cache() would release
    fragmentation_bytes: int | None = None  # free pieces of split segments (inactive_split)
    rounding_bytes: int | None = None  # inside allocated: block sizes − requested sizes


@dataclass
class Reconciliation:
    """tensors → allocated → reserved → device used → device total, at one moment."""

    moment: str = "end"  # "peak" or "end"
    tensors: Categories = field(default_factory=Categories)
    requested_bytes: int | None = None
    allocated_bytes: int | None = None
    slack: AllocatorSlack = field(default_factory=AllocatorSlack)
    reserved_bytes: int | None = None
    # part of reserved held in private pools (CUDA graphs, torch.compile's reduce-overhead,
    # torch.cuda.MemPool): kept for replays, never returned to the shared cache
    private_pools_bytes: int | None = None
    private_pools_allocated_bytes: int | None = None
    context_and_libraries_bytes: int | None = None  # device_used − reserved
    device_used_bytes: int | None = None
    other_processes_bytes: int | None = None
    driver_reserved_bytes: int | None = None  # NVML v2: memory the driver keeps for itself
    unaccounted_bytes: int | None = None  # used on the device, listed for no process
    free_bytes: int | None = None
    total_bytes: int | None = None
    note: str | None = None


@dataclass
class Finding:
    kind: str  # leak, empty_cache, fragmentation, retries, first_step, oom, ...
    severity: str  # info | warning | error
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timeline:
    """Samples from the background sampler, bounded; each peak is kept when thinned."""

    interval_s: float | None = None
    t: list[float] = field(default_factory=list)
    allocated_bytes: list[int | None] = field(default_factory=list)
    reserved_bytes: list[int | None] = field(default_factory=list)
    device_used_bytes: list[int | None] = field(default_factory=list)
    host_rss_bytes: list[int | None] = field(default_factory=list)
    # [{"name": phase, "step": i, "start_s": t0, "end_s": t1}] — phase bands
    phases: list[dict[str, Any]] = field(default_factory=list)
    # [{"kind": "step"|"epoch", "index": i, "t": seconds}]
    markers: list[dict[str, Any]] = field(default_factory=list)
    dropped_phase_bands: int = 0


@dataclass
class OomInfo:
    phase: str | None = None
    step: int | None = None
    module: str | None = None
    message: str = ""
    requested_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    fragmentation_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    other_processes_bytes: int | None = None
    largest_blocks: list[dict[str, Any]] = field(default_factory=list)
    largest_free_block_bytes: int | None = None


@dataclass
class ExitInfo:
    status: str = "ok"  # ok | error | interrupted | oom | terminated | killed | crashed
    code: int = 0
    error: str | None = None
    signal: str | None = None  # the signal that ended the run, by name: SIGTERM, SIGKILL, ...
    signal_number: int | None = None  # the same signal's number: 15, 9, ...
    # who sent it, when known: "oom-killer" (the kernel's OOM killer, from the cgroup's counters)
    killed_by: str | None = None
    lost_seconds: float | None = None  # a report made from the journal: the end it misses
    source: str | None = None  # "journal": made from the run's journal after its process died


@dataclass
class RankExit:
    """How one rank of a distributed job ended; a rank that sent no report has no code."""

    status: str = "ok"  # ok | error | interrupted | oom | terminated | timed_out | lost
    code: int | None = 0
    error: str | None = None
    signal: str | None = None

    def summary(self) -> str:
        """In a few words: ``ok``, ``error 3``, ``terminated 143 (SIGTERM)``, ``timed out``."""
        if self.status == "ok" and not self.code:
            return "ok"
        if self.code is None:
            return self.status.replace("_", " ")
        return f"{self.status} {self.code}" + (f" ({self.signal})" if self.signal else "")


@dataclass
class RankEntry:
    """One rank of a distributed job (torchrun): where it ran, its peak, what the peak is
    made of and how it ended. A rank that sent no report has ``reported`` False and null
    numbers; its ``exit`` says why (timed out, or its process was gone)."""

    rank: int
    host: str | None = None
    peak: Peak = field(default_factory=Peak)
    categories_at_peak: Categories = field(default_factory=Categories)
    exit: RankExit = field(default_factory=RankExit)
    reported: bool = True
    local_rank: int | None = None
    pid: int | None = None
    device: dict[str, Any] = field(default_factory=dict)  # type, name, index, total_bytes
    steps: int = 0
    duration_s: float | None = None
    # distributed memory named (DDP gradient buckets, FSDP all-gather/reduce-scatter sizes)
    memory: list[dict[str, Any]] = field(default_factory=list)
    report_file: str | None = None  # this rank's own full report, on its host
    ended_at: str | None = None  # when its script ended (ISO 8601, UTC, its host's clock)
    source: str | None = None  # "journal": a rank that sent no report, read from its journal


@dataclass
class Report:
    schema: str = SCHEMA
    kind: str = "measured"  # measured | estimated
    vramscope_version: str = ""
    created_at: str = ""
    workload: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    peak: Peak = field(default_factory=Peak)
    categories_at_peak: Categories = field(default_factory=Categories)
    categories_note: str | None = None
    startup: Startup = field(default_factory=Startup)
    phases: list[PhaseStats] = field(default_factory=list)
    steps: list[StepStats] = field(default_factory=list)
    epochs: list[EpochStats] = field(default_factory=list)
    modules: list[dict[str, Any]] = field(default_factory=list)
    reconciliation: list[Reconciliation] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    oom: OomInfo | None = None
    exit: ExitInfo = field(default_factory=ExitInfo)
    ranks: list[RankEntry] = field(default_factory=list)  # a distributed job: one per rank
    unavailable: dict[str, str] = field(default_factory=dict)  # field → why it is null
    extra: dict[str, Any] = field(default_factory=dict)  # sections added by later features

    # ---- serialization -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        extra = data.pop("extra")
        for key, value in extra.items():
            data.setdefault(key, value)
        return data

    def to_json(self, indent: int | None = 1) -> str:
        return strict_json(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> Path:
        target = Path(path)
        target.write_text(self.to_json() + "\n", encoding="utf-8")
        return target

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """A Report from its JSON form; VramscopeError (one line, naming the field) when
        ``data`` is not a report or a field has the wrong type."""
        if not isinstance(data, dict):
            raise VramscopeError("not a vramscope report: expected a JSON object")
        schema = data.get("schema")
        if isinstance(schema, str) and schema.startswith("vramscope.") and "/" in schema:
            kind = schema[len("vramscope.") :].split("/", 1)[0][:20]
            if kind != "report":  # another file vramscope writes: say which
                said = _OTHER_FILES.get(kind, f"a vramscope {kind} file")
                raise VramscopeError(
                    f"not a vramscope report: this is {said} (schema {schema[:40]})"
                )
        if not isinstance(schema, str) or not schema.startswith("vramscope.report/"):
            raise VramscopeError("not a vramscope report: the 'schema' key is missing or wrong")
        major = schema.rsplit("/", 1)[-1].split(".")[0]
        if major != SCHEMA.rsplit("/", 1)[-1]:
            raise VramscopeError(
                f"report schema {schema[:40]} is not readable by this vramscope "
                f"(reads {SCHEMA}.x); upgrade vramscope"
            )
        report = _build(cls, data, "")
        _check_device(report.device)
        return report

    def _repr_html_(self) -> str:
        """Jupyter shows a report as a short table; ``vramscope.report.html`` is the full page."""
        from vramscope.report.summary import to_html

        return to_html(self.to_dict())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython prints a report as a few lines rather than every field."""
        from vramscope.report.summary import to_text

        printer.text("Report(...)" if cycle else to_text(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Report:
        source = Path(path)
        if not source.is_file():
            raise VramscopeError(f"no such report file: {source}")
        try:
            data = json.loads(source.read_text(encoding="utf-8"), parse_constant=_no_constant)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise VramscopeError(f"{source} is not valid JSON: {exc}") from None
        except RecursionError:
            raise VramscopeError(f"{source} is not a vramscope report: nested too deeply") from None
        except ValueError as exc:  # NaN/Infinity, or an integer of thousands of digits
            raise VramscopeError(f"{source} is not a vramscope report: {exc}") from None
        except OSError as exc:
            raise VramscopeError(f"cannot read {source}: {exc.strerror or exc}") from None
        if not isinstance(data, dict):
            raise VramscopeError(f"{source} is not a vramscope report")
        try:
            return cls.from_dict(data)
        except VramscopeError as exc:
            raise VramscopeError(f"{source}: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a report holds")


_LARGEST = 2**63  # no byte count or index in a report comes near it


def _wrong(where: str, expected: str, value: Any) -> VramscopeError:
    shown = repr(value)
    if len(shown) > 30:
        shown = shown[:26] + "…" + shown[-3:]
    return VramscopeError(
        f"not a vramscope report: {where or 'the top'} should be {expected}, not {shown}"
    )


# the device's typed keys (the schema's ``device``): a free-form dict, checked here
_DEVICE_TEXT = ("name", "type", "capability", "torch_version", "python_version")
_DEVICE_TEXT += ("cuda_version", "driver_version")


def _check_device(device: dict[str, Any]) -> None:
    for key in _DEVICE_TEXT:
        value = device.get(key)
        if value is not None and not isinstance(value, str):
            raise _wrong(f"device.{key}", "text", value)
    for key in ("total_bytes", "index"):
        value = device.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise _wrong(f"device.{key}", "a whole number of 0 or more", value)


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a dict, recursively, checking each field's type;
    unknown keys go to ``extra``; a null or missing field takes its default."""
    if not isinstance(data, dict):
        raise _wrong(where, "an object", data)
    hints, fields = _shape(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            extra[key] = value
            continue
        path = f"{where}.{key}" if where else key
        if value is None and not _optional(hints[key]):
            if _has_default(fields[key]):
                continue
            raise _wrong(path, "given", value)
        kwargs[key] = _convert(hints[key], value, path)
    for name, f in fields.items():
        if name not in kwargs and not _has_default(f):
            raise VramscopeError(f"not a vramscope report: {where or 'the top'} has no {name!r}")
    if "extra" in fields:
        kwargs.setdefault("extra", {}).update(extra)
    return cls(**kwargs)


@functools.cache
def _shape(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """A dataclass's resolved type hints and fields, worked out once per class (resolving
    hints is slow, and a long run's report holds thousands of steps and phases)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in (
        typing.get_args(hint)
    )


def _convert(hint: Any, value: Any, where: str = "") -> Any:
    if hint is Any:
        return value
    if value is None:
        if _optional(hint):
            return None
        raise _wrong(where, "given", value)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (arg,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(arg, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise _wrong(where, "a list", value)
        (item,) = typing.get_args(hint) or (Any,)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        _, item = typing.get_args(hint) or (str, Any)
        return {k: _convert(item, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise _wrong(where, "true or false", value)
        return value
    if hint is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) >= _LARGEST:
            raise _wrong(where, "a whole number", value)
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or abs(value) >= _LARGEST:
            raise _wrong(where, "a number", value)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _wrong(where, "text", value)
        return value
    return value
