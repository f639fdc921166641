"""Who this process is in a distributed job, from the variables its launcher sets."""

from __future__ import annotations

import datetime
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job (torchrun's variables), and where it runs."""

    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    node_rank: int | None
    host: str
    pid: int
    job: str  # the same for every rank of one job (and attempt), different between jobs
    agent_store: tuple[str, int] | None  # torchrun's store, when its workers use it
    started_at: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankInfo | None:
        """The rank this process is, or None outside a distributed launch (RANK and
        WORLD_SIZE unset or not numbers, or RANK not below WORLD_SIZE)."""
        env = os.environ if env is None else env
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        if rank is None or world is None or world < 1 or rank >= world:
            return None
        port = _int(env, "MASTER_PORT")
        addr = env.get("MASTER_ADDR", "").strip()
        agent = None
        if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true" and addr and port:
            agent = (addr, port)
        return cls(
            rank=rank,
            world_size=world,
            local_rank=_int(env, "LOCAL_RANK"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            node_rank=_int(env, "GROUP_RANK"),
            host=socket.gethostname(),
            pid=os.getpid(),
            job=job_key(env),
            agent_store=agent,
            started_at=now_iso(),
        )

    def section(self) -> dict[str, object]:
        """The report's ``distributed`` section, before anything is measured."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "host": self.host,
            "pid": self.pid,
            "backend": None,
            "job": self.job,
            "started_at": self.started_at,
        }


def job_key(env: Mapping[str, str]) -> str:
    """A name shared by the ranks of one job attempt: torchrun's run id (a fresh UUID for a
    standalone job; the user's --rdzv-id otherwise), or the scheduler's job id, with the
    restart count and the master port; safe as a file name and a store key."""
    run = (
        env.get("TORCHELASTIC_RUN_ID")
        or env.get("SLURM_JOB_ID")
        or env.get("PBS_JOBID")
        or env.get("LSB_JOBID")
        or "job"
    )
    parts = [run, "attempt" + (env.get("TORCHELASTIC_RESTART_COUNT") or "0")]
    if env.get("MASTER_PORT"):
        parts.append("port" + env["MASTER_PORT"])
    key = "-".join(parts)
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:120]


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
