"""One rank's part in a distributed run: say hello when it starts; at the end publish its
report, and on rank 0 gather every rank's into the job's report, waiting at most the
gather timeout (less for a rank whose process is gone, or once the job is being stopped)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vramscope.distributed import DEFAULT_TIMEOUT_S, JOB_EXIT_FILE, VIA, exchange, gather
from vramscope.distributed.journals import journal_row
from vramscope.distributed.memory import DistributedMemory
from vramscope.distributed.rank import RankInfo, now_iso
from vramscope.errors import VramscopeError
from vramscope.report.model import RankEntry, Report

# once rank 0 is being stopped (torchrun stops every rank when one fails, and kills them
# 30 s later), the others are being stopped too: wait at most this long for their reports
STOPPING_WAIT_S = 10.0
LIVENESS_EVERY_S = 0.25  # how often rank 0 looks whether a silent rank's process still runs


class RankJob:
    """This process as one rank of a job: what it measures besides the Session's numbers,
    and how its report reaches rank 0."""

    def __init__(
        self,
        info: RankInfo,
        json_path: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        via: str = "auto",
    ) -> None:
        if via not in VIA:
            raise VramscopeError(f"--gather-via must be one of {', '.join(VIA)}, not {via!r}")
        self.info = info
        self.json_path = json_path
        self.timeout_s = timeout_s
        self.via = via
        self.memory = DistributedMemory()
        self.notes: list[str] = []
        self._dir: exchange.PrivateDir | None = None
        self._kept = False
        self._channels: list[Any] = []
        self._known_hellos: dict[int, dict[str, Any]] = {}

    @classmethod
    def from_env(cls, **options: Any) -> RankJob | None:
        info = RankInfo.from_env()
        return None if info is None else cls(info, **options)

    @property
    def is_gatherer(self) -> bool:
        return self.info.rank == 0

    # ---- the start of the rank -------------------------------------------------------
    def start(self, session: Any) -> None:
        """Before the script: let ``session`` read DDP's and FSDP's memory while the models
        live, and tell rank 0 where this rank runs (its host and process), through what
        exists before the script makes a process group: torchrun's store and the files."""
        session.object_probes.append(self.memory)
        session.preferred_cuda_index = self.info.local_rank
        try:
            self._dir, self._kept = exchange.rank_dir(self.json_path, self.info.job)
        except (exchange.UnsafeDirectory, OSError) as exc:
            self.notes.append(f"no rank files: {exc}")
        if self._dir is not None and session.journal is None:  # rank 0 reads it if this dies
            session.journal = self._dir.path / exchange.journal_file(self.info.rank)
        if self.via == "auto" and self.info.agent_store is not None:
            agent = exchange.agent_store(self.info.agent_store)
            if agent is not None:
                self._channels.append(exchange.StoreChannel(agent, self.info.job, "torchrun store"))
        if self._dir is not None:
            self._channels.append(exchange.FileChannel(self._dir, self.info.job))
        hello = {"host": self.info.host, "pid": self.info.pid, "started_at": self.info.started_at}
        for channel in self._channels:
            with contextlib.suppress(Exception):
                channel.hello(self.info.rank, hello)

    # ---- the end of the rank ---------------------------------------------------------
    def finish(self, report: Report, stopping: Callable[[], bool] = lambda: False) -> Report | None:
        """Publish this rank's report; on rank 0 return the job's report (None elsewhere)."""
        started = time.perf_counter()
        section = self.info.section()
        section.update(backend=self.memory.backend, ended_at=now_iso(), memory=self.memory.items())
        report.extra["distributed"] = section
        if self._dir is not None:
            section["report_file"] = str(self._dir.path / exchange.rank_file(self.info.rank))
        store = exchange.group_store() if self.via == "auto" else None
        if store is not None:  # the script left its process group: the job's own store
            channel = exchange.StoreChannel(store, self.info.job, "process group store")
            self._channels.insert(0, channel)
        row = gather.row_to_dict(gather.row_of(report))
        published = self.is_gatherer
        for channel in self._channels:
            if self.is_gatherer and not isinstance(channel, exchange.FileChannel):
                continue  # rank 0 keeps its own report; its file is the one kept
            try:
                channel.publish(self.info.rank, row, report)
                published = True
            except Exception as exc:  # one channel down: the others still carry it
                self.notes.append(f"could not publish through {channel.name}: {exc}")
        if published and self._dir is not None:  # its report holds what the journal held
            self._dir.remove(exchange.journal_file(self.info.rank))
        try:
            if not self.is_gatherer:
                return None
            return self._gather(report, gather.row_of(report), started, stopping)
        finally:
            if self._dir is not None:
                self._dir.close()

    def _gather(
        self, own: Report, own_row: RankEntry, started: float, stopping: Callable[[], bool]
    ) -> Report:
        world = self.info.world_size
        rows: dict[int, RankEntry] = {0: own_row}
        source: dict[int, Any] = {}
        pending = set(range(1, world))
        gone: set[int] = set()  # ranks whose process ended without a report
        wait_from = time.perf_counter()
        deadline = wait_from + self.timeout_s
        next_liveness = wait_from
        stopped = False
        while pending:
            now = time.perf_counter()
            ended = set()
            if now >= next_liveness:  # looked at before the last poll, so no report is missed
                ended = self._processes_gone(pending)
                next_liveness = now + LIVENESS_EVERY_S
            for rank, row, channel in self._poll(pending):
                rows[rank], source[rank] = row, channel
                pending.discard(rank)
            gone |= ended & pending
            now = time.perf_counter()
            if not pending - gone or now >= deadline or not self._channels:
                break
            if not stopped and stopping():
                stopped = True
                deadline = min(deadline, now + STOPPING_WAIT_S)
            time.sleep(min(0.01 if now - wait_from < 1 else 0.05, max(0.0, deadline - now)))
        waited = time.perf_counter() - wait_from
        limit = STOPPING_WAIT_S if stopped else self.timeout_s
        hellos = self._hellos(pending)
        journals: dict[int, Report] = {}  # ranks without a report, made from their journals
        for rank in sorted(pending):
            if rank in gone:
                row = gather.missing_row(
                    rank, "lost", "its process ended without a report (killed, or it crashed)"
                )
            else:
                why = f"no report within {limit:g} s" + (
                    " of the job being stopped" if stopped else ""
                )
                row = gather.missing_row(rank, "timed_out", why + ": the rank hung, or was killed")
            hello = hellos.get(rank, {})
            row.host = hello.get("host") if isinstance(hello.get("host"), str) else None
            row.pid = hello.get("pid") if isinstance(hello.get("pid"), int) else None
            rows[rank] = self._from_journal(row, journals)
        base = self._heaviest_report(own, list(rows.values()), source, journals)
        for channel in self._channels:
            with contextlib.suppress(Exception):
                channel.forget(list(range(world)))
        if not self._kept:
            self._clean_up(rows, source)
        gathered: dict[str, Any] = {
            "via": sorted({channel.name for channel in source.values()}),
            "seconds": round(time.perf_counter() - started, 4),
            "waited_s": round(waited, 4),
            "timeout_s": self.timeout_s,
            "missing": sorted(pending),
            "dir": str(self._dir.path) if self._dir is not None and self._kept else None,
        }
        if self.notes:
            gathered["notes"] = list(self.notes)
        report = gather.job_report(base, list(rows.values()), gathered, world)
        self._write_job_exit(report.exit.code)
        return report

    def _poll(self, pending: set[int]) -> list[tuple[int, RankEntry, Any]]:
        """The rows that arrived since the last poll, through any channel."""
        found = []
        for channel in list(self._channels):
            try:
                arrived = channel.arrived(pending)
            except Exception as exc:
                self.notes.append(f"{channel.name} stopped answering: {exc}")
                self._channels.remove(channel)
                continue
            for rank in sorted(arrived - {r for r, _, _ in found}):
                row = self._row(channel, rank)
                if row is not None:
                    found.append((rank, row, channel))
        return found

    def _hellos(self, ranks: set[int]) -> dict[int, dict[str, Any]]:
        """Where the ranks said they run (host, pid), through any channel; each rank's is
        read once."""
        known = self._known_hellos
        for channel in self._channels:
            unknown = ranks - set(known)
            if not unknown:
                break
            with contextlib.suppress(Exception):
                known.update(channel.hellos(unknown))
        return {rank: known[rank] for rank in ranks if rank in known}

    def _processes_gone(self, ranks: set[int]) -> set[int]:
        """Ranks on this host whose process has ended (or is a zombie)."""
        import psutil

        gone = set()
        for rank, hello in self._hellos(ranks).items():
            pid = hello.get("pid")
            if hello.get("host") != self.info.host or not isinstance(pid, int):
                continue
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    gone.add(rank)
            except psutil.NoSuchProcess:
                gone.add(rank)
            except Exception:
                continue
        return gone

    def _row(self, channel: Any, rank: int) -> RankEntry | None:
        try:
            row = gather.row_from_dict(channel.row(rank), rank)
        except Exception as exc:
            self.notes.append(f"rank {rank}'s report through {channel.name} is unreadable: {exc}")
            return None
        return row if row.rank == rank else None

    def _from_journal(self, row: RankEntry, journals: dict[int, Report]) -> RankEntry:
        """The row of a rank that sent no report, from its journal when it left one."""
        if self._dir is None:
            return row
        try:
            made = journal_row(self._dir, row, self.info.section(), self._kept)
        except VramscopeError as exc:
            self.notes.append(f"rank {row.rank}'s journal is unreadable: {exc}")
            return row
        if made is None:
            return row
        journals[row.rank] = made[1]
        return made[0]

    def _heaviest_report(
        self,
        own: Report,
        rows: list[RankEntry],
        source: dict[int, Any],
        journals: dict[int, Report] | None = None,
    ) -> Report:
        top = gather.heaviest(rows, gather.measure_of(rows))
        if top is not None and journals and top.rank in journals:
            return journals[top.rank]
        if top is None or top.rank == 0 or top.rank not in source:
            return own
        try:
            report = source[top.rank].report(top.rank)
        except Exception as exc:
            self.notes.append(f"rank {top.rank}'s full report is unreadable: {exc}")
            report = None
        return report if report is not None else own

    def _clean_up(self, rows: dict[int, RankEntry], source: dict[int, Any]) -> None:
        """A temporary directory: remove the files read, and it when empty."""
        if self._dir is None:
            return
        for rank in [0, *source]:
            self._dir.remove(exchange.rank_file(rank))
        for rank in rows:  # the journals of ranks that died: their rows hold what they held
            self._dir.remove(exchange.journal_file(rank))
        for row in rows.values():
            row.report_file = None
        with contextlib.suppress(OSError):
            os.rmdir(self._dir.path)

    def _write_job_exit(self, code: int) -> None:
        """Tell ``vramscope run --nproc`` the job's exit code (through its private file)."""
        target = os.environ.get(JOB_EXIT_FILE)
        if not target:
            return
        path = Path(target)
        with contextlib.suppress(exchange.UnsafeDirectory, OSError):
            directory = exchange.PrivateDir(path.parent)
            try:
                directory.write(path.name, json.dumps({"code": code}).encode())
            finally:
                directory.close()
