"""Per-module, per-category and per-line attribution of a real run: the recording side.

The cost is kept to markers. When the session finds a model, every module of it down to
``depth`` is marked and its class gets the thin call wrapper of :mod:`vramscope.tracking.hooks`
(modules deeper, and every other module, keep nn.Module's fast path, and torch.compile never
sees a hook); a marked module's call appends ``["m", module]``/``["x", module]`` to a list; a
hook on the autograd node of its output appends ``["b", module]`` when the gradient reaches
it; the session appends phases and steps. No hook reads the allocator. On CUDA the allocations come from the
allocator's own trace (``torch.cuda.memory._record_memory_history``); at every marker the
allocator's user metadata is set to the marker count (behind a token unique to the
session: the allocator keeps it per thread, and a thread keeps a previous session's), so
each trace entry says exactly which markers came before it (without that API, markers are
placed by time). On the CPU a
dispatch mode records each new storage and a weak reference records its free, into the
same list as the markers. After the run, :meth:`Recorder.event_log` builds one
:class:`~vramscope.tracking.events.EventLog` either way; the analysis is
:mod:`vramscope.report.modules`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vramscope.tracking.categories import block_bytes
from vramscope.tracking.events import (
    ALLOC,
    BACKWARD,
    CENSUS,
    ENTER,
    EXIT,
    FREE,
    PHASE,
    STEP,
    EventLog,
    merge_allocator_trace,
    merge_trace_windows,
    trim_records,
)
from vramscope.tracking.marking import MarkerSchedule

DETAILS = ("default", "modules", "lines")
MAX_TRACE_ENTRIES = int(os.environ.get("VRAMSCOPE_TRACE_ENTRIES", "300000"))
MAX_RECORDS = int(os.environ.get("VRAMSCOPE_MAX_RECORDS", "3000000"))
# a Python stack per CUDA allocation costs most of the `modules` overhead (measured on an
# H200: +21.9% on resnet50-bf16-mixed): recorded only for `lines`, or with VRAMSCOPE_STACKS=1
STACKS_ALWAYS = os.environ.get("VRAMSCOPE_STACKS", "") not in ("", "0")
BACKWARD_HOOK_DEPTH = 8  # modules nested deeper get no backward marker of their own
MAX_GRAD_CENSUSES = 64
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
        # their ancestor at this depth (None: every module is marked)
        self.marker_depth = marker_depth
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
        self._roots: list[int] = []
        self.stack: list[int] = []
        self._handles: list[Any] = []
        self._node_handles: list[Any] = []
        self._backward_hooks: dict[int, Callable[[Any], None]] = {}
        self._censuses: list[list[list[Any]]] = []
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._grad_censuses = 0
        self._state_counts: dict[int, int] = {}
        self._state_census: dict[int, list[list[Any]]] = {}  # id(optimizer) -> its last
        self._optimizer_steps = 0
        self._param_names: dict[int, tuple[int, str]] | None = None
        self._step_starts: list[int] = []
        self._dropped_steps = 0
        self._dropped_windows = 0
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
        # trace per run of marked steps (see events.merge_trace_windows)
        self._windowed = device_type == "cuda" and self.schedule.policy != "all"
        self._history_on = False
        self._window_first = 0  # global marker count when the open window began
        self._windows: list[dict[str, Any]] = []
        self._window_entries = 0
        self._set_meta: Callable[[str], None] | None = None
        # the allocator's user metadata is per thread and outlives the session (the autograd
        # thread keeps the last count its backward hooks set): a token tells ours apart
        self._meta_prefix = f"vramscope:{os.getpid():x}.{id(self):x}.{time.time_ns():x}:"
        self._old_meta: str | None = None
        self._marker_times: list[float] | None = None
        self._probes: list[tuple[int, float]] = []
        self._raw_snapshot: dict[str, Any] | None = None
        self._tracer: Any = None
        self._line_targets = list(line_targets)
        self._event_log: EventLog | None = None
        self._module_table: list[dict[str, Any]] = []
        self.mark: Callable[[list[Any]], None] = self.log.append

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Recorder:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        from vramscope.tracking import hooks

        self.active = True
        try:
            hooks.add_listener(self)
            self._listening = True
            self._handles.append(register_optimizer_step_pre_hook(self._optimizer_pre))
            self._handles.append(register_optimizer_step_post_hook(self._optimizer_post))
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
        for handle in self._handles + self._node_handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self._handles.clear()
        self._node_handles.clear()
        self.stack.clear()

    def _exit_mode(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
        self._refs.clear()  # no free is recorded after the run

    # ---- CUDA source ----------------------------------------------------------------------------
    def maybe_start_cuda(self) -> None:
        """Start the allocator's trace once the process has a CUDA context (never create one)."""
        if self._cuda_on or self.device_type != "cuda" or not self.active:
            return
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return
        if self.device_index is None:
            self.device_index = torch.cuda.current_device()
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

            self._probe()
            self._windowed = False  # markers placed by time need one unbroken trace
        self.mark = mark

    def _start_history(self) -> None:
        """Start the allocator's trace (a new window of it)."""
        kwargs: dict[str, Any] = {
            "enabled": "all",
            "context": "alloc" if self.stacks else None,
            "stacks": "python",
            "max_entries": MAX_TRACE_ENTRIES,
        }
        try:
            torch.cuda.memory._record_memory_history(**kwargs, clear_history=True)
        except TypeError:  # older torch: no clear_history
            torch.cuda.memory._record_memory_history(**kwargs)
        self._history_on = True
        self._window_first = self.base + len(self.log)

    def _end_window(self, last: int | None) -> dict[str, Any]:
        """Take the open window's trace and the blocks allocated now (one snapshot); returns
        the snapshot. The trace keeps running: the caller stops it or not."""
        snapshot = torch.cuda.memory._snapshot()
        index = self.device_index or 0
        traces = snapshot.get("device_traces") or []
        trace = traces[index] if index < len(traces) else []
        active, segments = _allocated_and_segments(snapshot, index)
        window = {
            "first": self._window_first,
            "last": last,
            "trace": trace,
            "active": active,
            "segments": segments,
        }
        self._windows.append(window)
        self._window_entries += len(trace)
        while self._window_entries > MAX_TRACE_ENTRIES and len(self._windows) > 1:
            dropped = self._windows.pop(0)  # the oldest go: the newest steps are kept
            self._window_entries -= len(dropped["trace"])
            self._dropped_windows += 1
        return snapshot

    def _pause_history(self) -> None:
        """A step without markers begins: close the window (its cost is the marked steps')."""
        if not (self._windowed and self._history_on and self._cuda_on):
            return
        started = time.perf_counter()
        try:
            self._end_window(self.base + len(self.log))
        except Exception as exc:  # never the user's run: trace every step from here on
            self._windowed = False
            self.notes.append(
                f"attribution: the allocator trace could not be taken at a step without "
                f"markers ({type(exc).__name__}: {exc}); it ran in every step from there"
            )
            return
        torch.cuda.memory._record_memory_history(enabled=None)
        self._history_on = False
        self.schedule.charge(time.perf_counter() - started)

    def _resume_history(self) -> None:
        if self._windowed and self._cuda_on and not self._history_on:
            try:
                self._start_history()
            except Exception as exc:  # never the user's run: no trace from here on
                self._windowed = False
                self.notes.append(
                    f"attribution: the allocator trace could not be started again "
                    f"({type(exc).__name__}: {exc}); later steps are not in it"
                )

    def _probe(self) -> None:
        """A 512-byte allocation whose trace time ties the trace's clock to ours."""
        with contextlib.suppress(Exception):
            t0 = time.time_ns()
            x = torch.empty(512, dtype=torch.uint8, device=f"cuda:{self.device_index}")
            t1 = time.time_ns()
            self._probes.append((x.data_ptr(), (t0 + t1) / 2000))
            del x

    def _stop_cuda(self) -> None:
        if not self._cuda_on:
            return
        try:
            if self._set_meta is None:
                self._probe()
            torch.cuda.synchronize(self.device_index)
            if self._windows or self._windowed:
                if not self._history_on:  # the end state: an empty last window
                    self._start_history()
                self._raw_snapshot = self._end_window(None)
            else:
                self._raw_snapshot = torch.cuda.memory._snapshot()
        finally:
            self._cuda_on = False
            self._history_on = False
            torch.cuda.memory._record_memory_history(enabled=None)
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
        for name, module in root.named_modules():
            index = self.module_index(module)
            if compiled and name.startswith("_orig_mod."):
                name = name[len("_orig_mod.") :]  # the model's own names
            if index not in self._names:
                self._names[index] = (root_index, name)

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
        if index in self._roots:
            return
        self._new_root(module, index)
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

    def _new_root(self, module: torch.nn.Module, index: int) -> None:
        if index in self._roots:
            return
        self._roots.append(index)
        if index not in self._names:
            self._name_tree(module, index)
        if self.device_type == "cuda":
            self.maybe_start_cuda()
            return
        for t in list(module.parameters()) + list(module.buffers()):
            if t.device.type == "cpu":
                self._adopt(t)

    # ---- phases, steps, optimizer ---------------------------------------------------------------------
    def on_phase(self, name: str) -> None:
        if not self.active:
            return
        if self.device_type == "cuda" and not self._cuda_on:
            self.maybe_start_cuda()
        self.phase = name
        self.mark([PHASE, name])

    def on_step(self, index: int) -> None:
        if not self.active:
            return
        if len(self._node_handles) > 4096:  # hooks of graphs long gone: keep the newest
            del self._node_handles[:-4096]
        self._step_starts.append(len(self.log))
        marking = self.schedule.begin(index)
        if marking != self.marking:
            self._set_marking(marking)
        if self._windowed:
            if marking:
                self._resume_history()
            else:
                self._pause_history()
        self.mark([STEP, index])
        if len(self.log) > MAX_RECORDS:
            self._trim()

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

    def _param_map(self) -> dict[int, tuple[int, str]]:
        """id(parameter) -> (owning module, dotted name), first owner wins (tied weights)."""
        if self._param_names is None:
            names: dict[int, tuple[int, str]] = {}
            for root in self._root_modules():
                for mod_name, module in root.named_modules():
                    owner = self.module_index(module)
                    for p_name, p in module.named_parameters(recurse=False):
                        names.setdefault(id(p), (owner, f"{mod_name}.{p_name}".lstrip(".")))
            self._param_names = names
        return self._param_names

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        self._optimizers.add(optimizer)
        self._optimizer_steps += 1
        if not self.marking and self._grad_censuses:
            return  # a step without markers: the lifetimes say what its gradients are
        if self._grad_censuses >= MAX_GRAD_CENSUSES and self._optimizer_steps % 64:
            return
        self._grad_censuses += 1
        names = self._param_map()
        entries: list[list[Any]] = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None or g.device.type != self.device_type or g.is_sparse:
                    continue
                owner, name = names.get(id(p), (-1, "?"))
                entries.append(
                    [
                        g.untyped_storage().data_ptr(),
                        "gradients",
                        owner,
                        f"{name}.grad",
                        _shape(g),
                        _dtype(g),
                    ]
                )
        self._censuses.append(entries)
        self.mark([CENSUS, len(self._censuses) - 1])

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Census the optimizer's state when it changes (its first step, mostly)."""
        if not self.active:
            return
        count = len(optimizer.state)
        if self._state_counts.get(id(optimizer)) == count:
            return
        self._state_counts[id(optimizer)] = count
        names = self._param_map()
        entries: list[list[Any]] = []
        for p, state in optimizer.state.items():
            owner, name = names.get(id(p), (-1, "?"))
            for key, t in _state_tensors(state):
                if t.device.type != self.device_type or t.layout is not torch.strided:
                    continue
                storage = t.untyped_storage()
                entries.append(
                    [
                        storage.data_ptr(),
                        "optimizer_state",
                        owner,
                        f"{name}.{key}",
                        _shape(t),
                        _dtype(t),
                        block_bytes(storage.nbytes(), self.device_type),
                    ]
                )
        self._state_census[id(optimizer)] = entries
        self._censuses.append(entries)
        self.mark([CENSUS, len(self._censuses) - 1])

    # ---- the end of the run ------------------------------------------------------------------------
    def _root_modules(self) -> list[torch.nn.Module]:
        roots = [self.modules[i]() for i in self._roots]
        alive = [r for r in roots if r is not None]
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

    def add_optimizers(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        for opt in optimizers:
            self._optimizers.add(opt)

    def _final_census(self) -> None:
        """Names and owners of every parameter, buffer, gradient and optimizer state left."""
        device_type = self.device_type
        table: list[dict[str, Any]] = []
        owner_of: dict[int, int] = {}
        named: dict[int, str] = {}
        roots = self._root_modules()
        for root in roots:
            root_index = self.module_index(root)
            if root_index not in self._names:
                self._name_tree(root, root_index)
        claimed: set[int] = set()
        for index, (root_index, name) in self._names.items():
            claimed.add(index)
            named[index] = name
            owner_of[index] = root_index
        for index in range(len(self.modules)):
            if index not in claimed:  # seen in a forward, under no root
                named.setdefault(index, "")
                owner_of.setdefault(index, index)
        by_name = {(owner_of[i], named[i]): i for i in named}
        for index, ref in enumerate(self.modules):
            module = ref()
            name = named.get(index, "")
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
                    "parameters_bytes": 0,
                    "buffers_bytes": 0,
                    "gradients_bytes": 0,
                    "optimizer_state_bytes": 0,
                    "trainable": False,
                    "code": self._codes[index] if index < len(self._codes) else None,
                }
            )

        seen: set[int] = set()
        entries: list[list[Any]] = []

        def add(t: torch.Tensor | None, category: str, owner: int, name: str) -> None:
            if t is None or t.device.type != device_type or t.layout is not torch.strided:
                return
            with contextlib.suppress(Exception):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr == 0 or ptr in seen:
                    return
                seen.add(ptr)
                entries.append([ptr, category, owner, name, _shape(t), _dtype(t)])
                if 0 <= owner < len(table):
                    table[owner][f"{category}_bytes"] += block_bytes(storage.nbytes(), device_type)

        params: list[tuple[torch.nn.Parameter, int, str]] = []
        param_ids: dict[int, tuple[int, str]] = {}
        for root in roots:
            for mod_name, module in root.named_modules():
                owner = self.module_index(module)
                for p_name, p in module.named_parameters(recurse=False):
                    if id(p) in param_ids:
                        continue
                    full = f"{mod_name}.{p_name}".lstrip(".")
                    param_ids[id(p)] = (owner, full)
                    params.append((p, owner, full))
                    if p.requires_grad and 0 <= owner < len(table):
                        table[owner]["trainable"] = True
        for opt in list(self._optimizers):
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in param_ids:
                        param_ids[id(p)] = (-1, "?")
                        params.append((p, -1, "?"))
        for p, owner, name in params:
            add(p, "parameters", owner, name)
        for root in roots:
            for mod_name, module in root.named_modules():
                owner = self.module_index(module)
                for b_name, b in module.named_buffers(recurse=False):
                    add(b, "buffers", owner, f"{mod_name}.{b_name}".lstrip("."))
        grads_now: dict[int, int] = {}
        for p, owner, name in params:
            if p.grad is not None:
                before = len(entries)
                add(p.grad, "gradients", owner, f"{name}.grad")
                if len(entries) > before:
                    grads_now[owner] = 1
        if not grads_now:  # set_to_none: the last optimizer-step census says what they were
            last = next((c for c in reversed(self._censuses) if c and c[0][1] == "gradients"), None)
            for _ptr, _cat, owner, _name, shape, dtype in (e[:6] for e in last or []):
                if 0 <= owner < len(table):
                    numel = 1
                    for d in shape:
                        numel *= d
                    size = numel * getattr(torch, dtype).itemsize
                    table[owner]["gradients_bytes"] += block_bytes(size, device_type)
        alive = {id(opt) for opt in self._optimizers}
        for opt in list(self._optimizers):
            for p, state in opt.state.items():
                owner, name = param_ids.get(id(p), (-1, "?"))
                for key, value in _state_tensors(state):
                    add(value, "optimizer_state", owner, f"{name}.{key}")
        for key, state_entries in self._state_census.items():
            if key in alive:
                continue
            for entry in state_entries:  # an optimizer gone before the end: its last census
                owner = entry[2]
                if 0 <= owner < len(table):
                    table[owner]["optimizer_state_bytes"] += entry[6]
        self._censuses.append(entries)
        self.mark([CENSUS, len(self._censuses) - 1])
        self._module_table = table

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
            self._merge_cuda(log)
        if self._dropped_steps:
            log.notes.append(
                f"the run was long: the attribution keeps its last steps; "
                f"{self._dropped_steps} earlier steps were dropped"
            )
        self._event_log = log
        return log

    def _merge_cuda(self, log: EventLog) -> None:
        snapshot = self._raw_snapshot
        if snapshot is None:
            log.records = list(self.log)
            log.notes.append(
                "no allocator trace: CUDA was never initialized while tracking, "
                "so allocations could not be attributed"
            )
            return
        if self._windows:
            self._merge_windows(log)
            return
        index = self.device_index or 0
        traces = snapshot.get("device_traces") or []
        trace = traces[index] if index < len(traces) else []
        active, segments = _allocated_and_segments(snapshot, index)
        times = self._marker_times_on_trace(trace)
        records, baseline, frames, info = merge_allocator_trace(
            trace,
            active,
            self.log,
            marker_base=self.base,
            marker_times_us=times,
            library_dirs=_LIBRARY_DIRS,
            segment_spans=segments,
            metadata_prefix=self._meta_prefix if self._set_meta is not None else "",
        )
        log.records, log.baseline, log.frames = records, baseline, frames
        log.meta["block_sizes"] = "allocator"
        log.meta["segments"] = segments
        log.meta["stacks"] = self.stacks
        info["max_entries"] = MAX_TRACE_ENTRIES
        info["overflowed"] = len(trace) >= MAX_TRACE_ENTRIES
        log.meta["trace"] = info
        if info["overflowed"]:
            log.notes.append(
                f"the allocator trace is bounded to {MAX_TRACE_ENTRIES} events and filled up: "
                "allocations before its window count as live before it; raise "
                "VRAMSCOPE_TRACE_ENTRIES to see more"
            )
        if info["join"] != "metadata":
            log.notes.append(
                "this torch has no allocator user metadata: markers were placed on the trace "
                "by time, which can misplace allocations made within a microsecond of a marker"
            )

    def _merge_windows(self, log: EventLog) -> None:
        records, baseline, frames, info = merge_trace_windows(
            self._windows,
            self.log,
            marker_base=self.base,
            library_dirs=_LIBRARY_DIRS,
            metadata_prefix=self._meta_prefix,
        )
        log.records, log.baseline, log.frames = records, baseline, frames
        log.meta["block_sizes"] = "allocator"
        log.meta["segments"] = self._windows[-1]["segments"]
        log.meta["stacks"] = self.stacks
        info["max_entries"] = MAX_TRACE_ENTRIES
        info["dropped_windows"] = self._dropped_windows
        info["overflowed"] = any(len(w["trace"]) >= MAX_TRACE_ENTRIES for w in self._windows)
        log.meta["trace"] = info
        if self._dropped_windows:
            log.notes.append(
                f"the allocator trace is bounded to {MAX_TRACE_ENTRIES} events: the "
                f"{self._dropped_windows} oldest windows of marked steps were dropped; raise "
                "VRAMSCOPE_TRACE_ENTRIES to keep more"
            )
        elif info["overflowed"]:
            log.notes.append(
                f"the allocator trace is bounded to {MAX_TRACE_ENTRIES} events and filled up: "
                "allocations before its window count as live before it; raise "
                "VRAMSCOPE_TRACE_ENTRIES to see more"
            )

    def _marker_times_on_trace(self, trace: list[dict[str, Any]]) -> list[float] | None:
        """Our marker times mapped onto the trace's clock by the two probe allocations."""
        if self._marker_times is None:
            return None
        points = []
        for addr, ours in self._probes:
            entry = next(
                (
                    e
                    for e in trace
                    if e.get("action") == "alloc" and e.get("addr") == addr and "time_us" in e
                ),
                None,
            )
            if entry is not None:
                points.append((ours, float(entry["time_us"])))
        if not points:
            return list(self._marker_times)
        if len(points) == 1 or points[-1][0] == points[0][0]:
            offset = points[0][1] - points[0][0]
            return [t + offset for t in self._marker_times]
        (a0, b0), (a1, b1) = points[0], points[-1]
        scale = (b1 - b0) / (a1 - a0)
        return [b0 + (t - a0) * scale for t in self._marker_times]

    def raw_snapshot(self) -> dict[str, Any] | None:
        return self._raw_snapshot


def _allocated_and_segments(
    snapshot: dict[str, Any], index: int
) -> tuple[list[dict[str, int]], list[list[int]]]:
    """One device's allocated blocks (``{"address", "size"}``) and segments (``[addr, size]``)
    in an allocator snapshot."""
    own = [seg for seg in snapshot.get("segments", []) if seg.get("device", index) == index]
    active = [
        {"address": b.get("address", 0), "size": b.get("size", 0)}
        for seg in own
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
    ]
    segments = [[int(seg.get("address", 0)), int(seg.get("total_size", 0))] for seg in own]
    return active, segments


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


def _state_tensors(state: Any, prefix: str = "") -> Iterable[tuple[str, torch.Tensor]]:
    if isinstance(state, torch.Tensor):
        yield prefix or "state", state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from _state_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from _state_tensors(value, f"{prefix}.{i}" if prefix else str(i))


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
    """Start recording for a Session (its ``detail`` says modules or lines)."""
    device_type, index = _device_for(session)
    options = session._attribution_options
    recorder = Recorder(
        device_type,
        index,
        lines=session.detail == "lines",
        line_targets=options.get("lines_of") or (),
        stacks=session.detail == "lines" or bool(options.get("snapshot")) or STACKS_ALWAYS,
        # lines and snapshots label every step; modules mark the steps the schedule picks
        module_steps=(
            options.get("module_steps", "auto")
            if session.detail == "modules" and not options.get("snapshot")
            else "all"
        ),
        marker_depth=(
            options.get("depth")
            if session.detail == "modules" and not options.get("snapshot")
            else None
        ),
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
        recorder.add_optimizers(list(session._optimizers))
    recorder.stop()


def attach_attribution(session: Any, report: Any) -> None:
    """Analyse what was recorded into ``report``; write the snapshot when one was asked for."""
    from vramscope.report.modules import analyze, apply_to_report

    recorder: Recorder = session._attribution
    options = session._attribution_options
    try:
        log = recorder.event_log()
        analysis = analyze(log, depth=options["depth"], labels=bool(options.get("snapshot")))
        apply_to_report(report, analysis, session.detail)
        if options.get("snapshot"):
            path = write_attribution_snapshot(recorder, log, analysis["block_labels"], options)
            report.extra["snapshot"] = str(path)
    except Exception as exc:  # attribution must never cost the user the report
        report.extra.setdefault("attribution_notes", []).append(
            f"attribution failed: {type(exc).__name__}: {exc}"
        )


def write_attribution_snapshot(
    recorder: Recorder, log: EventLog, labels: dict[int, Any], options: dict[str, Any]
) -> Any:
    from vramscope.tracking import snapshot as snapshot_writer

    raw = recorder.raw_snapshot()
    if raw is not None:
        data = snapshot_writer.annotate_cuda_snapshot(raw, recorder.device_index or 0, labels)
    else:
        data = snapshot_writer.cpu_snapshot(log, labels)
    return snapshot_writer.write_snapshot(options["snapshot"], data)
