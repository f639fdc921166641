"""Write a tracking Session's journal as the run goes.

What it costs and when it writes:

- **a step**: when a step is stored in the session's step table (a step that read the
  allocator; on CUDA with short steps, 1 in 24-64 of them, the steps between folded in when
  the next read comes), the entries it changed go out in one ``write``: a list of its fields
  (see :mod:`vramscope.journal.format`), with the peak, the objects' bytes and the startup
  figures when they changed. Steps stored less than ``STEP_WRITE_GAP_S`` after the last
  write (the first steps of a short-step run, each read) wait for the next: a later step's,
  or the sampler's at its next sample (0.1 s; 0.5 s once short steps are read 1 in N), or
  ``os._exit``'s (wrapped once a journal is open), so a launch-bound run's first steps pay a
  write every few steps, not one each; a process killed outright (SIGKILL, a segfault) can
  lose the steps of its last sample interval. No ``fsync``: a process that dies leaves what it wrote in the kernel's page
  cache, which is what the journal is for;
- **samples**: the sampler's thread appends each timeline sample and writes them every
  ``FLUSH_EVERY_S`` (with the device, once known, and the allocator's OOM counters), and
  a step's write takes those waiting along;
- **bounded**: once the file passes ``COMPACT_AT_BYTES`` (or twice its last compacted size)
  it is rewritten whole: the header, the latest of each kind of record, the session's step
  table as it stands (bounded by the session: 2,048 entries, older neighbours merged in
  pairs) and the sampler's own bounded timeline (4,096 samples), then renamed over the
  old one;
- the session's ``stop()`` writes the ``end`` record: how the script ended.

Nothing here raises into the user's run: a write that fails stops the journal and leaves a
note in the report. A forked child (a DataLoader worker) never writes to it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, NoReturn

import orjson

from vramscope import __version__
from vramscope.journal.files import JournalFile, StatusDirError, private_path
from vramscope.journal.format import FIELDS, HEADER, SCHEMA, encode_step

FLUSH_EVERY_S = 0.5  # samples reach the file at least this often (twice a second)
# a step stored sooner than this after the last step write waits for the next write (a later
# step's, or the sampler's at its next sample): the first steps of a run of 2 ms steps, each
# of which reads, write every ten steps or so instead of each
STEP_WRITE_GAP_S = 0.02
COMPACT_AT_BYTES = 4 * 1024 * 1024
SAMPLES_PER_LINE = 1024

# orjson: a step's line in about a tenth of the time of the json module's encoder
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
_writers: weakref.WeakSet[JournalWriter] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for writer in list(_writers):
        writer.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

_os_exit = os._exit


def _exit_after_the_journals(code: int) -> NoReturn:
    """``os._exit`` once a journal is open: the steps that waited for a write (and the
    samples) are written first, as the process ends without unwinding; then torch's own."""
    for writer in list(_writers):
        with contextlib.suppress(Exception):
            writer.before_exit()
    _os_exit(code)


def _watch_os_exit() -> None:
    if os._exit is _os_exit:
        os._exit = _exit_after_the_journals


def open_journal(session: Any, target: Any) -> JournalWriter | None:
    """Start ``session``'s journal: ``target`` a path (kept when the session stops), or True
    (the user's private directory, removed when the session stops). None, with a note in
    the session's report, when it cannot be written."""
    remove = target is True
    try:
        path = private_path() if remove else Path(os.fspath(target))
        return JournalWriter(session, path, remove_at_end=remove)
    except (OSError, StatusDirError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        session._notes.append(f"no journal was written: {reason}")
        return None


class JournalWriter:
    """Appends one session's records to its journal file (see the module's docstring)."""

    def __init__(self, session: Any, path: Path, remove_at_end: bool = False) -> None:
        self.path = path
        self.error: str | None = None
        self._session = session
        self._t0: float = session._t0
        self._remove_at_end = remove_at_end
        self._lock = threading.Lock()
        self._file = JournalFile(path)
        self._dead = False
        self._entries: dict[int, tuple[Any, ...]] = {}  # step index -> the stamp written
        self._state: dict[str, bytes] = {}  # kind -> its latest line
        self._known: dict[str, Any] = {
            "peak": self._peak_key(),
            "objects": None,
            "startup": None,
            "allocator": None,
        }
        self._samples: list[tuple[Any, ...]] = []
        self._last_flush = 0.0
        self._steps_at = -STEP_WRITE_GAP_S  # when steps were last written (perf_counter)
        self._steps_due = False  # a step was stored since then
        self._newest = -1  # the newest step in the step table at the last step write
        self._steps_lock = threading.Lock()  # one writer of the step entries at a time
        self._device_written = False
        self._compactions = 0
        self._limit = COMPACT_AT_BYTES
        self._header = self._header_fields()
        _writers.add(self)
        _watch_os_exit()
        self._write(self._line(HEADER, **self._header))
        session._steps.observer = self.on_steps

    # ---- the lines ---------------------------------------------------------------------
    def _now(self) -> float:
        return round(time.perf_counter() - self._t0, 6)

    def _line(self, kind: str, **fields: Any) -> bytes:
        return orjson.dumps({"k": kind, "t": self._now(), **fields}, default=str, option=_OPTIONS)

    def _header_fields(self) -> dict[str, Any]:
        from vramscope.sources.host import host_memory
        from vramscope.tracking.device_info import device_info

        session = self._session
        wall = time.time() - (time.perf_counter() - self._t0)
        memory = host_memory()
        return dict(
            schema=SCHEMA,
            vramscope_version=__version__,
            pid=os.getpid(),
            command=list(getattr(sys, "orig_argv", sys.argv)),
            cwd=os.getcwd(),
            started_at=datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            wall0=round(wall, 6),
            name=session.name,
            workload=dict(session.workload_info),
            device=device_info(session),
            host={"total_bytes": memory.total_bytes, "available_bytes": memory.available_bytes},
            interval_s=session._interval_s,
            fields=FIELDS,
            compactions=0,
        )

    def _peak_key(self) -> tuple[Any, ...]:
        s = self._session
        return (s._peak_allocated, s._peak_reserved, s._peak_where)

    def _state_lines(self, out: list[bytes]) -> None:
        """The peak, the objects' bytes and the startup figures, when they changed."""
        s = self._session
        known = self._known
        peak = self._peak_key()
        if peak != known["peak"]:
            known["peak"] = peak
            allocated, reserved, (step, phase) = peak
            self._keep(
                out,
                "peak",
                allocated_bytes=allocated if allocated >= 0 else None,
                reserved_bytes=reserved if allocated >= 0 else None,
                step=step,
                phase=phase,
            )
        seen, full = s._ledger.seen, s._ledger.full_gradients
        objects = (seen.parameters, seen.buffers, seen.gradients, seen.optimizer_state, full)
        if objects != known["objects"]:
            known["objects"] = objects
            names = ("parameters", "buffers", "gradients", "optimizer_state", "full_gradients")
            self._keep(out, "objects", **dict(zip(names, objects, strict=True)))
        first = s._first_reading
        startup = (
            first.allocated_bytes if first is not None else None,
            first.reserved_bytes if first is not None else None,
            s._first_reading_rss,
        )
        if startup != known["startup"]:
            known["startup"] = startup
            self._keep(
                out,
                "startup",
                after_build_allocated_bytes=startup[0],
                after_build_reserved_bytes=startup[1],
                host_rss_bytes=startup[2],
            )

    def _keep(self, out: list[bytes], kind: str, **fields: Any) -> None:
        """A record of which only the latest counts (kept for a compaction)."""
        line = self._line(kind, **fields)
        self._state[kind] = line
        out.append(line)

    # ---- as the run goes -----------------------------------------------------------------
    def on_steps(self) -> None:
        """A step was stored (the session's step table calls this): write the entries it
        changed, and the figures that changed with them (main thread)."""
        if self._dead:
            return
        if time.perf_counter() - self._steps_at < STEP_WRITE_GAP_S:
            self._steps_due = True  # the next write takes it along
            return
        self._steps_now()

    def _steps_now(self) -> None:
        """Write what the steps changed since the last write, whenever that was."""
        try:
            self._steps_changed()
        except Exception as exc:  # never into the user's run
            self._stop(exc)

    def _steps_changed(self) -> None:
        with self._steps_lock:
            self._steps_at = time.perf_counter()
            self._steps_due = False
            self._write_steps()

    def _write_steps(self) -> None:
        """The entries changed since the last write, written; what was written is noted only
        once it is, so that a record that could not be read (its phases grew meanwhile) is
        read again, with every entry after it, by the next write."""
        steps = self._session._steps
        newest = steps.last  # (read first: a step stored meanwhile is looked at again)
        out: list[bytes] = []
        stamps: dict[int, Any] = {}
        for record in steps.since(self._newest):
            stamp = _stamp(record)
            if self._entries.get(record.index) != stamp:
                out.append(self._line("step", v=encode_step(record, self._t0)))
                stamps[record.index] = stamp
        with self._lock:
            self._state_lines(out)
            samples, self._samples = self._samples, []  # (in the same write)
        if samples:
            out.extend(self._sample_lines(samples))
        if out:
            self._write(b"".join(out))
        self._entries.update(stamps)
        if newest is not None:
            self._newest = newest.index if newest.last_index is None else newest.last_index

    def on_sample(self, sample: tuple[Any, ...]) -> None:
        """A timeline sample (the sampler's thread); written every ``FLUSH_EVERY_S``."""
        if self._dead:
            return
        with self._lock:
            self._samples.append(sample)
        due = self._steps_due  # steps that waited: at the next sample, with the samples
        if due or sample[0] - self._last_flush >= FLUSH_EVERY_S:
            self._last_flush = sample[0]
            try:
                if due:
                    self._flush_steps()
                else:
                    self.flush()
            except Exception as exc:  # never stop the sampler
                self._stop(exc)

    def before_exit(self) -> None:
        """The process ends now (``os._exit``): what waited, written."""
        if not self._dead:
            self._steps_now()
            self.flush()

    def _flush_steps(self) -> None:
        """The steps stored since the last step write, from the sampler's thread; a record
        the run changes while it is read here (a step folded into it) waits for the next."""
        try:
            self._steps_changed()
        except RuntimeError:  # (a record's phases grew while read): the next flush
            self._steps_due = True
        self.flush()

    def flush(self) -> None:
        """Write the samples not written yet, the device once known and the allocator's
        OOM counters when they changed."""
        out: list[bytes] = []
        with self._lock:
            samples, self._samples = self._samples, []
        out.extend(self._sample_lines(samples))
        with self._lock:
            self._state_lines(out)  # (a run that stores no step still has its startup)
        self._device_lines(out)
        if out:
            self._write(b"".join(out))

    def _sample_lines(self, samples: list[tuple[Any, ...]]) -> list[bytes]:
        lines = []
        for at in range(0, len(samples), SAMPLES_PER_LINE):
            chunk = [list(s) for s in samples[at : at + SAMPLES_PER_LINE]]
            lines.append(self._line("samples", v=chunk))
        return lines

    def _device_lines(self, out: list[bytes]) -> None:
        s = self._session
        if s._device_index is None:
            return
        if not self._device_written:
            from vramscope.tracking.device_info import device_info

            with contextlib.suppress(Exception):
                self._keep(out, "device", device=device_info(s))
                self._device_written = True
        with contextlib.suppress(Exception):
            from vramscope.sources import allocator
            from vramscope.tracking.device_info import allocator_config

            stats = allocator.raw_stats(s._device_index)
            first = s._first_reading
            counters = (  # since the session's first reading, as the report counts them
                int(stats.get("num_ooms", 0)) - (first.num_ooms if first else 0),
                int(stats.get("num_alloc_retries", 0)) - (first.num_alloc_retries if first else 0),
            )
            if counters != self._known["allocator"]:
                self._known["allocator"] = counters
                self._keep(
                    out,
                    "allocator",
                    num_ooms=counters[0],
                    num_alloc_retries=counters[1],
                    config=allocator_config(),
                )

    def on_exit(self) -> None:
        """How the script ended is known (an exception, an exit code, a stop signal): said
        at once, in case the process dies before the session stops."""
        if self._dead:
            return
        s = self._session
        self._steps_now()  # the steps that waited, before the process may end
        with contextlib.suppress(Exception):
            self._write(self._line("exit", exit=dict(s._exit), oom=s._oom))

    def close(self) -> None:
        """The session stopped: what changed since the last write, then the ``end`` record
        (how the script ended); the file is removed when it lives in the private directory
        (the session's report has everything)."""
        if self._dead:
            return
        s = self._session
        self._steps_now()
        self.flush()
        self._write(self._line("end", exit=dict(s._exit), oom=s._oom))
        with self._lock:
            self._dead = True
            self._file.close(remove=self._remove_at_end and self.error is None)
        _writers.discard(self)
        if s._steps.observer == self.on_steps:
            s._steps.observer = None

    def forget(self) -> None:
        """In a forked child: stop, without touching the parent's file."""
        self._dead = True
        self._file.forget()

    # ---- the file ------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        with self._lock:
            if self._dead:
                return
            try:
                self._file.write(data)
                if self._file.size > self._limit:
                    self._compact()
            except OSError as exc:
                self._stop(exc, locked=True)

    def _stop(self, exc: BaseException, locked: bool = False) -> None:
        """A write failed: the journal stops here (its file keeps what was written)."""
        with contextlib.nullcontext() if locked else self._lock:
            if self._dead:
                return
            self._dead = True
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self.error = f"the journal stopped: {reason}"
            self._session._notes.append(self.error)
            self._file.close()

    def _compact(self) -> None:
        """Rewrite the journal whole, bounded (the lock is held): its step entries are the
        session's step table as it stands (2,048 entries at most, older neighbours merged
        in pairs), each encoded again."""
        self._compactions += 1
        header = self._line(HEADER, **{**self._header, "compactions": self._compactions})
        entries = {}
        lines = [header, *self._state.values()]
        for record in list(self._session._steps):  # (the tail may change meanwhile: its
            stamp = _stamp(record)  # stamp is read first, so a change is written again)
            lines.append(self._line("step", v=encode_step(record, self._t0)))
            entries[record.index] = stamp
        self._entries = entries
        sampler = self._session._sampler
        self._samples = []  # the sampler's timeline holds them
        lines += self._sample_lines(sampler.samples() if sampler is not None else [])
        data = b"".join(lines)
        self._file.replace(data)
        self._limit = max(COMPACT_AT_BYTES, 2 * len(data))


def _stamp(record: Any) -> tuple[Any, ...]:
    """What changes when a stored step entry changes (a step folded into it)."""
    return (
        record.count,
        record.last_index,
        record.end_s,
        record.unread_peak_allocated,
        record.unread_peak_reserved,
    )
