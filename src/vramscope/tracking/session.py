"""The tracking Session: the public face of tracking a real run (``track()``, ``profile``),
its lifecycle, the hooks' callbacks that say where phases and steps begin, and its Report.

What is recorded at each boundary is :mod:`vramscope.tracking.boundaries` (the Session's
base); the report is made in one pass by :mod:`vramscope.tracking.assemble`.

Cost model: at each phase boundary (a handful per step) one read of the allocator's nested
counters and one peak reset; a background thread samples the timeline. Nothing runs per
module call (only each model's outermost call is seen), nothing reads the allocator per
module, nothing dispatches per op, nothing keeps a tensor alive. The objects' bytes
(parameters, gradients, optimizer state) are counted when a model or optimizer is first
seen and at the end, so a model that is gone (or moved off the device) by the end still
has its categories.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from vramscope.contract import exit_status
from vramscope.errors import first_line
from vramscope.report.model import Report
from vramscope.sources import allocator, nvml
from vramscope.sources.allocator import LEDGER, AllocatorReading
from vramscope.sources.host import ProcessTreeRss
from vramscope.tracking.boundaries import StepBoundaries, _Light
from vramscope.tracking.categories import ObjectCategories, ObjectLedger, model_tensors
from vramscope.tracking.hooks import GlobalHooks
from vramscope.tracking.phase_reads import ReadSchedule, check_phase_policy
from vramscope.tracking.sampler import Sample, Sampler

F = TypeVar("F", bound=Callable[..., Any])
NVML_PROCESS_INTERVAL_S = 1.0
SAMPLE_INTERVAL_S = 0.1  # the timeline's sampler, by default
# ... while the steps are so short that their phases are read on a sample of them: each tick
# takes the interpreter lock from a training thread that holds it nearly all the time, and
# on an NVIDIA H200 host those hand-overs were half of the cost of tracking a 4 ms step;
# 10 samples a second show nothing inside such steps anyway (the phases' peaks come from
# the allocator's reads)
SPACED_SAMPLE_INTERVAL_S = 0.5
_grad_enabled = torch.is_grad_enabled  # (read at every model call)


class Session(StepBoundaries):
    """Tracks the memory of whatever runs inside it (``with vramscope.track() as s: ...``).

    Steps and phases are found by hooks (forward, backward, optimizer, zero_grad,
    DataLoader); ``step()`` and ``epoch()`` mark them explicitly instead when called.
    """

    def __init__(
        self,
        device: str | torch.device | None = None,
        interval_s: float | None = None,
        name: str | None = None,
        workload: dict[str, Any] | None = None,
        detail: str = "default",
        timeline_capacity: int = 4096,
        status: bool = True,
        hooks: bool = True,
        manual_steps: bool = False,
        manual_epochs: bool = False,
        depth: int = 3,
        lines_of: list[Any] | None = None,
        snapshot: str | None = None,
        module_steps: str | int = "auto",
        phase_steps: str | int = "auto",
        journal: str | os.PathLike[str] | bool | None = True,
    ) -> None:
        # the run's journal (vramscope.journal): a path, True (the private directory, removed
        # when the session stops; as track()) or None; read at start()
        self.journal = journal
        self._journal: Any = None
        # -- attribution: detail="modules"/"lines", see tracking/attribution.py --
        from vramscope.tracking.attribution import check_detail
        from vramscope.tracking.marking import check_policy

        check_detail(detail, depth)
        self._attribution: Any = None
        self._attribution_options = {
            "depth": depth,
            "lines_of": lines_of,
            "snapshot": snapshot,
            "module_steps": check_policy(module_steps),
        }
        # -- end attribution --
        self._phase_policy = check_phase_policy(phase_steps)
        super().__init__()
        self.name = name
        self.workload_info = dict(workload or {})
        self.detail = detail
        self._requested_device = torch.device(device) if device is not None else None
        # None: SAMPLE_INTERVAL_S, and SPACED_SAMPLE_INTERVAL_S while the phases are read on
        # a sample of the steps (short steps: see _pace_sampler)
        self._interval_auto = interval_s is None
        self._interval_s = SAMPLE_INTERVAL_S if interval_s is None else interval_s
        self._capacity = timeline_capacity
        self._use_status = status
        self._use_hooks = hooks
        self._hooks: GlobalHooks | None = None
        self._sampler: Sampler | None = None
        self._sampler_paces: list[tuple[float, float]] = []  # (t, interval) on each change
        self._status: Any = None
        self._rss_main = ProcessTreeRss()
        self._rss_sampler = ProcessTreeRss()
        self._device_index: int | None = None
        self._device_uuid: str | None = None
        self._nvml_device: nvml.NvmlDevice | None = None
        self._running = False
        self._t0 = 0.0
        self._t_end: float | None = None
        self._models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._has_params: weakref.WeakKeyDictionary[torch.nn.Module, bool] = (
            weakref.WeakKeyDictionary()
        )
        self._first_trainable: weakref.WeakKeyDictionary[torch.nn.Module, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        # the model and optimizer seen last (weakly): a hook's check at every step
        self._last_model: Callable[[], Any] = _nothing
        self._last_optimizer: Callable[[], Any] = _nothing
        self._explicit_steps = manual_steps
        self._explicit_epochs = manual_epochs
        self._main_loader: Callable[[], Any] | None = None
        self._main_loader_iters = 0
        self._first_reading: AllocatorReading | None = None
        self._first_reading_rss: int | None = None
        # the objects' bytes, the highest seen (a model gone by the end keeps its bytes)
        self._ledger = ObjectLedger()
        # called with (models, device type) each time the objects' bytes are counted, to
        # read more from the models while they live (DDP's gradient buckets, FSDP groups)
        self.object_probes: list[Callable[[list[torch.nn.Module], str], None]] = []
        # the GPU of this process when it never leaves device 0 for another (a rank's
        # LOCAL_RANK: scripts often place tensors on cuda:LOCAL_RANK without set_device)
        self.preferred_cuda_index: int | None = None
        self._unseen_forwards = 0
        self._nvml_read_at = -1e9  # when the sampler last asked NVML for our process's memory
        self._context_bytes: int | None = None  # device used - reserved, at that reading
        self._notes: list[str] = []
        self._exit: dict[str, Any] = {"status": "ok", "code": 0, "error": None}
        self._oom: dict[str, Any] | None = None
        self._final: dict[str, Any] = {}
        self._report: Report | None = None

    # ---- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.record_exception(exc)
        self.stop()

    def start(self) -> Session:
        if self._running:
            return self
        self._t0 = time.perf_counter()
        self._running = True
        LEDGER.install()
        requested = self._requested_device
        if (
            not self._ensure_device()
            and (requested is None or requested.type == "cuda")
            and torch.cuda.is_available()
        ):
            nvml.init_soon()  # no CUDA context yet: NVML starts meanwhile, on its own thread
        self._first_reading = None
        self._read_light(reset=True)  # the first reading
        # the host memory at the start: the sampler's first sample, taken at once on its
        # thread (listing the process tree takes a fraction of a millisecond)
        self._first_reading_rss = None
        if self._use_hooks:
            self._hooks = GlobalHooks(self)
            self._hooks.install()
            for model in list(self._models):
                self._hooks.adopt(model)
        from vramscope.tracking.attribution import start_recorder

        # what the peak is made of comes from the allocator's trace of the steps that hold
        # it (the default detail traces the first steps, and a step after a new peak)
        self._attribution = start_recorder(self)
        if (self._attribution is None or not self._attribution.markers) and (
            self._phase_policy != "all"
        ):
            self._phase_reads = ReadSchedule(self._phase_policy)
        if self.journal and self.journal is not True:
            # written as the run goes: a report can be made if the process dies. A path the
            # user named is there when this returns; the private directory's (True) is
            # opened on the sampler's thread, before its first sample
            from vramscope.journal.writer import open_journal

            self._journal = open_journal(self, self.journal)
        self._sampler = Sampler(
            self._sample,
            interval_s=self._interval_s,
            capacity=self._capacity,
            on_tick=self._tick,
            on_start=self._start_in_background,
        )
        # the first sample (host memory, NVML's listing) is the thread's, taken at once: the
        # run does not wait for it (NVML's calls leave the interpreter lock to the run)
        self._sampler.start()
        return self

    def _start_in_background(self) -> None:
        """What the run need not wait for, on the sampler's thread before its first tick
        (``stop()`` joins it): the journal in the private directory, the status file
        ``watch`` reads, and the private directory's journals of runs that died, pruned
        (never a running process's: not this one's)."""
        if self.journal is True:
            from vramscope.journal.leftovers import directory, prune
            from vramscope.journal.writer import open_journal

            self._journal = open_journal(self, True)
            with contextlib.suppress(Exception):  # (never into the user's run)
                # once a process and directory: a later session's would find what this one
                # left, and pay for listing the directory again
                where = str(directory())
                if where not in _PRUNED:
                    _PRUNED.add(where)
                    prune()
        if self._use_status:
            self._status = _open_status(self)

    def stop(self) -> None:
        """Stop tracking and remove every hook; safe to call twice."""
        if not self._running:
            return
        self._running = False
        try:
            now = time.perf_counter()
            self._tail = self._next_reads = None  # after the last update: its step's
            self._count_unread()
            light = self._read_light(reset=False)
            self._close_phase(now, light)
            self._finish_step(now, light)
            if self._sampler is not None:
                with contextlib.suppress(Exception):
                    self._sampler.stop()  # its last sample before this one, in order
                    self._sampler.sample_now()  # (the first, if the thread took none)
            self._final = self._final_readings(light[3] if light else None)
        finally:
            if self._attribution is not None:  # attribution: remove its hooks first
                from vramscope.tracking.attribution import stop_recorder

                stop_recorder(self)
            if self._hooks is not None:
                self._hooks.remove()
            if self._sampler is not None:
                self._sampler.stop()
            if self._journal is not None:  # the end record: how the script ended
                with contextlib.suppress(Exception):
                    self._journal.close()
            if self._status is not None:
                with contextlib.suppress(Exception):
                    self._status.close()
            LEDGER.uninstall()
            self._t_end = time.perf_counter()

    # ---- explicit markers --------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of a step (call once per iteration, like ``profiler.step()``)."""
        self._explicit_steps = True
        if not self._running:
            return
        self._tail = None
        self._boundary(time.perf_counter(), starting=True)

    def epoch(self) -> None:
        """Mark the end of an epoch; the next step belongs to the next epoch."""
        self._explicit_epochs = True
        self._new_epoch()

    def mark_built(self) -> None:
        """Note that the model and optimizer now exist: the startup figures are read here."""
        if self._running:
            self._first_reading = None
            self._read_light(reset=True)  # the first reading, now
        self._first_reading_rss = self._rss_main.read()

    def watch(self, *objects: torch.nn.Module | torch.optim.Optimizer) -> None:
        """Tell the session about models and optimizers before they are first used.

        A watched model's calls are seen even when it was compiled with
        ``model.compile()`` before tracking started.
        """
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self._models.add(obj)
                if self._hooks is not None:
                    self._hooks.adopt(obj)
                if self._running:
                    self._count_objects()
            elif isinstance(obj, torch.optim.Optimizer):
                self._optimizers.add(obj)
                self._ledger.new_optimizer()

    def window(self) -> dict[str, int | None]:
        """The peaks since the previous ``window()`` (or the start), for metrics logged per
        step: ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``allocated_bytes``,
        ``reserved_bytes`` (None without CUDA) and ``host_rss_bytes``.

        Exact and harmless: the phase that is open keeps its own peak, and the user's
        ``torch.cuda.max_memory_allocated()`` is not touched.
        """
        result: dict[str, int | None] = dict.fromkeys(
            ("peak_allocated_bytes", "peak_reserved_bytes", "allocated_bytes", "reserved_bytes")
        )
        result["host_rss_bytes"] = self._rss_main.read()
        if not self._running:
            return result
        light = self._read_light(reset=True)
        if light is None:
            return result
        allocated, peak_allocated, peak_reserved, raw = light
        self._carry_allocated = max(self._carry_allocated, peak_allocated)
        self._carry_reserved = max(self._carry_reserved, peak_reserved)
        result.update(
            peak_allocated_bytes=max(self._window_allocated, peak_allocated),
            peak_reserved_bytes=max(self._window_reserved, peak_reserved),
            allocated_bytes=allocated,
            reserved_bytes=raw["reserved_bytes"]["all"]["current"],
        )
        self._window_allocated = self._window_reserved = -1
        return result

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a region of your own as a phase (``data``, ``other``, or any name)."""
        self._transition(name)
        try:
            yield
        finally:
            self._transition("other")

    def record_exception(self, exc: BaseException) -> None:
        """Note how the run ended; an OOM gets an OOM report."""
        if isinstance(exc, KeyboardInterrupt):
            self._exit = {"status": "interrupted", "code": 130, "error": "interrupted (Ctrl-C)"}
        elif isinstance(exc, torch.cuda.OutOfMemoryError):
            self._exit = {"status": "oom", "code": 1, "error": first_line(exc)}
            self._oom = self._oom_details(exc)
        elif isinstance(exc, SystemExit):
            code = exit_status(exc.code)
            if code:
                self._exit = {"status": "error", "code": code, "error": f"exited with {code}"}
        else:
            self._exit = {
                "status": "error",
                "code": 1,
                "error": f"{type(exc).__name__}: {first_line(exc)}",
            }
        if self._journal is not None:
            self._journal.on_exit()

    def set_exit(self, status: str, code: int, error: str | None = None) -> None:
        self._exit = {"status": status, "code": code, "error": error}
        if self._journal is not None:
            self._journal.on_exit()

    # ---- reading ---------------------------------------------------------------------------
    def _ensure_device(self) -> bool:
        """Pick the CUDA device once the process has a context; never create one."""
        if self._device_index is not None:
            return True
        if self._requested_device is not None and self._requested_device.type != "cuda":
            return False
        if not allocator.cuda_initialized():
            return False
        if self._requested_device is not None and self._requested_device.index is not None:
            index = self._requested_device.index
        else:
            index = torch.cuda.current_device()
            preferred = self.preferred_cuda_index
            if index == 0 and preferred and preferred < torch.cuda.device_count():
                index = preferred
        self._device_index = index
        with contextlib.suppress(Exception):
            self._device_uuid = "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
            self._nvml_device = nvml.device_by_uuid(self._device_uuid)
        return True

    def _read_light(self, reset: bool) -> _Light | None:
        """The three numbers a phase boundary needs (and the stats they came from)."""
        if self._device_index is None and not self._ensure_device():
            return None
        stats = LEDGER.read_for_tracking(self._device_index, reset=reset)
        allocated = stats["allocated_bytes"]["all"]
        if self._first_reading is None:
            self._first_reading = allocator.reading_from_stats(stats)
        return (
            allocated["current"],
            allocated["peak"],
            stats["reserved_bytes"]["all"]["peak"],
            stats,
        )

    def _sample(self, t: float) -> Sample:
        """One timeline sample (on the sampler's thread).

        NVML's per-process query is slow and takes the driver's locks, so it runs at most
        every ``NVML_PROCESS_INTERVAL_S``; in between, device used is reserved plus the
        context and libraries measured at the last query.
        """
        allocated = reserved = used = None
        if self._device_index is not None or (self._running and self._ensure_device()):
            stats = allocator.raw_stats(self._device_index)
            allocated = allocator._all(stats, "allocated_bytes", "current")
            reserved = allocator._all(stats, "reserved_bytes", "current")
            if self._nvml_device is not None:
                if t - self._nvml_read_at >= NVML_PROCESS_INTERVAL_S:
                    self._nvml_read_at = t
                    with contextlib.suppress(Exception):
                        used = self._nvml_device.process_used_bytes()
                    if used is not None:
                        self._context_bytes = used - reserved
                elif self._context_bytes is not None:
                    used = reserved + self._context_bytes
        rss = self._rss_sampler.read()
        if self._first_reading_rss is None:
            self._first_reading_rss = rss
        return (t - self._t0, allocated, reserved, used, rss)

    def _tick(self, sample: Sample) -> None:
        """After each sample (the sampler's thread): into the journal, the phase reads'
        schedule told of a rise, the status file."""
        journal = self._journal
        if journal is not None:
            journal.on_sample(sample)
        schedule = self._phase_reads
        if (
            schedule is not None
            and not self._step_reads
            and sample[1] is not None
            and sample[1] > self._peak_allocated >= 0
        ):
            # memory rose above every peak read so far while steps read nothing (a leak, a
            # longer batch): read every step again, so the steps show where it goes
            schedule.again()
        if self._status is None:
            return
        step = self._step
        with contextlib.suppress(Exception):
            self._status.update(
                phase=self._phase.name if self._phase else None,
                step=step.index if step else None,
                epoch=self._epoch,
                allocated_bytes=sample[1],
                reserved_bytes=sample[2],
                device_used_bytes=sample[3],
                host_rss_bytes=sample[4],
                peak_allocated_bytes=max(self._peak_allocated, 0) or None,
                device=self._device_index,
                device_uuid=self._device_uuid,
            )

    # ---- the objects' bytes ------------------------------------------------------------------
    def _count_objects(self) -> ObjectCategories:
        """Count the models' and optimizers' bytes now, keeping the highest seen (returns
        what they hold now); the attribution labels their storages at the same moment."""
        models, optimizers = list(self._models), list(self._optimizers)
        walked = model_tensors(models)  # (one walk over the modules for both)
        now = self._ledger.count(models, optimizers, self._device_type, walked)
        if self._attribution is not None:
            self._attribution.census(models, optimizers, walked=walked)
        for probe in self.object_probes:
            with contextlib.suppress(Exception):
                probe(models, self._device_type)
        return now

    # ---- the sampler's pace -------------------------------------------------------------
    def _pace_sampler(self) -> None:
        """The sampler's interval by the steps' length: ``SPACED_SAMPLE_INTERVAL_S`` once the
        schedule reads the phases on a sample of the steps, else ``SAMPLE_INTERVAL_S``."""
        schedule, sampler = self._phase_reads, self._sampler
        if schedule is None or sampler is None or self._device_index is None:
            return
        spaced = schedule.interval > 1 and schedule.first_unread is not None
        interval = SPACED_SAMPLE_INTERVAL_S if spaced else self._interval_s
        if sampler.interval_s != interval:
            sampler.interval_s = interval
            self._sampler_paces.append((round(time.perf_counter() - self._t0, 6), interval))

    def holds_process_groups(self) -> bool:
        """Whether a model seen in this run still holds a process group (DDP's, FSDP's),
        after the script may have destroyed the default one."""
        return any(getattr(m, "process_group", None) is not None for m in list(self._models))

    @property
    def _device_type(self) -> str:
        return "cuda" if self._device_index is not None else "cpu"

    def _is_model(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` has parameters (the last model seen is asked before this)."""
        known = self._has_params.get(module)
        if known is None:
            known = next(module.parameters(), None) is not None
            self._has_params[module] = known
            if known:
                self._models.add(module)
                attribution = self._attribution
                if attribution is not None and attribution.takes_roots:
                    attribution.adopt_root(module)  # (the count's census names its storages)
                self._count_objects()
        if known:
            with contextlib.suppress(TypeError):
                self._last_model = weakref.ref(module)
        return known

    def _grads_live(self, module: torch.nn.Module) -> bool:
        """Whether the model's gradients exist (its first trainable parameter's does)."""
        ref = self._first_trainable.get(module)
        param = ref() if ref is not None else None
        if param is None:
            param = next((p for p in module.parameters() if p.requires_grad), None)
            if param is None:
                return False
            self._first_trainable[module] = weakref.ref(param)
        return param.grad is not None

    # ---- hook callbacks (PhaseListener) -------------------------------------------------
    def on_forward_start(self, module: torch.nn.Module) -> None:
        if not self._running or (self._last_model() is not module and not self._is_model(module)):
            return
        grad = _grad_enabled()
        key = id(module)
        step = self._step
        new_step = False
        if (
            step is not None
            and not self._explicit_steps
            and (
                step.saw_optimizer
                or (not grad and (step.backwards or key in step.forward_modules))
                or (grad and step.forwards and not step.grad_forward)
                # no optimizer in the run (parameters updated by hand, ``p -= lr * p.grad``):
                # this model's gradients, made by a backward of this step, cleared since (they
                # were used): a new step begins. (Another model's that never had any, a GAN's
                # generator called after the discriminator's backward, is not this.)
                or (
                    grad
                    and step.backwards
                    and not self._optimizers
                    and key in step.forward_modules
                    and not self._grads_live(module)
                )
            )
        ):
            new_step = True
        if (
            new_step
            or step is None
            or self._force_new_step
            or (self._phase is None or self._phase.name != "forward")
        ):
            self._transition("forward", new_step=new_step)
        attribution = self._attribution
        if attribution is not None and attribution.takes_roots:
            attribution.on_root(module)  # attribution: mark the model's modules
        step = self._step
        if step is not None:
            if step.forwards == 0 and step.reads:
                step.grads_live_at_start = self._grads_live(module)
            step.forwards += 1
            if grad:
                step.grad_forward = True
            step.forward_modules.add(key)

    def on_backward_start(self) -> None:
        if not self._running:
            return
        step, phase = self._step, self._phase
        if step is not None and step.forwards == 0 and phase is not None:
            # the forward ran where no model call was visible (compiled code, or a model
            # compiled before tracking started): what ran before this backward was it
            if phase.name in ("zero_grad", "data", "other"):
                phase.name = "forward"
            step.forwards += 1
            step.grad_forward = True
            self._unseen_forwards += 1
        elif (
            step is not None
            and step.backwards
            and not self._explicit_steps
            and not self._optimizers
            and self._unseen_forwards
        ):
            # no optimizer step is visible (a compiled training step): a backward after
            # a backward starts a new step
            self._force_new_step = True
        self._transition("backward")
        if self._step is not None:
            self._step.backwards += 1

    def on_optimizer_start(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._running:
            return
        # the optimizer that ended the step steps again before anything else: the next step
        # (its forward and backward run inside it, in a closure); another one: the same step
        again = self._tail is not None and self._ended_by == id(optimizer)
        if self._last_optimizer() is not optimizer:
            if optimizer not in self._optimizers:
                self._optimizers.add(optimizer)
                self._ledger.new_optimizer()
            with contextlib.suppress(TypeError):
                self._last_optimizer = weakref.ref(optimizer)
        self._transition("optimizer", new_step=again)
        attribution = self._attribution
        if attribution is not None and attribution.recording:  # the gradients' storages
            attribution.on_optimizer_start(optimizer, list(self._models))

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer) -> None:
        if self._step is not None:
            self._step.saw_optimizer = True
        attribution = self._attribution
        if attribution is not None and attribution.recording:  # the state's storages
            attribution.on_optimizer_end(optimizer)
        if self._ledger.due and self._running and self._ledger.step_ended(optimizer):
            # a new optimizer's state exists once its first step has ended (not when the
            # optimizer phase closes: a closure's forward and backward run inside the step).
            # Still none: a step skipped (GradScaler's inf checks) or an optimizer without
            # state (SGD without momentum), which would pay a count of every parameter per
            # step; the first steps are counted, then the 16th, 32nd, ... (and the end)
            self._count_objects()
        if self._running and not self._explicit_steps:
            # a training step ends where its last optimizer step ends (_update_ended)
            self._ended_by = id(optimizer)
            self._update_ended()

    def on_zero_grad(self) -> None:
        if not self._running:
            return
        step = self._step
        # a step ends at its optimizer step; with no optimizer in the run (an update by
        # hand), at the gradients zeroed after its backward
        new_step = bool(
            step
            and (step.saw_optimizer or (step.backwards and not self._optimizers))
            and not self._explicit_steps
        )
        if self._phase is not None and self._phase.name == "zero_grad" and not new_step:
            return
        self._transition("zero_grad", new_step=new_step)

    def on_data(self, loader_id: int | None) -> None:
        if not self._running:
            return
        step = self._step
        new_step = False
        if step is not None and not self._explicit_steps:
            new_step = step.saw_optimizer or (step.forwards > 0 and step.backwards == 0)
        self._transition("data", new_step=new_step)

    def on_loader_iter(self, loader: Any) -> None:
        """A new pass over the first dataset iterated is a new epoch; another one (a
        validation loop) starts a new step. New DataLoader objects per epoch count too."""
        if not self._running:
            return
        self._rss_sampler.relist_soon()  # DataLoader workers start now
        if self._explicit_epochs:
            return
        source = getattr(loader, "dataset", loader)
        main = self._main_loader() if self._main_loader is not None else None
        if main is None:
            try:
                self._main_loader = weakref.ref(source)
            except TypeError:  # an object without weak references: compare by identity
                self._main_loader = lambda source=source: source
            self._main_loader_iters = 1
            return
        if main is source:
            self._main_loader_iters += 1
            self._new_epoch()
        else:
            self._force_new_step = True

    # ---- results -----------------------------------------------------------------------------
    def _final_readings(self, stats: dict[str, Any] | None) -> dict[str, Any]:
        reading = allocator.reading_from_stats(stats) if stats is not None else None
        final: dict[str, Any] = {"reading": reading, "nvml": None}
        final["objects"] = self._count_objects()
        recorder = self._attribution
        if reading is not None and (recorder is None or not recorder.tracing):
            # (a recorder that traces the allocator takes its own snapshot when it stops)
            with contextlib.suppress(Exception):
                segments = torch.cuda.memory_snapshot()
                final["private_pools"] = allocator.private_pools(segments, self._device_index)
        if self._nvml_device is not None:
            with contextlib.suppress(Exception):
                memory = self._nvml_device.memory()
                processes = self._nvml_device.processes()  # (one listing serves both)
                final["nvml"] = {
                    "memory": memory,
                    "processes": processes,
                    "own_used": self._nvml_device.process_used_bytes(procs=processes),
                }
        return final

    def _oom_details(self, exc: BaseException) -> dict[str, Any]:
        from vramscope.tracking.oom import module_in_traceback, oom_details

        return oom_details(
            exc,
            device_index=self._device_index,
            phase=self._phase.name if self._phase else None,
            step=self._step.index if self._step else None,
            module=module_in_traceback(exc, list(self._models)),
            nvml_device=self._nvml_device,
        )

    def report(self) -> Report:
        """The Report of what was tracked (stops the session first if still running)."""
        if self._running:
            self.stop()
        if self._report is None:
            from vramscope.tracking.assemble import make_report

            self._report = make_report(self)
        return self._report


_PRUNED: set[str] = set()  # the private directories whose left-overs this process pruned


def _nothing() -> None:
    """A dead weak reference's answer, before anything was seen."""
    return None


def _open_status(session: Session) -> Any:
    try:
        from vramscope.tracking.status import StatusWriter
    except Exception:  # status files are a convenience for `watch`; never fail the run
        return None
    try:
        return StatusWriter(
            {
                "pid": os.getpid(),
                "name": session.name or " ".join(sys.argv[:3]),
                "workload": session.workload_info.get("spec"),
            }
        )
    except Exception:
        return None


def track(
    device: str | torch.device | None = None,
    interval_s: float | None = None,
    name: str | None = None,
    detail: str = "default",
    depth: int = 3,
    lines_of: list[Any] | None = None,
    snapshot: str | None = None,
    module_steps: str | int = "auto",
    phase_steps: str | int = "auto",
    journal: str | os.PathLike[str] | bool | None = True,
) -> Session:
    """Track the memory of a block of code: ``with vramscope.track() as session: ...``.

    ``interval_s``: the timeline's sampling interval; by default 0.1 s, and 0.5 s while the
    steps are so short that their phases are read on a sample of them.
    ``detail="modules"`` adds the module tree and exact categories at the peak
    (``module_steps``: ``"auto"``, ``"all"`` or N, the steps that place module markers, see
    :mod:`vramscope.tracking.marking`);
    ``detail="lines"`` also line tables of ``lines_of`` (functions, files or names);
    ``snapshot`` writes a memory_viz snapshot when the report is made. ``phase_steps``
    (``"auto"``, ``"all"`` or N): on CUDA, the steps read phase by phase, see
    :mod:`vramscope.tracking.phase_reads`. ``journal``: where the run's journal is written
    as it goes (``vramscope report JOURNAL`` makes the report from it when the process dies):
    True, the user's private directory (removed when the session stops); a path (kept);
    None, no journal.
    """
    return Session(
        device=device,
        interval_s=interval_s,
        name=name,
        detail=detail,
        depth=depth,
        lines_of=lines_of,
        snapshot=snapshot,
        module_steps=module_steps,
        phase_steps=phase_steps,
        journal=journal,
    )


def profile(
    func: F | None = None,
    *,
    print_report: bool = True,
    json_path: str | None = None,
    lines: bool = False,
    detail: str | None = None,
    journal: str | os.PathLike[str] | bool | None = True,
) -> Any:
    """Decorator: track each call of ``func``; the report is kept on ``func.last_report``.

    ``lines=True`` adds a line table of ``func`` (peak and change of allocated memory
    and host RSS per line, like memory_profiler); ``detail="modules"`` the module tree.
    ``journal``: where each call's journal is written as it goes (``vramscope report
    JOURNAL`` makes the report from it when the process dies): True, ``NAME.journal``
    beside ``json_path`` (removed once the report is written), else the user's private
    directory (removed when the call ends; ``vramscope report --list`` lists those a dead
    process left); a path (kept); None, no journal.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            target: Any = journal
            if journal is True and json_path:
                from vramscope.journal.files import beside

                target = beside(json_path)
            session = Session(
                name=fn.__qualname__,
                workload={"spec": fn.__qualname__},
                detail="lines" if lines else (detail or "default"),
                lines_of=[fn] if lines else None,
                journal=target,
            )
            try:
                with session:
                    return fn(*args, **kwargs)
            finally:
                report = session.report()
                wrapper.last_report = report  # type: ignore[attr-defined]
                if json_path:
                    report.save(json_path)
                    if target is not journal:  # beside the report: it holds everything now
                        from vramscope.journal.files import remove

                        remove(target)
                if print_report:
                    from vramscope.report.terminal import print_report as show

                    show(report)

        wrapper.last_report = None  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate
