"""``vramscope run --nproc N``: start torchrun on this machine with vramscope's run as
every rank's entry point, and end with the job's exit code."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from vramscope.distributed import JOB_EXIT_FILE
from vramscope.distributed.exchange import PrivateDir, UnsafeDirectory
from vramscope.errors import VramscopeError

# forwarded to torchrun, which stops its ranks (each leaves its report); Ctrl-C in a
# terminal already reaches every process of the job, so SIGINT is left to them
FORWARDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def torchrun_command(nproc: int, run_args: list[str], script: str, args: list[str]) -> list[str]:
    """torchrun (``python -m torch.distributed.run``) on this machine: ``nproc`` ranks, each
    running ``vramscope run RUN_ARGS SCRIPT ARGS``; a standalone rendezvous (torchrun's own
    store on a free local port)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "vramscope",
        "run",
        *run_args,
        script,
        *args,
    ]


def launch(
    nproc: int,
    run_args: list[str],
    script: str,
    args: list[str],
    stdout: int | None = None,
    without_rank_0: Callable[[], None] | None = None,
) -> int:
    """Run the job; its exit code: the first failing rank's own code (as rank 0's report
    says), else torchrun's. ``stdout``: where the ranks' stdout goes (``--json -``: the
    real stdout, which rank 0 writes the JSON to). ``without_rank_0``: called when rank 0
    ended without the job's report (it was killed)."""
    if not _has_torchrun():
        raise VramscopeError("--nproc needs torch.distributed, which this torch build lacks")
    if not Path(script).is_file():
        raise VramscopeError(f"no such script: {script}")
    base = Path(tempfile.mkdtemp(prefix="vramscope-job-"))  # private: mode 0700
    try:
        exit_file = base / "exit.json"
        env = dict(os.environ, **{JOB_EXIT_FILE: str(exit_file)})
        child = subprocess.Popen(
            torchrun_command(nproc, run_args, script, args), env=env, stdout=stdout
        )
        previous = {}

        def forward(signum: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

        for signum in FORWARDED:
            previous[signum] = signal.signal(signum, forward)
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = child.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        job = _job_exit_code(base)
        if job is None and without_rank_0 is not None:
            without_rank_0()
        if job is not None and (job or not code):
            return job
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _has_torchrun() -> bool:
    """Whether torch has torchrun, found without importing torch (seconds this process
    does not need: only torchrun and the ranks import it)."""
    spec = importlib.util.find_spec("torch")
    places = spec.submodule_search_locations if spec is not None else None
    return any((Path(p) / "distributed" / "run.py").is_file() for p in places or [])


def _job_exit_code(base: Path) -> int | None:
    """The code rank 0 wrote for the job, if it wrote one."""
    try:
        directory = PrivateDir(base)
    except UnsafeDirectory:
        return None
    try:
        raw = directory.read("exit.json", limit=1024)
    finally:
        directory.close()
    if raw is None:
        return None
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        code = json.loads(raw.decode()).get("code")
        if isinstance(code, int) and not isinstance(code, bool) and 0 <= code < 256:
            return code
    return None
