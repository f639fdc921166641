"""How a script's process ended, in the words its report uses: the exit code or the signal,
whether the kernel's OOM killer sent it, a CUDA error the script hit first, and what the
journal misses.

The OOM killer is told apart by its counter: ``oom_kill`` in the cgroup's ``memory.events``
(cgroup v2) or ``memory.oom_control`` (v1), read before the run and after it; without a
cgroup of its own, the machine's ``/proc/vmstat`` (then any process on the machine counts).
A SIGKILL while the counter rose is the OOM killer's. The kernel log would say more, but it
needs privileges a training job rarely has.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramscope.report.model import ExitInfo

OOM_KILLER = "oom-killer"
# signals whose default action is a core dump: the process crashed in native code
CRASHES = {
    getattr(signal, name): what
    for name, what in (
        ("SIGSEGV", "a segmentation fault: native code touched memory it does not own"),
        ("SIGBUS", "a bus error: native code touched memory that is not there"),
        ("SIGABRT", "aborted: native code called abort()"),
        ("SIGFPE", "an arithmetic fault in native code"),
        ("SIGILL", "an illegal instruction in native code"),
        ("SIGSYS", "a bad system call"),
        ("SIGTRAP", "a trap: a breakpoint or a failed assertion in native code"),
    )
    if hasattr(signal, name)
}
CORE_DUMPING = set(CRASHES) | {
    getattr(signal, n) for n in ("SIGQUIT", "SIGXCPU", "SIGXFSZ") if hasattr(signal, n)
}
_CUDA_ERROR = re.compile(r"(CUDA error: [^\n;]+|device-side assert triggered|CUBLAS_STATUS_\w+)")


@dataclass(frozen=True)
class OomCounter:
    """How many processes an OOM killer killed so far, and where that was counted."""

    count: int
    scope: str  # "cgroup" (this process's memory cgroup) or "machine" (/proc/vmstat)
    source: str  # the file read


def _field(path: Path, key: str) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value.strip())
    return None


def _cgroups(proc: Path, pid: str) -> dict[str, str]:
    """This process's cgroups: ``{"": path}`` for v2, ``{"memory": path}`` for v1's."""
    try:
        text = (proc / pid / "cgroup").read_text(encoding="ascii", errors="replace")
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                found[controller] = parts[2]
    return found


def oom_kill_counter(
    proc: str | Path = "/proc", cgroups: str | Path = "/sys/fs/cgroup", pid: str = "self"
) -> OomCounter | None:
    """The OOM kills counted so far for this process's memory cgroup, else for the
    machine; None where neither can be read (not Linux)."""
    proc, root = Path(proc), Path(cgroups)
    found = _cgroups(proc, pid)
    places = []
    if "" in found:  # cgroup v2, or the unified half of a hybrid layout
        relative = found[""].lstrip("/")
        places += [root / relative / "memory.events", root / "unified" / relative / "memory.events"]
        places.append(root / "memory.events")  # a container sees its own cgroup as the root
    if "memory" in found:  # cgroup v1
        relative = found["memory"].lstrip("/")
        places += [root / "memory" / relative / "memory.oom_control"]
        places.append(root / "memory" / "memory.oom_control")
    for path in places:
        count = _field(path, "oom_kill")
        if count is not None:
            return OomCounter(count, "cgroup", str(path))
    count = _field(proc / "vmstat", "oom_kill")
    return OomCounter(count, "machine", str(proc / "vmstat")) if count is not None else None


@dataclass(frozen=True)
class Ending:
    """How the script's process ended, as the process that waited for it saw it."""

    code: int | None = None  # the exit code, when it exited
    signal: int | None = None  # the signal that killed it
    at: float | None = None  # when it was seen to end (seconds since the epoch)
    oom_kills: int | None = None  # OOM kills counted while it ran (None: no counter)
    oom_scope: str | None = None  # where they were counted: "cgroup" or "machine"

    @classmethod
    def from_wait_status(
        cls,
        status: int,
        at: float,
        before: OomCounter | None = None,
        after: OomCounter | None = None,
    ) -> Ending:
        import os

        code = os.waitstatus_to_exitcode(status)
        kills = scope = None
        if before is not None and after is not None and before.source == after.source:
            kills, scope = max(0, after.count - before.count), after.scope
        if code < 0:
            return cls(signal=-code, at=at, oom_kills=kills, oom_scope=scope)
        return cls(code=code, at=at, oom_kills=kills, oom_scope=scope)

    def to_record(self) -> dict[str, Any]:
        """The journal's ``ended`` record: how its process ended, as its parent saw it."""
        return {
            "k": "ended",
            "code": self.code,
            "signal": self.signal,
            "at": self.at,
            "oom_kills": self.oom_kills,
            "oom_scope": self.oom_scope,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Ending:
        def whole(key: str) -> int | None:
            value = record.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        at = record.get("at")
        scope = record.get("oom_scope")
        return cls(
            code=whole("code"),
            signal=whole("signal"),
            at=float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
            oom_kills=whole("oom_kills"),
            oom_scope=scope if isinstance(scope, str) else None,
        )

    @property
    def exit_code(self) -> int:
        """What a shell says for it: the code, or 128 + the signal's number."""
        return 128 + self.signal if self.signal is not None else (self.code or 0)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def cuda_error(text: str | None) -> str | None:
    """The CUDA error a message names (``CUDA error: an illegal memory access was
    encountered``, ``device-side assert triggered``), or None."""
    match = _CUDA_ERROR.search(text or "")
    return match.group(1).strip() if match else None


def _how_it_died(ending: Ending) -> tuple[str, str, str | None]:
    """(status, words, killed_by) of a process that a signal ended."""
    signum = ending.signal or 0
    name = signal_name(signum)
    said = f"{name}, signal {signum}"
    if signum == signal.SIGINT:
        return "interrupted", f"interrupted by {said}", None
    if signum in (signal.SIGTERM, getattr(signal, "SIGHUP", -1)):
        return "terminated", f"stopped by {said}", None
    if signum in CRASHES:
        return "crashed", f"crashed with {said}: {CRASHES[signum]}", None
    if signum == getattr(signal, "SIGKILL", -1) and ending.oom_kills:
        where = (
            "its cgroup's memory counters"
            if ending.oom_scope == "cgroup"
            else "the machine's /proc/vmstat (another process may have been the one killed)"
        )
        kills = "an OOM kill" if ending.oom_kills == 1 else f"{ending.oom_kills} OOM kills"
        return (
            "killed",
            f"killed by the kernel's OOM killer ({said}; {where} counted {kills} during the run)",
            OOM_KILLER,
        )
    if signum == getattr(signal, "SIGKILL", -1):
        why = (
            "; no OOM kill was counted, so another process sent it (a scheduler's preemption, "
            "kill -9)"
            if ending.oom_kills == 0
            else " (by the kernel's OOM killer, a scheduler, or kill -9)"
        )
        return "killed", f"killed by {said}{why}", None
    return "killed", f"killed by {said}", None


def exit_info(
    ending: Ending | None,
    script_exit: dict[str, Any] | None,
    lost_seconds: float | None,
    stopped: bool = False,
) -> ExitInfo:
    """The report's ``exit`` for a run whose report is made from its journal: the process's
    ending (None: not seen, a journal read by hand) and the script's own as the journal
    says (None: the script had not ended; ``stopped``: its session had stopped too)."""
    script = script_exit or {}
    said = script.get("error") if isinstance(script.get("error"), str) else None
    if ending is None:
        if script:
            status = str(script.get("status") or "ok")
            code = script.get("code") if isinstance(script.get("code"), int) else 0
            return ExitInfo(status=status, code=code, error=said, source="journal")
        return ExitInfo(
            status="unknown",
            code=0,
            error="the journal ends without saying how the run ended (its process was killed, "
            "crashed, or still runs)",
            source="journal",
        )
    if ending.signal is not None:
        status, words, killed_by = _how_it_died(ending)
        info = ExitInfo(
            status=status,
            code=ending.exit_code,
            signal=signal_name(ending.signal),
            signal_number=ending.signal,
            killed_by=killed_by,
        )
    else:
        code = ending.code or 0
        words = (
            f"the script's process exited with code {code} before vramscope wrote its report "
            "(os._exit(), or native code that ended the process)"
        )
        info = ExitInfo(status="error" if code else "ok", code=code)
    if script:  # the script had ended: its own words first (a CUDA error among them)
        before = f"the script ended ({script.get('status')}" + (f": {said}" if said else "") + ")"
        during = " while its report was written" if stopped else ""
        words = f"{before}; then {words}{during}"
    info.error = words
    info.lost_seconds = lost_seconds
    info.source = "journal"
    return info
