"""What a trace records: each CUDA storage of a fake tensor as an allocation, its free, and
what is known of each block (step, phase, module, kind); the result, :class:`Trace`."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from vramscope.errors import VramscopeError
from vramscope.estimate.profiles import GpuProfile


class TraceError(VramscopeError):
    """The trace could not go on (an op fake tensors cannot run, the user's code raised)."""


@dataclass
class BlockMeta:
    """One allocation of the trace (a CUDA storage or a kernel's internal buffer)."""

    size: int
    step: int  # -1: build, -2: setup (after build, before the first step)
    phase: str
    micro: int
    kind: str  # parameter, buffer, optimizer_state, gradient, activation, temporary, workspace, data, other
    module: str | None
    op: str
    freed_phase: str | None = None
    freed_step: int | None = None
    owner: str | None = None  # the module whose parameter, buffer, gradient or state it is


@dataclass
class Trace:
    """The ordered allocation events of the traced steps, and what is known of each block."""

    events: list[tuple[Any, ...]]  # ("alloc", id, size, stream), ("free", id), ("empty_cache",)
    blocks: dict[int, BlockMeta]
    marks: list[tuple[int, int, str]]  # (event index, step, phase) where a phase begins
    step_starts: list[int]  # event index where each traced step begins
    build_end: int  # event index after the synthetic allocations of the built state
    setup_end: int  # event index after StepRunner set-up (dtype casts of the model)
    training: bool
    precision: str
    accumulate: int
    parameters: int
    parameter_bytes: int
    modules: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    data_dependent: list[str] = field(default_factory=list)
    # values the trace could not know and assumed (scalars.Assumption), in the variant it ran
    assumptions: list[Any] = field(default_factory=list)
    variant: str = "heavy"
    # random integer draws of the steps whose values made a size ("randint at file:line"),
    # and whether they were read as the top of their range
    sized_by_draws: list[str] = field(default_factory=list)
    draws_at_top: bool = False
    sdpa: dict[str, int] = field(default_factory=dict)
    workspaces: dict[str, int] = field(default_factory=dict)
    libraries: set[str] = field(default_factory=set)
    backward_ran: bool = False
    seconds: float = 0.0
    build_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    module_of_block: dict[int, str] = field(default_factory=dict)
    # block -> (plan key, smaller sizes) a kernel falls back to when its first size runs out
    # of memory (0: a variant without the buffer), tried in order: cuDNN's workspaces. The
    # variant that ran is kept for later calls with the same key (torch caches cuDNN plans).
    fallbacks: dict[int, tuple[Any, tuple[int, ...]]] = field(default_factory=dict)
    # device memory outside the caching allocator for collectives (NCCL's communicators)
    communicator_bytes: int = 0


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Ops on a fake tensor's metadata run the meta kernels, without the fake mode: a fake
    tensor's backend keys are its fake device's (a sparse CUDA tensor's ``_nnz`` has no kernel
    in a CPU build of torch)."""
    with torch._C._DisableTorchDispatch(), torch._C._PreserveDispatchKeyGuard():
        torch._C._set_meta_in_tls_dispatch_include(True)
        yield


def sparse_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors a sparse tensor is made of (each its own allocation on a GPU): COO's
    indices and values; a compressed layout's two index tensors and values."""
    if tensor.layout == torch.sparse_coo:
        return (tensor._indices(), tensor._values())
    if tensor.layout in (torch.sparse_csr, torch.sparse_bsr):
        return (tensor.crow_indices(), tensor.col_indices(), tensor.values())
    return (tensor.ccol_indices(), tensor.row_indices(), tensor.values())


class Recorder:
    """Turns storages of CUDA fake tensors into allocation events (thread-safe enough: the
    autograd device thread and the main thread never run ops at the same time)."""

    def __init__(self, profile: GpuProfile) -> None:
        self.profile = profile
        self.events: list[tuple[Any, ...]] = []
        self.blocks: dict[int, BlockMeta] = {}
        self.marks: list[tuple[int, int, str]] = []
        self.live: dict[int, tuple[int | None, Any, int]] = {}  # storage key -> (id, ref, size)
        self.pending: dict[int, tuple[Any, int, int]] = {}  # built before recording starts
        self.recording = False
        self.next_id = 1
        self.step = -1
        self.phase = "build"
        self.micro = 0
        self.allocated_bytes = 0
        self.peak_allocated_bytes = 0
        self.module_stack: list[str] = []
        self.in_backward = 0
        self.threads_with_workspace: dict[tuple[str, str], int] = {}
        self.sdpa: dict[str, int] = {}
        self.libraries: set[str] = set()
        self.workspaces: dict[str, int] = {}
        self.fallbacks: dict[int, tuple[Any, tuple[int, ...]]] = {}
        # (storage key, block, event index, operand blocks) of a sum that may be in place
        self.accumulating: tuple[int, int, int, list[int]] | None = None
        self.data_dependent: dict[str, str] = {}
        self.assumptions: dict[int, Any] = {}  # key -> scalars.Assumption
        self.notes: list[str] = []
        self.order = 0
        self.stream = 0  # the current CUDA stream (cuda_device._Streams sets it)
        # > 0 while ops run that no GPU runs (DTensor's sharding propagation computes output
        # shapes on fake tensors of the global shape): their outputs are no allocations
        self.paused = 0
        self.lock = threading.RLock()
        self.sparse_seen = False  # a sparse tensor was made: ops check for sparse inputs
        # set once the trace is made of what was recorded: a fake tensor the garbage
        # collector finds later (in a cycle) is no event of the trace, whenever that is
        self.closed = False

    # ---- phases ------------------------------------------------------------------------
    def set_phase(self, phase: str, step: int | None = None) -> None:
        with self.lock:
            if step is not None:
                self.step = step
            if phase != self.phase or step is not None:
                self.phase = phase
                self.marks.append((len(self.events), self.step, phase))

    # ---- allocations -------------------------------------------------------------------
    def _alloc(self, size: int, kind: str, op: str) -> int:
        bid = self.next_id
        self.next_id += 1
        self.accumulating = None  # another allocation came first: the sum keeps its own block
        module = self.module_stack[-1] if self.module_stack else None
        self.blocks[bid] = BlockMeta(size, self.step, self.phase, self.micro, kind, module, op)
        self.events.append(("alloc", bid, size, self.stream))
        self.allocated_bytes += size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        return bid

    def _free(self, bid: int) -> None:
        meta = self.blocks[bid]
        meta.freed_phase = self.phase
        meta.freed_step = self.step
        self.events.append(("free", bid))
        self.allocated_bytes -= meta.size

    def transient(
        self,
        size: int,
        kind: str,
        op: str,
        fallbacks: tuple[Any, tuple[int, ...]] | None = None,
        before: Any = None,
    ) -> None:
        """A kernel's internal buffer: allocated and freed inside the op. ``fallbacks``: a
        key of the kernel's plan and the smaller sizes it makes do with when ``size`` runs out
        of memory (0: none). ``before``: an output the kernel allocates after this buffer."""
        if not self.recording or size <= 0 or self.paused:
            return
        with self.lock:
            bid = self._alloc(size, kind, op)
            if fallbacks:
                self.fallbacks[bid] = fallbacks
            self._free(bid)
            if before is not None:
                self._move_before(before)

    def kernel_sequence(self, plan: list[tuple[Any, ...]], kind: str, op: str) -> None:
        """A kernel's outputs and internal buffers in the order it allocates and frees them.
        ``plan``: ``("out", tensor)`` where that output's allocation (recorded already, among
        the op's latest events) goes, ``("alloc", name, size)`` and ``("free", name)`` for a
        buffer of the kernel (none when ``size`` is 0)."""
        if not self.recording or self.paused:
            return
        with self.lock:
            wanted = []
            for item in plan:
                if item[0] == "out" and item[1] is not None:
                    entry = self.live.get(item[1].untyped_storage()._cdata)
                    wanted.append(entry[0] if entry is not None else None)
            taken: dict[int, tuple[Any, ...]] = {}
            tail = len(self.events)
            for i in range(tail - 1, max(-1, tail - 4 * len(plan) - 8), -1):
                event = self.events[i]
                if event[0] == "alloc" and event[1] in wanted and event[1] not in taken:
                    taken[event[1]] = event
                    del self.events[i]
            bids: dict[str, int] = {}
            outputs = iter(wanted)
            for item in plan:
                if item[0] == "out":
                    if item[1] is None:
                        continue
                    event = taken.get(next(outputs))
                    if event is not None:
                        self.events.append(event)
                elif item[0] == "alloc":
                    if item[2] > 0:
                        bids[item[1]] = self._alloc(item[2], kind, op)
                elif item[1] in bids:
                    self._free(bids.pop(item[1]))

    def _move_before(self, tensor: Any, count: int = 2) -> None:
        """Move the last ``count`` events (transients' allocations and frees) before the
        allocation of ``tensor``'s storage, if that is among the op's latest events."""
        entry = self.live.get(tensor.untyped_storage()._cdata)
        if entry is None or entry[0] is None:
            return
        moved = self.events[-count:]
        last = len(self.events) - count - 1
        for i in range(last, max(-1, last - 7), -1):
            if self.events[i][:2] == ("alloc", entry[0]):
                del self.events[-count:]
                self.events[i:i] = moved
                return

    def persistent(self, size: int, kind: str, op: str) -> int | None:
        """A buffer a library keeps for the rest of the run (cuBLAS workspaces), or until
        :meth:`release` (a collective's copy of its input); its block (None: not recorded)."""
        if not self.recording or size <= 0 or self.paused:
            return None
        with self.lock:
            return self._alloc(size, kind, op)

    def release(self, bid: int) -> None:
        """Free a buffer :meth:`persistent` recorded."""
        with self.lock:
            self._free(bid)

    def empty_cache(self, *_: Any, **__: Any) -> None:
        if self.recording:
            with self.lock:
                self.events.append(("empty_cache",))

    def see(self, tensor: torch.Tensor, op: str) -> None:
        """Record the storage of ``tensor`` if it is new (called for every op output)."""
        if self.paused or not isinstance(tensor, FakeTensor) or tensor.fake_device.type != "cuda":
            return
        if tensor.layout != torch.strided:
            # a sparse tensor is its index and value tensors: one allocation each
            self.sparse_seen = True
            for part in sparse_parts(tensor):
                self.see(part, op)
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        size = storage.nbytes()
        with self.lock:
            entry = self.live.get(key)
            if entry is not None:
                if entry[2] != size:
                    self._resized(key, entry, size, op)
                return
            ref = weakref.ref(storage, functools.partial(self._on_free, key))
            if self.recording:
                bid = self._alloc(size, "data" if self.phase == "data" else "temporary", op)
            else:
                bid = None
                self.pending[key] = (ref, size, self.order)
                self.order += 1
            self.live[key] = (bid, ref, size)

    def _resized(self, key: int, entry: tuple[int | None, Any, int], size: int, op: str) -> None:
        """A storage resized in place (``resize_``, ``out=``): the allocator frees its block
        and hands out a new one; a storage resized to 0 holds none (FSDP frees unsharded
        parameters so, and resizes them back for the next all-gather)."""
        bid, ref, _ = entry
        if bid is not None:
            self._free(bid)
            bid = None
        if self.recording and size > 0:
            bid = self._alloc(size, "temporary", op)
        self.live[key] = (bid, ref, size)

    def storage_resized(self, storage: Any) -> None:
        """``UntypedStorage.resize_`` was called on ``storage`` (no op reaches the fake
        mode for it): its block follows the new size."""
        with self.lock:
            key = storage._cdata
            entry = self.live.get(key)
            if entry is not None and key not in self.pending and entry[2] != storage.nbytes():
                self._resized(key, entry, storage.nbytes(), "resize_")

    def _on_free(self, key: int, _ref: Any) -> None:
        if self.closed:
            return
        with self.lock:
            entry = self.live.pop(key, None)
            self.pending.pop(key, None)
            if entry is not None and entry[0] is not None:
                if self.accumulating is not None and self._accumulate_in_place(entry[0]):
                    return
                self._free(entry[0])

    def gradient_sum(self, out: torch.Tensor, args: tuple[Any, ...]) -> None:
        """``out = a + b`` in backward: maybe autograd summing two gradients of one input.
        On the GPU its input buffer adds in place into a gradient that nothing else holds
        (``InputBuffer::accumulate``); under a dispatch mode (fake tensors) no tensor
        qualifies, so the sum got a new block. If the first operand (the gradient already
        in the buffer: torch adds only into that one) is dense, not a view (a view keeps its
        base alive), and freed before anything else is allocated, the sum takes its block
        instead (``_accumulate_in_place``). Recorded on an H200: the example
        CNN's residual sums ran in place; BERT's, whose gradients are views of matmul
        outputs, did not."""
        self.accumulating = None
        if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
            return
        a, b = args[0], args[1]
        if not out.layout == a.layout == b.layout == torch.strided:
            return  # sparse gradients concatenate into new indices and values
        if a.shape != out.shape or b.shape != out.shape or not a.dtype == b.dtype == out.dtype:
            return
        entry = self.live.get(out.untyped_storage()._cdata)
        if entry is None or entry[0] is None or not self.events:
            return
        if self.events[-1][:2] != ("alloc", entry[0]):
            return
        inputs = []
        # only the buffer's own tensor (the first operand) is reused, and only when it is
        # dense and not a view (a view keeps its base, so the buffer is not its last holder)
        if not a._is_view() and _dense(a):
            e = self.live.get(a.untyped_storage()._cdata)
            if e is not None and e[0] is not None and e[2] == entry[2]:
                inputs.append(e[0])
        if inputs:
            self.accumulating = (
                out.untyped_storage()._cdata,
                entry[0],
                len(self.events) - 1,
                inputs,
            )

    def _accumulate_in_place(self, freed: int) -> bool:
        assert self.accumulating is not None
        key, bid, index, inputs = self.accumulating
        if freed not in inputs or self.events[index][:2] != ("alloc", bid):
            return False
        self.accumulating = None
        entry = self.live.get(key)
        if entry is None or entry[0] != bid:
            return False
        self.events[index] = ("in_place", bid, freed)  # replays skip it
        self.allocated_bytes -= self.blocks.pop(bid).size
        self.live[key] = (freed, entry[1], entry[2])
        return True

    def adopt_built_state(self, ordered_storages: list[Any]) -> None:
        """Start recording: allocate what the build left alive, in the order a real run
        would have (the model's ``.to(device)`` order first, then everything else)."""
        with self.lock:
            self.recording = True
            self.set_phase("build", -1)
            seen: set[int] = set()
            for storage, kind in ordered_storages:
                key = storage._cdata
                entry = self.live.get(key)
                if entry is None or key in seen or entry[0] is not None:
                    continue
                seen.add(key)
                bid = self._alloc(entry[2], kind, "build")
                self.live[key] = (bid, entry[1], entry[2])
                self.pending.pop(key, None)
            for key, (_ref, size, _) in sorted(self.pending.items(), key=lambda kv: kv[1][2]):
                entry = self.live.get(key)
                if entry is None or entry[0] is not None:
                    continue
                bid = self._alloc(size, "other", "build")
                self.live[key] = (bid, entry[1], size)
            self.pending.clear()

    def forget(self, tensor: torch.Tensor) -> None:
        """A tensor the real kernel makes on the host (attention RNG seeds without dropout):
        take back its allocation."""
        if not isinstance(tensor, FakeTensor) or tensor.fake_device.type != "cuda":
            return
        storage = tensor.untyped_storage()
        with self.lock:
            entry = self.live.get(storage._cdata)
            if entry is None or entry[0] is None:
                return
            bid = entry[0]
            for i in range(len(self.events) - 1, max(-1, len(self.events) - 64), -1):
                event = self.events[i]
                if event[0] == "alloc" and event[1] == bid:
                    del self.events[i]
                    self.allocated_bytes -= self.blocks.pop(bid).size
                    self.live[storage._cdata] = (None, entry[1], entry[2])
                    return

    def retag(self, storage: Any, kind: str, owner: str | None = None) -> None:
        entry = self.live.get(storage._cdata)
        if entry is not None and entry[0] is not None:
            meta = self.blocks[entry[0]]
            meta.kind = kind
            if owner is not None:
                meta.owner = owner


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage span without gaps or overlaps in some
    order of its dimensions (what ``InputBuffer`` asks of a gradient it adds into)."""
    expected = 1
    for stride, size in sorted(
        (st, s) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True
