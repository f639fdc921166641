"""One rank's part at the end of a distributed run: publish its report; on rank 0, gather
every rank's into the job's report, waiting at most the gather timeout."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vramscope.distributed import exchange, gather
from vramscope.distributed.memory import DistributedMemory
from vramscope.distributed.rank import RankInfo, now_iso
from vramscope.errors import VramscopeError
from vramscope.report.model import RankEntry, Report

DEFAULT_TIMEOUT_S = 60.0
# once rank 0 is being stopped (torchrun stops every rank when one fails, and kills them
# 30 s later), the others are being stopped too: wait at most this long for their reports
STOPPING_WAIT_S = 10.0
JOB_EXIT_FILE = "VRAMSCOPE_JOB_EXIT_FILE"  # set by `vramscope run --nproc` for rank 0
VIA = ("auto", "files")


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

    @classmethod
    def from_env(cls, **options: Any) -> RankJob | None:
        info = RankInfo.from_env()
        return None if info is None else cls(info, **options)

    @property
    def is_gatherer(self) -> bool:
        return self.info.rank == 0

    def attach(self, session: Any) -> None:
        """Let ``session`` read DDP's and FSDP's memory while the models live."""
        session.object_probes.append(self.memory)

    # ---- the end of the rank ---------------------------------------------------------
    def finish(self, report: Report, stopping: Callable[[], bool] = lambda: False) -> Report | None:
        """Publish this rank's report; on rank 0 return the job's report (None elsewhere)."""
        started = time.perf_counter()
        section = self.info.section()
        section.update(backend=self.memory.backend, ended_at=now_iso(), memory=self.memory.items())
        report.extra["distributed"] = section
        directory, kept = self._directory()
        if directory is not None:
            section["report_file"] = str(directory.path / exchange.rank_file(self.info.rank))
        channels = self._channels(directory)
        row = gather.row_of(report)
        for channel in channels:
            try:
                channel.publish(self.info.rank, gather.row_to_dict(row), report)
            except Exception as exc:  # one channel down: the others still carry it
                self.notes.append(f"could not publish through {channel.name}: {exc}")
        if not self.is_gatherer:
            if directory is not None:
                directory.close()
            return None
        try:
            return self._gather(report, row, channels, directory, kept, started, stopping)
        finally:
            if directory is not None:
                directory.close()

    def _directory(self) -> tuple[exchange.PrivateDir | None, bool]:
        try:
            return exchange.rank_dir(self.json_path, self.info.job)
        except (exchange.UnsafeDirectory, OSError) as exc:
            self.notes.append(f"no rank files: {exc}")
            return None, False

    def _channels(self, directory: exchange.PrivateDir | None) -> list[Any]:
        channels: list[Any] = []
        if self.via == "auto":
            store = exchange.group_store()
            if store is not None:
                channels.append(exchange.StoreChannel(store, self.info.job, "process group store"))
            if self.info.agent_store is not None:
                agent = exchange.agent_store(self.info.agent_store)
                if agent is not None:
                    channels.append(exchange.StoreChannel(agent, self.info.job, "torchrun store"))
        if directory is not None:
            channels.append(exchange.FileChannel(directory, self.info.job))
        return channels

    def _gather(
        self,
        own: Report,
        own_row: RankEntry,
        channels: list[Any],
        directory: exchange.PrivateDir | None,
        kept: bool,
        started: float,
        stopping: Callable[[], bool],
    ) -> Report:
        world = self.info.world_size
        rows: dict[int, RankEntry] = {0: own_row}
        source: dict[int, Any] = {}
        pending = set(range(1, world))
        wait_from = time.perf_counter()
        deadline = wait_from + self.timeout_s
        stopped = False
        while pending:
            for channel in list(channels):
                try:
                    arrived = channel.arrived(pending)
                except Exception as exc:
                    self.notes.append(f"{channel.name} stopped answering: {exc}")
                    channels.remove(channel)
                    continue
                for rank in sorted(arrived):
                    row = self._row(channel, rank)
                    if row is not None:
                        rows[rank], source[rank] = row, channel
                        pending.discard(rank)
            now = time.perf_counter()
            if not pending or now >= deadline or not channels:
                break
            if not stopped and stopping():
                stopped = True
                deadline = min(deadline, now + STOPPING_WAIT_S)
            time.sleep(min(0.01 if now - wait_from < 1 else 0.05, max(0.0, deadline - now)))
        waited = time.perf_counter() - wait_from
        limit = STOPPING_WAIT_S if stopped else self.timeout_s
        for rank in sorted(pending):
            rows[rank] = gather.missing_row(
                rank,
                "timed_out",
                f"no report within {limit:g} s"
                + (" of the job being stopped" if stopped else "")
                + " (the rank hung, or its process was killed)",
            )
        base = self._heaviest_report(own, list(rows.values()), source)
        if not kept:
            self._clean_up(directory, rows, source)
        for channel in channels:
            with contextlib.suppress(Exception):
                channel.forget(sorted(source))
        gathered = {
            "via": sorted({channel.name for channel in source.values()}),
            "seconds": round(time.perf_counter() - started, 4),
            "waited_s": round(waited, 4),
            "timeout_s": self.timeout_s,
            "missing": sorted(pending),
            "dir": str(directory.path) if directory is not None and kept else None,
        }
        if self.notes:
            gathered["notes"] = list(self.notes)
        report = gather.job_report(base, list(rows.values()), gathered, world)
        self._write_job_exit(report.exit.code)
        return report

    def _row(self, channel: Any, rank: int) -> RankEntry | None:
        try:
            data = channel.row(rank)
            row = (
                gather.row_from_dict(data, rank)
                if data is not None
                else gather.row_of(channel.report(rank))
            )
        except Exception as exc:
            self.notes.append(f"rank {rank}'s report through {channel.name} is unreadable: {exc}")
            return None
        return row if row.rank == rank else None

    def _heaviest_report(
        self, own: Report, rows: list[RankEntry], source: dict[int, Any]
    ) -> Report:
        top = gather.heaviest(rows, gather.measure_of(rows))
        if top is None or top.rank == 0 or top.rank not in source:
            return own
        try:
            report = source[top.rank].report(top.rank)
        except Exception as exc:
            self.notes.append(f"rank {top.rank}'s full report is unreadable: {exc}")
            report = None
        return report if report is not None else own

    def _clean_up(
        self,
        directory: exchange.PrivateDir | None,
        rows: dict[int, RankEntry],
        source: dict[int, Any],
    ) -> None:
        """A temporary directory: remove the files read, and it when empty."""
        if directory is None:
            return
        for rank in [0, *source]:
            directory.remove(exchange.rank_file(rank))
        for row in rows.values():
            row.report_file = None
        with contextlib.suppress(OSError):
            os.rmdir(directory.path)

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
