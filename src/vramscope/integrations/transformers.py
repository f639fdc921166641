"""``VramscopeCallback`` for the Hugging Face ``Trainer``: memory in its logs, the report on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "vramscope.integrations.transformers needs transformers: pip install 'vramscope[hf]'"
    ) from exc

from vramscope.integrations.metrics import as_metrics
from vramscope.integrations.training import TrainingRun


class VramscopeCallback(TrainerCallback):
    """Track the memory of ``Trainer.train()`` (``Trainer(..., callbacks=[VramscopeCallback()])``).

    One vramscope Session spans the training, evaluation included; it watches the model and
    the optimizer (unwrapped from accelerate's wrapper) for exact categories. A step is one
    optimizer step, so the micro-batches of gradient accumulation stay in one step; an epoch
    is the Trainer's. Every log line gets ``vramscope/...`` metrics in MiB: the peak
    allocated and reserved memory since the previous line (CUDA) and the host RSS. They reach
    ``trainer.state.log_history``, the printed logs and the callbacks after this one; the
    reporting integrations (W&B, TensorBoard, MLflow) run before callbacks given to the
    Trainer, so use :meth:`attach` for them. Each epoch adds a line to
    ``vramscope.epochs.jsonl``; at the end ``vramscope.json`` and ``vramscope.html`` are
    written to ``args.output_dir`` (or ``output_dir``). If ``train()`` raises, the partial
    report is written when the process exits, or by :meth:`finish`.

    The run's journal is written as the training goes, ``vramscope.journal`` beside the
    report (``journal_path``), and removed once the report is written: a process killed
    before that (SIGKILL, the OOM killer, a segfault) leaves it, and ``vramscope report
    vramscope.journal`` makes the report from it. ``journal="run.journal"`` writes (and
    keeps) that file instead; ``journal=None`` writes none.
    """

    def __init__(
        self,
        detail: str = "default",
        depth: int = 3,
        output_dir: str | Path | None = None,
        filename: str = "vramscope",
        html: bool = True,
        log_metrics: bool = True,
        print_report: bool = False,
        module_steps: str | int = "auto",
        journal: str | os.PathLike[str] | bool | None = True,
    ) -> None:
        self.run = TrainingRun(
            detail=detail,
            depth=depth,
            html=html,
            print_report=print_report,
            filename=filename,
            module_steps=module_steps,
            journal=journal,
        )
        self.output_dir = output_dir
        self.log_metrics = log_metrics
        self._epoch_open = False

    @property
    def journal_path(self) -> Path | None:
        """Where the run's journal is written (None: no journal, or no run yet)."""
        return self.run.journal_path

    @property
    def report(self) -> Any:
        """The Report of the last training (None until one ended)."""
        return self.run.report

    def attach(self, trainer: Any) -> VramscopeCallback:
        """Put this callback first, ahead of the reporting integrations, so that W&B,
        TensorBoard or MLflow log its metrics too: ``VramscopeCallback().attach(trainer)``."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def finish(self, exception: BaseException | None = None) -> Any:
        """Stop tracking now and write the report (for a notebook whose training raised)."""
        if self.run.running:
            return self.run.finish(exception, error=None if exception else "stopped by finish()")
        return self.run.report

    # ---- TrainerCallback events -----------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        workload = {
            "spec": type(model).__name__ if model is not None else "Trainer",
            "framework": "transformers",
            "batch_size": args.per_device_train_batch_size,
            "accumulate": args.gradient_accumulation_steps,
            "precision": "bf16-mixed" if args.bf16 else "16-mixed" if args.fp16 else "32-true",
        }
        self.run.start(
            workload,
            self.output_dir if self.output_dir is not None else args.output_dir,
            rank=args.process_index,
            world_size=args.world_size,
            device=args.device,
        )
        self.run.watch(model, [kwargs.get("optimizer")])
        self.run.built()
        self._epoch_open = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.train_step()  # after the optimizer step and zero_grad

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.eval_step()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer evaluates after on_epoch_end: an epoch closes when the next one begins
        # (or training ends), so its evaluation stays in it.
        if self._epoch_open:
            self.run.end_epoch()
        self._epoch_open = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not self.log_metrics or logs is None or not self.run.running:
            return
        metrics = as_metrics(self.run.log_figures())
        history = state.log_history
        # the Trainer appended a copy of these logs to its history just before this event
        if history and all(history[-1].get(key) == value for key, value in logs.items()):
            history[-1].update(metrics)
        logs.update(metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run.running:
            if self._epoch_open:
                self.run.end_epoch()
            self.run.finish()
