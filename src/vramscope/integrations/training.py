"""One tracked training run for a trainer callback: the Session, log windows, epochs, files."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch

from vramscope.integrations.metrics import LogWindow, epoch_line, unwrap_optimizer
from vramscope.integrations.output import append_epoch, file_stem, journal_file, save_report
from vramscope.report.model import Report
from vramscope.tracking.session import Session

logger = logging.getLogger("vramscope")


class TrainingRun:
    """What a Lightning or Hugging Face callback needs from vramscope, framework-neutral.

    ``start`` opens a Session (steps marked explicitly: one step per optimizer step, one
    per evaluation batch), ``train_step``/``eval_step``/``end_epoch`` follow the trainer's
    hooks, ``log_figures`` gives the memory since the previous log line, and ``finish``
    stops tracking and writes the report. A process that ends while the run is still open
    (a script whose training raised) finishes it at exit, with the exception that ended it.

    The run's journal is written as it goes (see :mod:`vramscope.journal`), so that a
    process killed before ``finish`` (SIGKILL, the OOM killer, a segfault) still leaves
    what ``vramscope report`` makes its report from: ``journal=True`` writes
    ``STEM.journal`` beside the report and removes it once the report is written; a path
    writes that file and keeps it; None writes none.
    """

    def __init__(
        self,
        detail: str = "default",
        depth: int = 3,
        html: bool = True,
        print_report: bool = False,
        filename: str = "vramscope",
        module_steps: str | int = "auto",
        journal: str | os.PathLike[str] | bool | None = True,
    ) -> None:
        # a bad option fails here, not mid-training
        Session(detail=detail, depth=depth, module_steps=module_steps)
        self.journal = journal
        self.journal_path: Path | None = None  # the journal of the run now tracked
        self.detail = detail
        self.depth = depth
        self.module_steps = module_steps
        self.html = html
        self.print_report = print_report
        self.filename = filename
        self.session: Session | None = None
        self.report: Report | None = None
        self.files: list[Path] = []
        self.window = LogWindow()
        self.directory: Path = Path(".")
        self.stem = filename
        self.is_main = True
        self.train_steps = 0
        self._epoch_train_steps = 0
        self._epoch = 0

    @property
    def running(self) -> bool:
        return self.session is not None and self.report is None

    def start(
        self,
        workload: dict[str, Any],
        directory: str | Path,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | None = None,
    ) -> Session:
        if self.running:  # an earlier run that never finished (it raised in a notebook)
            self.finish(error="a new training run started before this one finished")
        self.directory = Path(directory)
        self.stem = file_stem(self.filename, rank, world_size)
        self.is_main = rank == 0
        self.journal_path = journal_file(
            self.journal, self.directory, self.stem, rank=rank, world_size=world_size
        )
        if self.journal_path is not None:
            with contextlib.suppress(OSError):  # (if it cannot be made, the report says so)
                self.journal_path.parent.mkdir(parents=True, exist_ok=True)
        self.session = Session(
            name=str(workload.get("spec") or "training"),
            workload=workload,
            detail=self.detail,
            depth=self.depth,
            module_steps=self.module_steps,
            manual_steps=True,
            manual_epochs=True,  # epochs come from the trainer's hooks only
            journal=self.journal_path,
        )
        self.report = None
        self.files = []
        self.train_steps = self._epoch_train_steps = self._epoch = 0
        self.window = LogWindow(session=self.session)
        self.session.start()
        atexit.register(self._finish_at_exit)
        self._say_journal()
        return self.session

    def _say_journal(self) -> None:
        """Say once where the journal is (printed with ``print_report``, logged always)."""
        if self.journal_path is None:
            return
        if not self.journal_path.is_file():
            self.journal_path = None  # it could not be written (the report says why)
            return
        line = (
            f"vramscope: the run's journal is {self.journal_path}; if this process dies, "
            f"`vramscope report {self.journal_path}` makes its report"
        )
        logger.info(line)
        if self.print_report and self.is_main:
            print(line, flush=True)

    def watch(self, model: torch.nn.Module | None, optimizers: list[Any] = ()) -> None:
        """Models and optimizers (framework wrappers unwrapped) for the exact categories."""
        if self.session is None:
            return
        if isinstance(model, torch.nn.Module):
            self.session.watch(model)
        for optimizer in optimizers:
            inner = unwrap_optimizer(optimizer)
            if inner is not None:
                self.session.watch(inner)

    def built(self) -> None:
        """The model is on its device and the optimizers exist: startup figures, first window."""
        if self.running:
            self.session.mark_built()
            self.window.open()

    def train_step(self) -> None:
        if self.running:
            self.session.step()
            self.train_steps += 1
            self._epoch_train_steps += 1

    def eval_step(self) -> None:
        if self.running:
            self.session.step()

    def log_figures(self) -> dict[str, int]:
        """Bytes since the previous log line (see :class:`LogWindow`)."""
        return self.window.close() if self.running else {}

    def end_epoch(self) -> dict[str, Any] | None:
        """Close the epoch: its summary (bytes), appended to ``STEM.epochs.jsonl``."""
        if not self.running:
            return None
        self.window.close()
        figures = dict(self.window.epoch_peaks)
        summary: dict[str, Any] = {"epoch": self._epoch, "steps": self._epoch_train_steps}
        summary.update({f"{key}_bytes": value for key, value in figures.items()})
        append_epoch(self.directory, self.stem, summary, first=self._epoch == 0)
        if self.print_report and self.is_main:
            print(epoch_line(self._epoch, self._epoch_train_steps, figures), flush=True)
        self.session.epoch()
        self._epoch += 1
        self._epoch_train_steps = 0
        self.window.start_epoch()
        return summary

    def finish(self, exception: BaseException | None = None, error: str | None = None) -> Report:
        """Stop tracking, write ``STEM.json``/``STEM.html``, print the report if asked."""
        if self.report is not None:
            return self.report
        assert self.session is not None, "finish() before start()"
        atexit.unregister(self._finish_at_exit)
        if exception is not None:
            self.session.record_exception(exception)
        elif error is not None:
            self.session.set_exit("error", 1, error)
        self.report = self.session.report()
        self.files = save_report(self.report, self.directory, self.stem, html=self.html)
        if self.journal is True and self.journal_path is not None:
            from vramscope.journal import files

            files.remove(self.journal_path)  # the report has everything it held
        if self.print_report and self.is_main:
            from vramscope.report.terminal import print_report

            print_report(self.report)
            print(f"vramscope: report written to {self.files[0]}", flush=True)
        return self.report

    def _finish_at_exit(self) -> None:
        if self.running:
            exception = getattr(sys, "last_value", None)
            self.finish(exception, error=None if exception else "training did not finish")
