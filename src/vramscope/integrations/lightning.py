"""``VramscopeCallback`` for Lightning: tracks a fit, logs memory metrics, writes the report."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from vramscope.integrations.metrics import as_metrics
from vramscope.integrations.training import TrainingRun


def _import_callback_base() -> type:
    """Lightning's ``Callback`` from the package the user imported: ``pytorch_lightning``
    when only that one is loaded, else ``lightning.pytorch``, else ``pytorch_lightning``."""
    prefer_classic = "pytorch_lightning" in sys.modules and "lightning" not in sys.modules
    names = ("pytorch_lightning", "lightning.pytorch")
    for name in names[::-1] if not prefer_classic else names:
        try:
            module = __import__(name, fromlist=["Callback"])
        except ImportError:
            continue
        return module.Callback
    raise ImportError(
        "vramscope.integrations.lightning needs Lightning: pip install 'vramscope[lightning]' "
        "(or pytorch-lightning)"
    )


Callback: Any = _import_callback_base()


class VramscopeCallback(Callback):
    """Track the memory of ``trainer.fit`` (``Trainer(callbacks=[VramscopeCallback()])``).

    One vramscope Session spans the fit, sanity check and validation included. It watches
    the LightningModule and the optimizers (unwrapped from ``LightningOptimizer``) for exact
    categories; a step is one optimizer step (gradient accumulation included), an epoch is
    Lightning's. Every ``log_every_n_steps`` steps the peak allocated and reserved memory
    since the previous logged step (CUDA) and the host RSS go to the trainer's loggers as
    ``vramscope/...`` metrics in MiB; each epoch adds a line to ``vramscope.epochs.jsonl``; at
    the end of the fit (also when it raised) ``vramscope.json`` and ``vramscope.html`` are
    written to the trainer's log directory (or ``dirpath``). ``print_report=True`` prints
    the epoch lines and the terminal report. ``detail="modules"`` adds the module tree.

    The run's journal is written as the fit goes, ``vramscope.journal`` beside the report
    (``journal_path``), and removed once the report is written: a process killed before
    that (SIGKILL, the OOM killer, a segfault) leaves it, and ``vramscope report
    vramscope.journal`` makes the report from it. ``journal="run.journal"`` writes (and
    keeps) that file instead; ``journal=None`` writes none.
    """

    def __init__(
        self,
        detail: str = "default",
        depth: int = 3,
        dirpath: str | Path | None = None,
        filename: str = "vramscope",
        html: bool = True,
        log_metrics: bool = True,
        print_report: bool = False,
        module_steps: str | int = "auto",
        journal: str | os.PathLike[str] | bool | None = True,
    ) -> None:
        super().__init__()
        self.run = TrainingRun(
            detail=detail,
            depth=depth,
            html=html,
            print_report=print_report,
            filename=filename,
            module_steps=module_steps,
            journal=journal,
        )
        self.dirpath = dirpath
        self.log_metrics = log_metrics
        self._global_step = 0
        self._stepped_batches = 0

    @property
    def journal_path(self) -> Path | None:
        """Where the run's journal is written (None: no journal, or no run yet)."""
        return self.run.journal_path

    @property
    def report(self) -> Any:
        """The Report of the last fit (None until a fit ended)."""
        return self.run.report

    # ---- fit lifecycle ------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        workload = {
            "spec": type(pl_module).__name__,
            "framework": "lightning",
            "precision": str(trainer.precision),
            "accumulate": trainer.accumulate_grad_batches,
        }
        self.run.start(
            workload,
            self._directory(trainer),
            rank=trainer.global_rank,
            world_size=trainer.world_size,
        )
        self.run.watch(pl_module)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # the model is on its device and configure_optimizers has run
        self.run.watch(pl_module, list(trainer.optimizers))
        self.run.built()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = trainer.global_step
        self._stepped_batches = trainer.global_step  # Lightning's logging step, when resumed

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.run.running:
            self.run.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.run.running:
            self.run.finish(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self.run.running:
            self.run.finish(error="the fit ended without on_fit_end")

    # ---- steps and epochs -------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._global_step:
            return  # a micro-batch of gradient accumulation: the step goes on
        self._global_step = trainer.global_step
        self.run.train_step()
        self._stepped_batches += 1
        every = trainer.log_every_n_steps
        if self.log_metrics and every and self._stepped_batches % every == 0:
            # the step Lightning logs this batch's own metrics at
            self._log(trainer, self.run.log_figures(), step=self._stepped_batches - 1)

    def on_validation_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.run.eval_step()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        summary = self.run.end_epoch()
        if summary is not None and self.log_metrics:
            figures = {
                key.removesuffix("_bytes"): value
                for key, value in summary.items()
                if key.endswith("_bytes")
            }
            self._log(trainer, figures, step=max(self._stepped_batches - 1, 0), prefix="epoch_")

    # ---- files and metrics ------------------------------------------------------------------
    def _directory(self, trainer: Any) -> Path:
        """The trainer's log directory, found without a collective call (``trainer.log_dir``
        broadcasts, which would hang when one rank raised)."""
        if self.dirpath is not None:
            return Path(self.dirpath)
        for logger in trainer.loggers[:1]:
            for attribute in ("log_dir", "save_dir"):
                value = getattr(logger, attribute, None)
                if value:
                    return Path(value)
        return Path(trainer.default_root_dir)

    def _log(self, trainer: Any, figures: dict[str, int], step: int, prefix: str = "") -> None:
        metrics = as_metrics(figures, prefix)
        if not metrics:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
