"""Per-module, per-category and per-line attribution of a real run: the recording side.

The cost is kept to markers. When the session finds a model, every module of it down to
``depth`` is marked and its class gets the thin call wrapper of :mod:`vramscope.tracking.hooks`
(modules deeper, and every other module, keep nn.Module's fast path, and torch.compile never
sees a hook); a marked module's call appends ``["m", module]``/``["x", module]`` to a list; a
hook on the autograd node of its output appends ``["b", module]`` when the gradient reaches
it; the session appends phases and steps. No hook reads the allocator. On CUDA the allocations
come from the allocator's own trace (:mod:`vramscope.tracking.trace_windows`); at every marker the
allocator's user metadata is set to the marker count (behind a token unique to the
session: the allocator keeps it per thread, and a thread keeps a previous session's), so
each trace entry says exactly which markers came before it (without that API, markers are
placed by time). On the CPU a
dispatch mode records each new storage and a weak reference records its free, into the
same list as the markers. At the moments the session counts the objects' bytes (a model
found, a new optimizer's first steps, the end), and at each recorded optimizer step for the
gradients, a census puts the addresses of the storages the objects hold into the same list:
the analysis classifies blocks by them. With the default detail, on CUDA, a recorder without
module markers traces the first steps and a step after each new peak: what the peak is made
of comes from the same analysis (:mod:`vramscope.tracking.peak`). After the run,
:meth:`Recorder.event_log` builds one :class:`~vramscope.tracking.events.EventLog` either
way; the analysis is :mod:`vramscope.report.modules`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vramscope.tracking.categories import OBJECT_CATEGORIES, local_tensor, object_tensors
from vramscope.tracking.events import (
    ALLOC,
    BACKWARD,
    CENSUS,
    ENTER,
    EXIT,
    FREE,
    PHASE,
    STEP,
    UPDATE,
    EventLog,
    trim_records,
)
from vramscope.tracking.marking import MarkerSchedule
from vramscope.tracking.trace_windows import AllocatorTrace

DETAILS = ("default", "modules", "lines")
MAX_RECORDS = int(os.environ.get("VRAMSCOPE_MAX_RECORDS", "3000000"))
# a Python stack per CUDA allocation costs most of the `modules` overhead (measured on an
# H200: +21.9% on resnet50-bf16-mixed): recorded only for `lines`, or with VRAMSCOPE_STACKS=1
STACKS_ALWAYS = os.environ.get("VRAMSCOPE_STACKS", "") not in ("", "0")
BACKWARD_HOOK_DEPTH = 8  # modules nested deeper get no backward marker of their own
# frames in these folders are never "the line that created a tensor": torch's and our own
_OWN = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_LIBRARY_DIRS = (
    os.path.dirname(os.path.realpath(torch.__file__)) + os.sep,
    os.path.join(_OWN, "tracking") + os.sep,
    os.path.join(_OWN, "workload.py"),
    os.path.join(_OWN, "cli") + os.sep,
)


def _is_compiling() -> bool:
    return False


with contextlib.suppress(Exception):
    _is_compiling = torch.compiler.is_compiling  # type: ignore[assignment]


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor of a module's output that autograd will send a gradient to."""
    if isinstance(output, torch.Tensor):
        return output if output.grad_fn is not None else None
    if isinstance(output, dict):
        output = list(output.values())[:4]
    if isinstance(output, (list, tuple)):
        for item in output[:4]:
            if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                return item
    return None


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


# frames of code that is not the user's own: vramscope's, torch's, the standard library's
# and installed packages' (a Trainer's loop)
_NOT_USERS = tuple(
    {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        os.path.dirname(os.path.abspath(torch.__file__)),
        *(
            os.path.abspath(path)
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (path := sysconfig.get_paths().get(key))
        ),
    }
)
_CONTAINER_LIMIT = 64  # entries of a dict or list looked through for a model


def _bound_name(module: torch.nn.Module) -> str | None:
    """The name the user's code calls ``module`` by (a global variable of the nearest frame
    outside vramscope, torch, the standard library and installed packages: a script's
    ``model``, ``models["enc"]``, ``heads[0]``), found once when a model is first seen; None
    when it has none there. A function's locals are not read: on Python < 3.13 reading them
    keeps a snapshot of them on the frame, holding the user's tensors alive."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_USERS):
        frame = frame.f_back
    if frame is None:
        return None
    for name, value in list(frame.f_globals.items()):
        if name.startswith("__"):
            continue
        if value is module:
            return name
        if isinstance(value, dict) and len(value) <= _CONTAINER_LIMIT:
            key = next((k for k, v in value.items() if v is module), None)
            if key is not None:
                return f"{name}[{key!r}]"
        elif isinstance(value, (list, tuple)) and len(value) <= _CONTAINER_LIMIT:
            at = next((i for i, v in enumerate(value) if v is module), None)
            if at is not None:
                return f"{name}[{at}]"
    return None


class _StorageTracker(TorchDispatchMode):
    """CPU source: each new storage an operator returns is an allocation; its death a free."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        record = self.recorder._record_storage
        if isinstance(out, torch.Tensor):
            record(out)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    record(item)
        return out


class Recorder:
    """Records what attribution needs while a Session runs; builds the EventLog after."""

    def __init__(
        self,
        device_type: str,
        device_index: int | None = None,
        lines: bool = False,
        line_targets: Iterable[Any] = (),
        stacks: bool = True,
        backward_depth: int = BACKWARD_HOOK_DEPTH,
        marker_depth: int | None = None,
        module_steps: str | int = "all",
    ) -> None:
        self.device_type = device_type
        # modules nested deeper than this place no markers: what they allocate counts to
        # their ancestor at this depth (None: every module is marked; -1: none, the default
        # detail's recording of what the peak is made of)
        self.marker_depth = marker_depth
        self.markers = marker_depth is None or marker_depth >= 0
        # which steps place module markers (see tracking/marking.py); phases and steps are
        # recorded in every step, the allocator's trace on CUDA in the marked ones
        self.schedule = MarkerSchedule(module_steps)
        self.marking = True
        self.device_index = device_index
        self.lines = lines
        self.stacks = stacks
        self.backward_depth = backward_depth
        self.log: list[list[Any]] = []
        self.base = 0  # global index of log[0] (markers trimmed from the front)
        self.baseline: list[list[int]] = []
        self.active = False
        self.phase = "other"
        self.notes: list[str] = []
        self.modules: list[weakref.ref[torch.nn.Module]] = []
        self._index: dict[int, int] = {}
        self._marked: dict[int, int] = {}  # id(module) -> index, for modules that place markers
        self._listening = False
        self._classes: list[str] = []
        self._codes: list[str | None] = []  # where each module's forward is defined
        self._names: dict[int, tuple[int, str]] = {}  # module -> (root, dotted name)
        self._labels: dict[int, str] = {}  # root -> the name the user's code gives it
        self._roots: list[int] = []
        self._marked_roots: set[int] = set()  # roots whose modules on_root marked
        self.stack: list[int] = []
        self._node_handles: list[Any] = []  # hooks on autograd nodes (backward markers)
        self._backward_hooks: dict[int, Callable[[Any], None]] = {}
        self._censuses: list[list[list[Any]]] = []
        # the session's optimizers when it stops (the census of what is left)
        self.optimizers: list[torch.optim.Optimizer] = []
        self._state_counts: dict[int, int] = {}
        self._param_names: dict[int, tuple[int, str]] | None = None
        self._step_starts: list[int] = []
        self._dropped_steps = 0
        self._mode: _StorageTracker | None = None
        self._live: dict[int, int] = {}  # CPU: storage data_ptr -> block
        self._refs: dict[int, Any] = {}  # CPU: block -> weakref to its storage
        self._next_block = 0
        self._frames: list[list[Any]] = []
        self._frame_index: dict[tuple[Any, ...], int] = {}
        self._cuda_on = False
        # on CUDA, with markers on a schedule, the allocator's trace runs only in the steps
        # with markers (its entries cost about half a microsecond per allocation and free,
        # which is most of what a step without markers would otherwise pay): one window of
        # trace per run of marked steps (see tracking/trace_windows.py)
        self._windowed = device_type == "cuda" and self.schedule.policy != "all"
        self._history_on = False
        self._trace: AllocatorTrace | None = None  # on CUDA, once it started
        self._set_meta: Callable[[str], None] | None = None
        # the allocator's user metadata is per thread and outlives the session (the autograd
        # thread keeps the last count its backward hooks set): a token tells ours apart
        self._meta_prefix = f"vramscope:{os.getpid():x}.{id(self):x}.{time.time_ns():x}:"
        self._old_meta: str | None = None
        self._marker_times: list[float] | None = None
        self._tracer: Any = None
        self._line_targets = list(line_targets)
        self._event_log: EventLog | None = None
        self._module_table: list[dict[str, Any]] = []
        self.mark: Callable[[list[Any]], None] = self.log.append

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Recorder:
        from vramscope.tracking import hooks

        self.active = True
        try:
            if self.markers:
                hooks.add_listener(self)
                self._listening = True
            if self.device_type == "cpu":
                self._mode = _StorageTracker(self)
                self._mode.__enter__()
            else:
                self.maybe_start_cuda()
            if self.lines:
                from vramscope.tracking.lines import LineTargets, LineTracer

                targets = LineTargets(self._line_targets)
                if targets:
                    self._tracer = LineTracer(self._mark_line, targets).start()
                else:
                    self.notes.append("--detail lines: no function or file to profile was given")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove every hook, mode, tracer and the allocator recording; safe to call twice."""
        if not self.active:
            return
        self.active = False
        errors: list[str] = []
        for undo in (
            self._stop_tracer,
            self._remove_hooks,
            self._exit_mode,
            self._resume_history,  # the final census sees the blocks of the end
            self._final_census,
            self._stop_cuda,
        ):
            try:
                undo()
            except Exception as exc:  # keep undoing; say what failed
                errors.append(f"{undo.__name__.strip('_')}: {type(exc).__name__}: {exc}")
        self.notes.extend(f"attribution: {e}" for e in errors)

    def _stop_tracer(self) -> None:
        if self._tracer is not None:
            self._tracer.stop()

    def _remove_hooks(self) -> None:
        if self._listening:
            from vramscope.tracking import hooks

            hooks.remove_listener(self)
            self._listening = False
        for handle in self._node_handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self._node_handles.clear()
        self.stack.clear()

    def _exit_mode(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
        self._refs.clear()  # no free is recorded after the run

    @property
    def tracing(self) -> bool:
        """Whether the allocator's trace was started (it ends with a snapshot)."""
        return self.active and self._cuda_on

    @property
    def recording(self) -> bool:
        """Whether allocations are recorded now (on CUDA with markers on a schedule, only in
        the marked steps: each runs in a window of the allocator's trace)."""
        return self.device_type != "cuda" or not self._windowed or self._history_on

    @property
    def takes_roots(self) -> bool:
        """Whether a model's outermost call is noted now (it places markers, or allocations
        are recorded: its storages are labelled)."""
        return self.markers or self.recording

    # ---- CUDA source ----------------------------------------------------------------------------
    def maybe_start_cuda(self) -> None:
        """Start the allocator's trace once the process has a CUDA context (never create one)."""
        if self._cuda_on or self.device_type != "cuda" or not self.active:
            return
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return
        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        if not self.markers and (
            (enabled is not None and enabled())
            or getattr(torch._C, "_cuda_setMemoryMetadata", None) is None
        ):
            # the default detail leaves the program's own recording of the allocator alone,
            # and traces only where markers can bound its steps (the peak is then split at
            # phase boundaries)
            self.active = False
            return
        if self.device_index is None:
            self.device_index = torch.cuda.current_device()
        self._trace = AllocatorTrace(self.device_index, self.stacks)
        self._start_history()
        self._cuda_on = True
        set_meta = getattr(torch._C, "_cuda_setMemoryMetadata", None)
        get_meta = getattr(torch._C, "_cuda_getMemoryMetadata", None)
        log = self.log
        if set_meta is not None:
            with contextlib.suppress(Exception):
                self._old_meta = get_meta() if get_meta is not None else None
            self._set_meta = set_meta
            recorder = self
            prefix = self._meta_prefix

            def mark(record: list[Any]) -> None:
                log.append(record)
                set_meta(prefix + str(recorder.base + len(log)))

            set_meta(prefix + str(self.base + len(log)))
        else:
            self._marker_times = [0.0] * len(log)
            times = self._marker_times
            clock = time.time_ns

            def mark(record: list[Any]) -> None:
                log.append(record)
                times.append(clock() / 1000)

            self._trace.probe()
            self._windowed = False  # markers placed by time need one unbroken trace
        self.mark = mark

    def _start_history(self) -> None:
        """Start the allocator's trace (a new window of it)."""
        self._trace.start(self.base + len(self.log))  # type: ignore[union-attr]
        self._history_on = True

    def _pause_history(self) -> None:
        """A step without markers begins: close the window (its cost is the marked steps')."""
        if not (self._windowed and self._history_on and self._cuda_on):
            return
        started = time.perf_counter()
        try:
            self._trace.take(self.base + len(self.log))  # type: ignore[union-attr]
        except Exception as exc:  # never the user's run: trace every step from here on
            self._windowed = False
            self.notes.append(
                f"attribution: the allocator trace could not be taken at a step without "
                f"markers ({type(exc).__name__}: {exc}); it ran in every step from there"
            )
            return
        self._trace.off()  # type: ignore[union-attr]
        self._history_on = False
        self.schedule.charge(time.perf_counter() - started)

    def _resume_history(self) -> None:
        if self._windowed and self._cuda_on and not self._history_on:
            enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
            if not self.markers and enabled is not None and enabled():
                self._cuda_on = False  # the program records it now: leave it alone
                return
            try:
                self._start_history()
            except Exception as exc:  # never the user's run: no trace from here on
                self._windowed = False
                self.notes.append(
                    f"attribution: the allocator trace could not be started again "
                    f"({type(exc).__name__}: {exc}); later steps are not in it"
                )

    def _stop_cuda(self) -> None:
        if not self._cuda_on:
            return
        trace = self._trace
        assert trace is not None
        try:
            if self._set_meta is None:
                trace.probe()
            torch.cuda.synchronize(self.device_index)
            if not self._history_on:  # the end state: an empty last window
                self._start_history()
            trace.finish()
        finally:
            self._cuda_on = False
            self._history_on = False
            trace.off()
            if self._set_meta is not None:
                with contextlib.suppress(Exception):
                    self._set_meta(self._old_meta or "")
            self.mark = self.log.append

    # ---- CPU source -------------------------------------------------------------------------------
    def _record_storage(self, t: torch.Tensor) -> None:
        if not self.active or t.device.type != "cpu" or t.layout is not torch.strided:
            return
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            size = storage.nbytes()
        except Exception:  # tensor subclasses and functional wrappers have no plain storage
            return
        if ptr == 0 or ptr in self._live:
            return
        block = self._next_block
        self._next_block += 1
        self._live[ptr] = block
        self._refs[block] = weakref.ref(storage, self._freed_callback(block, ptr))
        self.log.append([ALLOC, block, ptr, size, self._frame_here(), _shape(t), _dtype(t)])

    def _frame_here(self) -> int:
        frame = sys._getframe(2)
        chosen = None
        while frame is not None:
            filename = frame.f_code.co_filename
            if not (filename.startswith("<") or filename.startswith(_LIBRARY_DIRS)):
                chosen = frame
                break
            frame = frame.f_back
        if chosen is None:
            return -1
        key = (chosen.f_code.co_filename, chosen.f_lineno, chosen.f_code.co_name)
        index = self._frame_index.get(key)
        if index is None:
            index = self._frame_index[key] = len(self._frames)
            self._frames.append(list(key))
        return index

    def _adopt(self, t: torch.Tensor) -> None:
        """A CPU tensor that existed before tracking: live from the start until it dies."""
        with contextlib.suppress(Exception):
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0 or ptr in self._live:
                return
            block = self._next_block
            self._next_block += 1
            self._live[ptr] = block
            self.baseline.append([block, ptr, storage.nbytes()])
            self._refs[block] = weakref.ref(storage, self._freed_callback(block, ptr))

    def _freed_callback(self, block: int, ptr: int) -> Callable[[Any], None]:
        log, live, refs = self.log, self._live, self._refs

        def freed(_: Any) -> None:
            refs.pop(block, None)
            if live.get(ptr) == block:
                del live[ptr]
            log.append([FREE, block])

        return freed

    # ---- modules -------------------------------------------------------------------------------------
    def _register(self, module: torch.nn.Module) -> int:
        index = len(self.modules)
        self.modules.append(weakref.ref(module))
        self._classes.append(type(module).__name__)
        self._codes.append(_forward_code(module))
        self._index[id(module)] = index
        return index

    def _name_tree(self, root: torch.nn.Module, root_index: int) -> None:
        """Remember the dotted names under a root now, in case the model is gone at the end."""
        compiled = hasattr(root, "_orig_mod") and type(root).__name__ == "OptimizedModule"
        if compiled or getattr(root, "_compiled_call_impl", None) is not None:
            model = root._orig_mod if compiled else root
            self.notes.append(
                f"{type(model).__name__} runs under torch.compile: what its compiled "
                "code allocates is attributed to the compiled call"
                + (" (row _orig_mod)" if compiled else "")
                + "; modules inside compiled code run no hooks, so they show only what ran "
                "eagerly"
            )
            if self.device_type == "cpu":
                self.notes.append(
                    "on the CPU, --detail modules sees allocations through a dispatch mode, "
                    "and torch.compile runs code eagerly while one is active: the compiled "
                    "model ran uncompiled in this run (on CUDA it stays compiled)"
                )
        for name, module in _named_modules(root):  # a compiled model's own names
            self._names.setdefault(self.module_index(module), (root_index, name))

    def module_index(self, module: torch.nn.Module) -> int:
        index = self._index.get(id(module))
        if index is None or self.modules[index]() is not module:
            index = self._register(module)
        return index

    def _enter(self, module: torch.nn.Module) -> None:
        """A call of a wrapped class begins (see hooks.wrap_class): marked modules mark it."""
        index = self._marked.get(id(module))
        if (
            index is None
            or not self.marking
            or not self.active
            or self.modules[index]() is not module
        ):
            return
        self.stack.append(index)
        self.mark([ENTER, index])

    def _exit(self, module: torch.nn.Module, output: Any = None) -> None:
        index = self._marked.get(id(module))
        if index is None or not self.active or not self.stack or self.stack[-1] != index:
            return
        self.stack.pop()
        self.mark([EXIT, index])
        if (
            output is not None
            and self.phase != "backward"
            and len(self.stack) < self.backward_depth
            and torch.is_grad_enabled()
        ):
            tensor = _first_grad_tensor(output)
            if tensor is not None:  # the gradient reaching this output is a backward marker
                hook = self._backward_hooks.get(index)
                if hook is None:
                    hook = self._backward_hooks[index] = self._backward_hook(index)
                try:  # noqa: SIM105 (cheaper than contextlib.suppress on every call)
                    self._node_handles.append(tensor.grad_fn.register_prehook(hook))
                except Exception:  # a node that takes no hooks: no marker of its own
                    pass

    def _backward_hook(self, index: int) -> Callable[[Any], None]:
        """The hook marking where the gradient reaches module ``index``'s output (made once)."""

        def reached(grad_outputs: Any) -> None:
            if self.active:
                self.mark([BACKWARD, index])

        return reached

    def on_root(self, module: torch.nn.Module) -> None:
        """The session saw a model's outermost call: mark its modules down to the depth."""
        if not self.active or _is_compiling():
            return
        index = self.module_index(module)
        if index in self._marked_roots:
            return
        self._marked_roots.add(index)
        if self._register_root(module, index):
            # its parameters and buffers by their storages, while it lives: a model made at
            # the top level of a script is gone by the end (runpy clears its namespace)
            self.census([module], [], ("parameters", "buffers"))
        from vramscope.tracking import hooks

        added = []
        for name, sub in _named_modules(module):
            depth = name.count(".") + 1 if name else 0
            if self.marker_depth is not None and depth > self.marker_depth:
                continue
            sub_index = self.module_index(sub)
            self._marked[id(sub)] = sub_index
            hooks.wrap_class(type(sub), instance=sub)
            added.append(id(sub))
        if not self.marking:  # found in a step without markers: quiet until the next one
            hooks.set_instances(added, False)

    def adopt_root(self, module: torch.nn.Module) -> None:
        """A model the session found just now, before it counts the objects: the census of
        that count labels this model's storages under their names (``on_root`` then takes
        none of its own)."""
        if self.active and not _is_compiling():
            self._register_root(module, self.module_index(module))

    def _register_root(self, module: torch.nn.Module, index: int) -> bool:
        """Make ``module`` a root (its names, the trace started); whether it is new."""
        if index in self._roots:
            return False
        self._roots.append(index)
        self._param_names = None
        label = _bound_name(module)
        if label is not None:
            self._labels[index] = label
        if index not in self._names:
            self._name_tree(module, index)
        if self.device_type == "cuda":
            self.maybe_start_cuda()
        else:
            for t in list(module.parameters()) + list(module.buffers()):
                if t.device.type == "cpu":
                    self._adopt(t)
        return True

    # ---- phases, steps, optimizer ---------------------------------------------------------------------
    def on_phase(self, name: str) -> None:
        if not self.active:
            return
        if self.device_type == "cuda" and not self._cuda_on:
            self.maybe_start_cuda()
        elif not self.markers and not self.recording:  # the default detail, a step not traced
            self.phase = name
            return
        self.phase = name
        self.mark([PHASE, name])

    def on_step(self, index: int, reads: bool = True) -> None:
        """Step ``index`` begins; ``reads``: whether it reads its phases (only such a step
        is marked)."""
        if not self.active:
            return
        if len(self._node_handles) > 4096:  # hooks of graphs long gone: keep the newest
            del self._node_handles[:-4096]
        marking = self.schedule.begin(index, reads)
        if marking != self.marking:
            self._set_marking(marking)
        if self._windowed and marking:
            self._resume_history()
        # the default detail keeps nothing of a step it does not trace, however long the run;
        # its marker still goes into the window that closes here (the step may have begun
        # where the last optimizer step ended, inside that window)
        if self.markers or self.recording or not self._cuda_on:
            self._step_starts.append(len(self.log))
            self.mark([STEP, index])
            if len(self.log) > MAX_RECORDS:
                self._trim()
        if self._windowed and not marking:
            self._pause_history()

    def on_update_end(self) -> None:
        """An optimizer step ended: a step that begins before the next phase began here."""
        if self.active and (self.markers or self.recording):
            self.mark([UPDATE])

    def _set_marking(self, on: bool) -> None:
        """Turn the module markers on or off (between steps): the marked modules' calls
        stop reaching the recorder, so a step without markers runs at nn.Module's speed."""
        from vramscope.tracking import hooks

        while self.stack and not on:  # a call left open (an exception): close it
            self.mark([EXIT, self.stack.pop()])
        self.marking = on
        hooks.set_instances(self._marked, on)

    def _trim(self) -> None:
        """Keep the newest half of the log, cut at a step boundary."""
        half = len(self.log) // 2
        cut = next((s for s in self._step_starts if s >= half), None)
        if cut is None or cut == 0:
            return
        kept, baseline = trim_records(self.log, self.baseline, cut)
        dropped = sum(1 for s in self._step_starts if s < cut)
        self.log[:] = kept
        self.baseline = baseline
        self.base += cut
        if self._marker_times is not None:
            del self._marker_times[:cut]
        self._step_starts = [s - cut for s in self._step_starts if s >= cut]
        self._dropped_steps += dropped

    def _mark_line(self, record: list[Any]) -> None:
        if self.active:
            self.mark(record)

    def _tensor_names(self) -> dict[int, tuple[int, str]]:
        """id(parameter or buffer) -> (owning module, dotted name), the first owner wins
        (tied weights); made again when a new model is found."""
        if self._param_names is None:
            names: dict[int, tuple[int, str]] = {}
            for root in self._root_modules():
                for mod_name, module in root.named_modules():
                    owner = self.module_index(module)
                    for kind in (module._parameters, module._buffers):
                        for t_name, t in kind.items():
                            if t is not None:
                                names.setdefault(id(t), (owner, f"{mod_name}.{t_name}".lstrip(".")))
            self._param_names = names
        return self._param_names

    def census(
        self,
        models: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        what: tuple[str, ...] = OBJECT_CATEGORIES,
        walked: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    ) -> None:
        """Label, by address, the storages the objects hold now (the session counts their
        bytes at the same moments): the analysis classifies every block by them. Only while
        allocations are recorded (on CUDA, in a window of the allocator's trace).
        ``walked``: the models' parameters and buffers when the caller has them."""
        if not (self.active and self.recording) or (
            self.device_type == "cuda" and not self._cuda_on
        ):
            return
        names = self._tensor_names()
        entries: list[list[Any]] = []
        seen: set[int] = set()
        for t, category, owner_of, key in object_tensors(models, optimizers, what, walked):
            local = local_tensor(t)
            if local.device.type != self.device_type or local.layout is not torch.strided:
                continue
            try:
                ptr = local.untyped_storage().data_ptr()
            except Exception:  # tensor subclasses without a plain storage
                continue
            if not ptr or ptr in seen:
                continue
            seen.add(ptr)
            owner, name = names.get(id(t if owner_of is None else owner_of), (-1, "?"))
            name = f"{name}.{key}" if key else name
            entries.append([ptr, category, owner, name, _shape(local), _dtype(local)])
        if entries:
            self._censuses.append(entries)
            self.mark([CENSUS, len(self._censuses) - 1])

    def on_optimizer_start(
        self, optimizer: torch.optim.Optimizer, models: list[torch.nn.Module]
    ) -> None:
        """The gradients as the optimizer step begins: every model's (a GAN's other model
        keeps gradients its optimizer has not stepped), in each step that is recorded."""
        self.census(models, [optimizer], ("gradients",))

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's state when it changes (its first step, mostly)."""
        count = len(optimizer.state)
        if self._state_counts.get(id(optimizer)) != count:
            self._state_counts[id(optimizer)] = count
            self.census([], [optimizer], ("optimizer_state",))

    # ---- the end of the run ------------------------------------------------------------------------
    def _root_modules(self) -> list[torch.nn.Module]:
        roots = [self.modules[i]() for i in self._roots]
        alive = [r for r in roots if r is not None]
        if len(alive) > 1:  # the largest first
            alive.sort(key=lambda m: -sum(p.numel() for p in m.parameters()))
        return alive

    def add_models(self, models: Iterable[torch.nn.Module]) -> None:
        """Models the session knows (watched or seen) that never ran a forward while tracked."""
        for model in models:
            index = self.module_index(model)
            if index not in self._roots and not any(
                self.modules[r]() is not None and _contains(self.modules[r](), model)
                for r in self._roots
            ):
                self._roots.append(index)
                self._param_names = None

    def _final_census(self) -> None:
        """The module table (names, classes, nesting) and the storages every object left
        holds; what each module holds at the peak comes from the labelled blocks."""
        roots = self._root_modules()
        for root in roots:
            root_index = self.module_index(root)
            if root_index not in self._names:
                self._name_tree(root, root_index)
        named = {index: name for index, (_root, name) in self._names.items()}
        owner_of = {index: root for index, (root, _name) in self._names.items()}
        by_name = {(owner_of[i], named[i]): i for i in named}
        table: list[dict[str, Any]] = []
        for index, ref in enumerate(self.modules):
            module = ref()
            name = named.get(index, "")  # "": a root, or seen in a forward under no root
            root = owner_of.get(index, index)
            parent = -1
            if name:
                parent = by_name.get((root, name.rsplit(".", 1)[0] if "." in name else ""), -1)
            table.append(
                {
                    "name": name,
                    "class": self._classes[index] if module is None else type(module).__name__,
                    "root": root,
                    "parent": parent,
                    "depth": name.count(".") + 1 if name else 0,
                    "code": self._codes[index] if index < len(self._codes) else None,
                    "label": self._labels.get(index),  # a root: its name in the user's code
                }
            )
        self._module_table = table
        self.census(roots, self.optimizers)

    # ---- the event log -------------------------------------------------------------------------------
    def event_log(self) -> EventLog:
        """Everything recorded, in the one format the analysis reads (built once)."""
        if self._event_log is not None:
            return self._event_log
        log = EventLog(
            source="cuda-trace" if self.device_type == "cuda" else "cpu-dispatch",
            device=self.device_type if self.device_index is None else f"cuda:{self.device_index}",
            modules=self._module_table,
            censuses=self._censuses,
            notes=list(self.notes),
            meta={
                "dropped_steps": self._dropped_steps,
                "torch_version": torch.__version__,
                "lines_mode": getattr(self._tracer, "mode", None),
                "module_steps": self.schedule.summary(),
            },
        )
        if self._tracer is not None:
            log.codes = self._tracer.code_table()
        if self.device_type == "cpu":
            log.records = self.log
            log.baseline = self.baseline
            log.frames = self._frames
        else:
            self._join_trace(log)
        if self._dropped_steps:
            log.notes.append(
                f"the run was long: the attribution keeps its last steps; "
                f"{self._dropped_steps} earlier steps were dropped"
            )
        self._event_log = log
        return log

    def _join_trace(self, log: EventLog) -> None:
        """The allocator's trace (its windows) joined with the markers, into ``log``."""
        trace = self._trace
        if trace is None or trace.raw_snapshot is None or not trace.windows:
            log.records = list(self.log)
            log.notes.append(
                "no allocator trace: CUDA was never initialized while tracking, "
                "so allocations could not be attributed"
            )
            return
        trace.join(
            log,
            self.log,
            marker_base=self.base,
            marker_times=self._marker_times,
            metadata_prefix=self._meta_prefix if self._set_meta is not None else "",
            library_dirs=_LIBRARY_DIRS,
        )

    def raw_snapshot(self) -> dict[str, Any] | None:
        """The allocator's snapshot taken when the trace stopped (None: no trace)."""
        return self._trace.raw_snapshot if self._trace is not None else None


def _forward_code(module: torch.nn.Module) -> str | None:
    """``file:line (Class.forward)`` of a module's forward: the creating line of what it
    allocates when no stacks are recorded (one lookup per module, not per allocation)."""
    with contextlib.suppress(Exception):
        code = type(module).forward.__code__
        return f"{code.co_filename}:{code.co_firstlineno} ({type(module).__name__}.forward)"
    return None


def _named_modules(root: torch.nn.Module) -> Iterable[tuple[str, torch.nn.Module]]:
    """``root.named_modules()`` with a compiled model's own names (no ``_orig_mod.``)."""
    compiled = hasattr(root, "_orig_mod") and type(root).__name__ == "OptimizedModule"
    for name, module in root.named_modules():
        if compiled and name.startswith("_orig_mod."):
            name = name[len("_orig_mod.") :]
        yield name, module


def _contains(root: torch.nn.Module | None, module: torch.nn.Module) -> bool:
    if root is None:
        return False
    return any(m is module for m in root.modules())


# ---- the Session's side: a few calls, so session.py stays small ---------------------------------


def check_detail(detail: str, depth: int) -> None:
    from vramscope.errors import VramscopeError

    if detail not in DETAILS:
        raise VramscopeError(f"unknown detail {detail!r}; use one of {', '.join(DETAILS)}")
    if not isinstance(depth, int) or depth < 0:
        raise VramscopeError(f"depth must be 0 or more, not {depth!r}")


def _device_for(session: Any) -> tuple[str, int | None]:
    requested = session._requested_device
    if requested is not None:
        return requested.type, requested.index
    if session._device_index is not None:
        return "cuda", session._device_index
    return ("cuda", None) if torch.cuda.is_available() else ("cpu", None)


def start_recorder(session: Any) -> Recorder | None:
    """Start recording for a Session: its ``detail`` says modules or lines; with the default
    detail on CUDA, the allocator's trace of the first steps and of the steps that repeat a
    new peak, with no module markers (what the peak is made of); None on the CPU then."""
    device_type, index = _device_for(session)
    options = session._attribution_options
    snapshot = bool(options.get("snapshot"))
    if session.detail == "default" and not snapshot and device_type != "cuda":
        return None
    module_steps, marker_depth = "all", None  # lines and snapshots label every step
    if session.detail == "default" and not snapshot:
        module_steps, marker_depth = "first", -1
    elif session.detail == "modules" and not snapshot:
        module_steps, marker_depth = options.get("module_steps", "auto"), options.get("depth")
    recorder = Recorder(
        device_type,
        index,
        lines=session.detail == "lines",
        line_targets=options.get("lines_of") or (),
        stacks=session.detail == "lines" or snapshot or STACKS_ALWAYS,
        module_steps=module_steps,
        marker_depth=marker_depth,
    )
    try:
        recorder.start()  # undoes itself when it fails
    except Exception as exc:  # the run goes on, tracked as by default; the user is told
        import warnings

        warnings.warn(
            f"vramscope: attribution could not start ({type(exc).__name__}: {exc}); "
            "tracking with the default detail",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    if session._phase is not None:
        recorder.on_phase(session._phase.name)
    return recorder


def stop_recorder(session: Any) -> None:
    recorder: Recorder = session._attribution
    with contextlib.suppress(Exception):
        recorder.add_models(list(session._models))
        recorder.optimizers = list(session._optimizers)
    recorder.stop()
