"""Trace real steps of a workload with fake tensors on an emulated CUDA device.

The user's build function and the standard step (``workload.StepRunner``) run unchanged,
under a :class:`torch._subclasses.fake_tensor.FakeTensorMode`: every tensor is a shape, a
dtype and a device with no data, so nothing proportional to the model is allocated. The
device passed to ``build`` is ``cuda:0`` even when only the CPU build of torch is installed:

* ATen is shown a CUDA device: a fake device guard (torch's own ``FakeGuardImpl<CUDA>``) is
  registered, and the answers of the CUDA hooks object that the autograd engine asks
  (``isBuilt``, ``hasPrimaryContext``, ...) are switched for the duration of the trace.
  Both are found by symbol in torch's shared libraries; everything is put back afterwards.
* ``torch.cuda`` answers as a device of the chosen profile would (``is_available``,
  ``get_device_capability``, ``memory_allocated`` from the trace, ...).

So CUDA autocast runs its real op lists and cast cache, GradScaler runs its real kernels,
activation checkpointing saves and restores CUDA RNG state, and autograd runs backward on
its device thread as on a GPU. Every storage a CUDA tensor gets is one allocation; its
Python weak reference says when it is freed. The result is the ordered list of allocations
and frees, with the phase, step and module of each, that :mod:`vramscope.estimate.allocator`
replays. CUDA-specific memory the fake kernels do not show is added by
:mod:`vramscope.estimate.kernels`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import mmap
import os
import struct
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    _DISPATCH_META_HANDLERS,
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._mode_utils import no_dispatch
from torch.utils.weak import WeakIdKeyDictionary

from vramscope.errors import VramscopeError, WorkloadError
from vramscope.estimate import kernels
from vramscope.estimate.profiles import GpuProfile
from vramscope.tracking.categories import tensors_in as _tensors_in
from vramscope.workload import StepRunner, Workload, WorkloadSpec

aten = torch.ops.aten
_ADD = aten.add.Tensor
CUDA = torch.device("cuda", 0)
SHADOW_LIMIT = 4096  # elements: small tensors also get real values, for .item() and .tolist()


class TraceError(VramscopeError):
    """The trace could not go on (an op fake tensors cannot run, the user's code raised)."""


# ============================================================================================
# ATen sees a CUDA device


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vramscope"


def elf_symbols(path: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """``{name: (value, size)}`` from the ELF symbol table of ``path`` (local symbols too).

    Cached per library file (path, size, mtime) under ``~/.cache/vramscope``; a miss reads
    the string and symbol tables through mmap (a second or two for libtorch_cpu.so).
    """
    stat = os.stat(path)
    key = hashlib.sha1(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cache_file = _cache_dir() / f"symbols-{key}.json"
    cached: dict[str, list[int]] = {}
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(cache_file.read_text())
    wanted = [n for n in names if n not in cached]
    if wanted:
        found = _read_elf_symbols(path, wanted)
        for name in wanted:
            cached[name] = list(found[name]) if name in found else []
        with contextlib.suppress(OSError):
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps(cached))
    return {n: (cached[n][0], cached[n][1]) for n in names if cached.get(n)}


def _read_elf_symbols(path: str, names: list[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            return out  # only 64-bit little-endian ELF
        (shoff,) = struct.unpack_from("<Q", m, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)
        ]
        for sec in sections:
            if sec[1] not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
                continue
            strtab = sections[sec[6]]
            s0, s1 = strtab[4], strtab[4] + strtab[5]
            offsets: dict[int, str] = {}
            for name in names:
                if name in out:
                    continue
                pos = m.find(b"\0" + name.encode() + b"\0", s0, s1)
                if pos >= 0:
                    offsets[pos + 1 - s0] = name
            if not offsets:
                continue
            count = sec[5] // 24
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = torch.frombuffer(m, dtype=torch.int32, count=count * 6, offset=sec[4])
            st_name = table.view(count, 6)[:, 0].clone()
            del table
            for offset, name in offsets.items():
                hits = (st_name == offset).nonzero().flatten().tolist()
                for i in hits:
                    value, size = struct.unpack_from("<QQ", m, sec[4] + i * 24 + 8)
                    if value:
                        out[name] = (value, size)
                        break
    return out


_REGISTER_GUARD = (
    "_ZN3c104impl19registerDeviceGuardENS_10DeviceTypeEPKNS0_24DeviceGuardImplInterfaceE"
)
_REGISTRY = "_ZN3c104impl26device_guard_impl_registryE"
_FAKE_GUARD_VTABLE = "_ZTVN3c104impl13FakeGuardImplILNS_10DeviceTypeE1EEE"
_GET_CUDA_HOOKS = "_ZN2at6detail12getCUDAHooksEv"
_HOOKS_VTABLE = "_ZTVN2at18CUDAHooksInterfaceE"
# hooks the autograd engine and ATen ask; their answers while tracing
_HOOKS = {
    "isBuilt": ("_ZNK2at25AcceleratorHooksInterface7isBuiltEv", "bool", True),
    "isAvailable": ("_ZNK2at25AcceleratorHooksInterface11isAvailableEv", "bool", True),
    "hasPrimaryContext": ("_ZNK2at18CUDAHooksInterface17hasPrimaryContextEa", "bool_i8", True),
    "deviceCount": ("_ZNK2at25AcceleratorHooksInterface11deviceCountEv", "i8", 1),
    "getCurrentDevice": ("_ZNK2at25AcceleratorHooksInterface16getCurrentDeviceEv", "i8", 0),
    "hasCUDA": ("_ZNK2at18CUDAHooksInterface7hasCUDAEv", "bool", True),
    "getNumGPUs": ("_ZNK2at18CUDAHooksInterface10getNumGPUsEv", "i8", 1),
    "current_device": ("_ZNK2at18CUDAHooksInterface14current_deviceEv", "i64", 0),
}
_CALLBACK_TYPES = {
    "bool": ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p),
    "bool_i8": ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int8),
    "i8": ctypes.CFUNCTYPE(ctypes.c_int8, ctypes.c_void_p),
    "i64": ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p),
}


class NativeCudaEmulation:
    """Make ATen and the autograd engine accept CUDA tensors on a machine without a GPU.

    One instance per process (module-level ``_NATIVE``); ``enter``/``exit`` nest.
    """

    def __init__(self) -> None:
        self._depth = 0
        self._lock = threading.Lock()
        self._ready = False
        self._error: str | None = None
        self._keep: list[Any] = []

    def _prepare(self) -> None:
        libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
        c10_path = _find_lib(libdir, "libc10")
        cpu_path = _find_lib(libdir, "libtorch_cpu")
        if c10_path is None or cpu_path is None:
            raise TraceError("cannot find libc10 / libtorch_cpu next to torch")
        c10_syms = elf_symbols(c10_path, [_REGISTRY, _FAKE_GUARD_VTABLE])
        hook_syms = elf_symbols(
            cpu_path, [_GET_CUDA_HOOKS, _HOOKS_VTABLE, *(v[0] for v in _HOOKS.values())]
        )
        missing = [n for n in (_REGISTRY, _FAKE_GUARD_VTABLE) if n not in c10_syms] + [
            n for n in (_GET_CUDA_HOOKS, _HOOKS_VTABLE) if n not in hook_syms
        ]
        if missing:
            raise TraceError(
                f"this torch build ({torch.__version__}) lacks the symbols the CUDA emulation "
                f"needs ({missing[0]}); estimates need a torch wheel from pytorch.org or PyPI"
            )
        c10 = ctypes.CDLL(c10_path)
        cpu = ctypes.CDLL(cpu_path)
        registry = ctypes.cast(getattr(c10, _REGISTRY), ctypes.c_void_p).value
        c10_base = registry - c10_syms[_REGISTRY][0]
        self._registry_slot = ctypes.c_void_p.from_address(registry + 8 * 1)  # DeviceType::CUDA
        self._register = getattr(c10, _REGISTER_GUARD)
        self._register.argtypes = [ctypes.c_int8, ctypes.c_void_p]
        self._register.restype = None
        # An object of FakeGuardImpl<CUDA> is one vtable pointer (its state is thread-local).
        self._guard = (ctypes.c_void_p * 2)(c10_base + c10_syms[_FAKE_GUARD_VTABLE][0] + 16, 0)
        get_hooks = getattr(cpu, _GET_CUDA_HOOKS)
        get_hooks.restype = ctypes.c_void_p
        cpu_base = ctypes.cast(get_hooks, ctypes.c_void_p).value - hook_syms[_GET_CUDA_HOOKS][0]
        hooks = get_hooks()
        self._vptr = ctypes.c_void_p.from_address(hooks)
        iface_addr, iface_size = hook_syms[_HOOKS_VTABLE]
        iface = (ctypes.c_void_p * (iface_size // 8)).from_address(cpu_base + iface_addr)
        slots: dict[str, int] = {}
        for key, (symbol, _, _) in _HOOKS.items():
            if symbol in hook_syms:
                address = cpu_base + hook_syms[symbol][0]
                for i, entry in enumerate(iface):
                    if entry == address:
                        slots[key] = i
        for needed in ("isBuilt", "hasPrimaryContext"):
            if needed not in slots:
                raise TraceError(
                    f"cannot find CUDAHooks::{needed} in torch {torch.__version__}'s tables; "
                    "the CUDA emulation does not support this torch version"
                )
        n = len(iface) + 16  # the real object's class may add entries; copy a margin
        self._original_vptr = self._vptr.value
        current = (ctypes.c_void_p * n).from_address(self._original_vptr - 16)
        table = (ctypes.c_void_p * n)(*current)
        callbacks = []
        for key, index in slots.items():
            _, kind, value = _HOOKS[key]
            cb = _CALLBACK_TYPES[kind]((lambda v: lambda *a: v)(value))
            callbacks.append(cb)
            table[index] = ctypes.cast(cb, ctypes.c_void_p).value
        self._table = table
        self._keep = [self._guard, table, callbacks, c10, cpu]
        self._ready = True

    def enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                if not self._ready:
                    if self._error:
                        raise TraceError(self._error)
                    try:
                        self._prepare()
                    except TraceError as exc:
                        self._error = str(exc)
                        raise
                    except (OSError, AttributeError, ValueError) as exc:
                        self._error = f"cannot set up the CUDA emulation: {exc}"
                        raise TraceError(self._error) from None
                self._saved_guard = self._registry_slot.value
                if not torch.cuda.is_available():
                    self._register(1, ctypes.addressof(self._guard))
                self._vptr.value = ctypes.addressof(self._table) + 16
            self._depth += 1

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._vptr.value = self._original_vptr
                self._register(1, self._saved_guard or None)


def _find_lib(libdir: str, stem: str) -> str | None:
    for name in (f"{stem}.so", f"{stem}.dylib"):
        path = os.path.join(libdir, name)
        if os.path.exists(path):
            return path
    return None


_NATIVE = NativeCudaEmulation()


# ============================================================================================
# torch.cuda answers as the profiled GPU


class _CudaModulePatches:
    """Replace functions of ``torch.cuda`` that would touch a real device."""

    def __init__(self, profile: GpuProfile, recorder: Recorder) -> None:
        self.profile = profile
        self.recorder = recorder
        self._saved: list[tuple[Any, str, Any]] = []

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name, _MISSING)))
        setattr(owner, name, value)

    def __enter__(self) -> _CudaModulePatches:
        p, rec = self.profile, self.recorder
        cuda = torch.cuda
        props = SimpleNamespace(
            name=p.display_name,
            total_memory=p.total_bytes,
            major=p.capability[0],
            minor=p.capability[1],
            multi_processor_count=132,
            is_integrated=False,
            is_multi_gpu_board=False,
            uuid="GPU-vramscope-estimate",
            L2_cache_size=50 * 2**20,
            warp_size=32,
            gcnArchName="",
        )

        def rng_state(*_: Any, **__: Any) -> torch.Tensor:
            with no_dispatch():
                return torch.zeros(16, dtype=torch.uint8)

        class _Stream:
            def __init__(self, *_: Any, **__: Any) -> None:
                self.device = CUDA
                self.cuda_stream = 0
                self.stream_id = 0
                self.device_index = 0
                self.device_type = 1

            def __enter__(self) -> _Stream:
                return self

            def __exit__(self, *_: Any) -> None:
                return None

            def synchronize(self) -> None:
                return None

            def wait_stream(self, *_: Any) -> None:
                return None

            def wait_event(self, *_: Any) -> None:
                return None

            def record_event(self, *_: Any) -> Any:
                return SimpleNamespace(synchronize=lambda: None, wait=lambda *a: None)

            def query(self) -> bool:
                return True

            def __eq__(self, other: object) -> bool:
                return isinstance(other, _Stream)

            def __hash__(self) -> int:
                return 0

        default_stream = _Stream()
        values: dict[str, Any] = {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda *a, **k: None,
            "_lazy_init": lambda: None,
            "init": lambda: None,
            "is_initialized": lambda: True,
            "get_device_capability": lambda *a, **k: p.capability,
            "get_device_properties": lambda *a, **k: props,
            "get_device_name": lambda *a, **k: p.display_name,
            "is_bf16_supported": lambda *a, **k: p.supports_bf16,
            "synchronize": lambda *a, **k: None,
            "empty_cache": rec.empty_cache,
            "memory_allocated": lambda *a, **k: rec.allocated_bytes,
            "max_memory_allocated": lambda *a, **k: rec.peak_allocated_bytes,
            "memory_reserved": lambda *a, **k: rec.allocated_bytes,
            "max_memory_reserved": lambda *a, **k: rec.peak_allocated_bytes,
            "reset_peak_memory_stats": lambda *a, **k: None,
            "reset_max_memory_allocated": lambda *a, **k: None,
            "mem_get_info": lambda *a, **k: (p.total_bytes - rec.allocated_bytes, p.total_bytes),
            "manual_seed": lambda *a, **k: None,
            "manual_seed_all": lambda *a, **k: None,
            "seed": lambda *a, **k: None,
            "seed_all": lambda *a, **k: None,
            "initial_seed": lambda *a, **k: 0,
            "get_rng_state": rng_state,
            "get_rng_state_all": lambda *a, **k: [rng_state()],
            "set_rng_state": lambda *a, **k: None,
            "set_rng_state_all": lambda *a, **k: None,
            "is_current_stream_capturing": lambda *a, **k: False,
            "current_stream": lambda *a, **k: default_stream,
            "default_stream": lambda *a, **k: default_stream,
            "set_stream": lambda *a, **k: None,
            "stream": lambda *a, **k: contextlib.nullcontext(),
            "Stream": _Stream,
            "_exchange_device": lambda *a, **k: 0,
            "_maybe_exchange_device": lambda *a, **k: 0,
            "nvtx": SimpleNamespace(
                range_push=lambda *a: 0,
                range_pop=lambda *a: 0,
                range=lambda *a, **k: contextlib.nullcontext(),
                mark=lambda *a: None,
            ),
        }
        for name, value in values.items():
            self._set(cuda, name, value)
        if hasattr(cuda, "graphs"):
            self._set(cuda.graphs, "is_current_stream_capturing", lambda *a, **k: False)
        self._set(cuda.random, "get_rng_state", rng_state)
        self._set(cuda.random, "set_rng_state", values["set_rng_state"])
        # torch.utils.checkpoint and the autocast/GradScaler checks read these
        self._set(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
        # the fake convolution asks which backend CUDA would use, which on a CUDA build of
        # torch without a GPU queries the device: answer cuDNN then
        select = getattr(torch._C, "_select_conv_backend", None)
        if select is not None:

            def select_conv_backend(*args: Any, **kwargs: Any) -> Any:
                try:
                    return select(*args, **kwargs)
                except RuntimeError:
                    return torch._C._ConvBackend.Cudnn

            self._set(torch._C, "_select_conv_backend", select_conv_backend)
        return self

    def __exit__(self, *_: Any) -> None:
        for owner, name, value in reversed(self._saved):
            if value is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, value)
        self._saved.clear()


_MISSING = object()


# ============================================================================================
# What the trace records


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
        self.notes: list[str] = []
        self.order = 0
        self.lock = threading.RLock()

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
        self.events.append(("alloc", bid, size, 0))
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
        if not self.recording or size <= 0:
            return
        with self.lock:
            bid = self._alloc(size, kind, op)
            if fallbacks:
                self.fallbacks[bid] = fallbacks
            self._free(bid)
            if before is not None:
                self._move_before(before)

    def _move_before(self, tensor: Any) -> None:
        """Move the last two events (a transient's allocation and free) before the
        allocation of ``tensor``'s storage, if that is among the op's latest events."""
        entry = self.live.get(tensor.untyped_storage()._cdata)
        if entry is None or entry[0] is None:
            return
        moved = self.events[-2:]
        for i in range(len(self.events) - 3, max(-1, len(self.events) - 10), -1):
            if self.events[i][:2] == ("alloc", entry[0]):
                del self.events[-2:]
                self.events[i:i] = moved
                return

    def persistent(self, size: int, kind: str, op: str) -> int | None:
        """A buffer a library keeps for the rest of the run (cuBLAS workspaces)."""
        if not self.recording or size <= 0:
            return None
        with self.lock:
            return self._alloc(size, kind, op)

    def empty_cache(self, *_: Any, **__: Any) -> None:
        if self.recording:
            with self.lock:
                self.events.append(("empty_cache",))

    def see(self, tensor: torch.Tensor, op: str) -> None:
        """Record the storage of ``tensor`` if it is new (called for every op output)."""
        if not isinstance(tensor, FakeTensor) or tensor.fake_device.type != "cuda":
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        size = storage.nbytes()
        with self.lock:
            entry = self.live.get(key)
            if entry is not None:
                if entry[2] == size:
                    return
                # resized in place (resize_, out=): the allocator hands out a new block
                bid, ref, _ = entry
                if bid is not None:
                    self._free(bid)
                    bid = self._alloc(size, "temporary", op)
                self.live[key] = (bid, ref, size)
                return
            ref = weakref.ref(storage, functools.partial(self._on_free, key))
            if self.recording:
                bid = self._alloc(size, "data" if self.phase == "data" else "temporary", op)
            else:
                bid = None
                self.pending[key] = (ref, size, self.order)
                self.order += 1
            self.live[key] = (bid, ref, size)

    def _on_free(self, key: int, _ref: Any) -> None:
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
        qualifies, so the sum got a new block. If an operand that is not a view (a view
        keeps its base alive) is freed before anything else is allocated, the sum takes that
        operand's block instead (``_accumulate_in_place``). Recorded on an H200: the example
        CNN's residual sums ran in place; BERT's, whose gradients are views of matmul
        outputs, did not."""
        self.accumulating = None
        if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
            return
        a, b = args[0], args[1]
        if a.shape != out.shape or b.shape != out.shape or not a.dtype == b.dtype == out.dtype:
            return
        entry = self.live.get(out.untyped_storage()._cdata)
        if entry is None or entry[0] is None or not self.events:
            return
        if self.events[-1][:2] != ("alloc", entry[0]):
            return
        inputs = []
        for t in (a, b):
            if t._is_view():  # a view keeps its base, so the buffer is not its last holder
                continue
            e = self.live.get(t.untyped_storage()._cdata)
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

    def retag(self, storage: Any, kind: str) -> None:
        entry = self.live.get(storage._cdata)
        if entry is not None and entry[0] is not None:
            self.blocks[entry[0]].kind = kind


# ============================================================================================
# The fake-tensor mode


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TRACE_FILES = (os.path.abspath(__file__), os.path.join(_OWN_DIR, "estimate", "kernels.py"))


def _user_location() -> str | None:
    """The innermost frame outside torch: where the user's code (or a library it calls) made
    the op; None when it is vramscope's own step (``float(loss)`` in the standard step)."""
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(torch_dir) or path in _TRACE_FILES or "<frozen" in path:
            continue
        if path.startswith(_OWN_DIR):
            return None
        return f"{os.path.basename(path)}:{frame.lineno} ({frame.name})"
    return "unknown location"


_WRITTEN_ARGS: dict[Any, tuple[int, ...]] = {}  # op -> positions of arguments it writes
_DYNAMIC_SHAPE_OPS = {
    "aten::nonzero",
    "aten::masked_select",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::_unique",
    "aten::index.Tensor",
    "aten::repeat_interleave.Tensor",
}


# answered from the fake tensor's metadata, as FakeTensorMode.dispatch does first
_META_HANDLERS: dict[Any, Any] = dict(_DISPATCH_META_HANDLERS)


# ---- the fake-tensor cache, used with less overhead ------------------------------------------
#
# FakeTensorMode caches each op's output metadata under a key made of the op and the metadata
# of its arguments (``FakeTensorMode._cache_key``) and makes a cache hit's output from it.
# Building that key in Python was the largest single cost of a trace, and making the output the
# next. ``_fast_cache_key`` builds the *same* key -- the same tuple, element for element -- for
# the arguments a trace meets (fake tensors of the mode, numbers, dtypes, devices, lists of
# them), with fewer calls; anything else goes to torch's own method. ``TracingMode._cache_hit``
# looks it up in torch's cache as ``FakeTensorMode.dispatch`` would, and the output is made as
# torch makes it, its Python wrapper filled from a template (``TracingMode._wrap_meta``). The
# first calls of every op are checked against torch's key, and the first wrappers of every
# device against torch's constructor: one difference turns that fast path off for the rest of
# the process, so a torch that differs is only slower, never wrong. Misses, bypasses and
# anything unusual take torch's own path.

# torch's TensorMetadata fields, in order, as the fast key flattens them
_TENSOR_METADATA_FIELDS = (
    "dtype",
    "shape",
    "stride",
    "device",
    "layout",
    "memory_format",
    "storage_offset",
    "storage_bytes",
    "requires_grad",
    "is_quantized",
    "is_conj",
    "is_neg",
    "is_inference",
    "is_sparse",
    "is_coalesced",
    "dense_dim",
    "sparse_dim",
)
_PLAIN_ARGS = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)
_LENGTHS = [f"length_{n}" for n in range(1024)]  # beyond: made when needed
_FAST_KEY_CHECKS = 2  # calls of each op whose fast key is compared with torch's
_KEY_CHECKED: dict[Any, int] = {}  # op -> calls compared so far
# The fast paths of this section, each on unless this torch lacks what it needs or a check
# found a difference (tests turn them off to compare): "key" the cache key and the cache-hit
# dispatch (and the foreach list cache, which needs the key), "wrap" the outputs of cache
# hits, "foreach" in-place foreach ops answered without their meta functions.
FAST_PATHS: dict[str, bool] = {"key": False, "wrap": True, "foreach": True}
try:
    from torch._prims_common import suggest_memory_format as _suggest_memory_format
    from torch._subclasses._fake_tensor_utils import _CacheKeyState
    from torch._subclasses.fake_tensor import (
        _DISPATCH_HANDLE_DIRECTLY,
        _DispatchCacheKey,
        _DispatchCacheValidEntry,
    )
    from torch._subclasses.fake_tensor import TensorMetadata as _TensorMetadata
    from torch._subclasses.fake_tensor import log as _fake_log
    from torch.fx.experimental.proxy_tensor import get_proxy_mode as _get_proxy_mode

    FAST_PATHS["key"] = (
        tuple(f.name for f in dataclasses.fields(_TensorMetadata)) == _TENSOR_METADATA_FIELDS
    )
except Exception:  # another torch: its own key and dispatch only
    pass


def _parameters(method: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return ()


# the methods the fast paths stand in for or call, as this torch has them
FAST_PATHS["key"] = FAST_PATHS["key"] and (
    _parameters(FakeTensorMode._cache_key) == ("self", "state", "func", "args", "kwargs")
    and _parameters(FakeTensorMode._output_from_cache_entry)
    == ("self", "state", "entry", "key", "func", "args")
    and _parameters(FakeTensorMode._make_cache_entry)
    == ("self", "state", "key", "func", "args", "kwargs", "output")
)
FAST_PATHS["wrap"] = _parameters(
    getattr(FakeTensorMode, "_get_output_tensor_from_cache_entry", None)
) == ("self", "state", "entry", "key", "func", "args") and not getattr(
    getattr(sys.modules[FakeTensorMode.__module__], "FakeTensorConfig", None), "debug", True
)


def _proxy_tracing() -> bool:
    """``get_proxy_mode() is not None`` (its pybind enum look-ups, once)."""
    if _PROXY_KEY is None:
        return _get_proxy_mode() is not None
    return (
        _pre_dispatch_modes().get(0) is not None
        or torch._C._get_dispatch_mode(_PROXY_KEY) is not None
    )


try:
    _PROXY_KEY: Any = torch._C._TorchDispatchModeKey.PROXY
    _pre_dispatch_modes = torch._ops.mode_stack_state_for_pre_dispatch
    _pre_dispatch_modes().get(0)
except Exception:  # another torch: ask get_proxy_mode
    _PROXY_KEY = None


class _UnusualArgument(Exception):
    """An argument the fast key does not handle: torch's own method builds the key."""


def _flatten_tensor(mode: FakeTensorMode, out: list[Any], t: Any) -> None:
    """``extract_tensor_metadata(t)._flatten_into(out, ...)`` for a dense, non-symbolic fake
    tensor of ``mode``."""
    if (
        t.fake_mode is not mode
        or t.constant is not None
        or t.layout != torch.strided
        or t._has_symbolic_sizes_strides
    ):
        raise _UnusualArgument
    shape = t.shape
    stride = t.stride()
    ndim = len(shape)
    memory_format = _suggest_memory_format(t) if ndim == 4 or ndim == 5 else torch.contiguous_format
    if not t.is_contiguous(memory_format=memory_format):
        memory_format = None
    append = out.append
    append(t.dtype)
    append(torch.Size)
    length = _LENGTHS[ndim] if ndim < 1024 else f"length_{ndim}"
    append(length)
    for d in shape:
        append(int)
        append(d)
    append(tuple)
    append(length)
    for d in stride:
        append(int)
        append(d)
    out += (
        t.device,
        torch.strided,
        memory_format,
        t.storage_offset(),
        t.untyped_storage().nbytes(),
        t.requires_grad,
        t.is_quantized,
        t.is_conj(),
        t.is_neg(),
        t.is_inference(),
        False,  # is_sparse
        None,  # is_coalesced
        None,  # dense_dim
        None,  # sparse_dim
    )


def _flatten_args(mode: FakeTensorMode, out: list[Any], args: Any) -> None:
    """``FakeTensorMode._prep_args_for_hash`` for a list or tuple of plain arguments."""
    n = len(args)
    out.append(type(args))
    out.append(_LENGTHS[n] if n < 1024 else f"length_{n}")
    _flatten_items(mode, out, args)


def _flatten_items(mode: FakeTensorMode, out: list[Any], args: Any) -> None:
    for arg in args:
        cls = type(arg)
        if cls in _PLAIN_ARGS:
            out.append(cls)
            out.append(arg)
        elif isinstance(arg, FakeTensor):
            _flatten_tensor(mode, out, arg)
        elif cls is list or cls is tuple or cls is torch.Size:
            _flatten_args(mode, out, arg)
        else:
            raise _UnusualArgument


def _fast_cache_key(
    mode: FakeTensorMode, func: Any, args: Any, kwargs: Any
) -> tuple[Any, ...] | None:
    """The tuple ``FakeTensorMode._cache_key`` would build, or None when an argument is
    unusual (a real tensor, a symbolic size, a constant, a sparse tensor, a callable...)."""
    key = [
        func,
        torch.get_default_dtype(),
        torch._C._get_default_device(),
        torch.is_inference_mode_enabled(),
        None,  # no ShapeEnv
        _proxy_tracing(),
    ]
    try:
        if args:
            if type(args) is not tuple and type(args) is not list:
                return None
            _flatten_args(mode, key, args)
        if kwargs:
            if type(kwargs) is not dict:
                return None
            key += (dict, f"length_{len(kwargs)}")
            for name in kwargs:
                if type(name) is not str:
                    return None
                key += (str, name)
            _flatten_items(mode, key, kwargs.values())
    except _UnusualArgument:
        return None
    return tuple(key)


_LOCAL_SCALAR_DENSE = aten._local_scalar_dense.default
_FUSED_SDP_CHOICE = aten._fused_sdp_choice.default
_EQUAL = aten.equal.default
_MISS = object()  # not a plain cache hit (TracingMode._cache_hit)
# FakeTensors of cache hits made without the Python constructor (TracingMode._wrap_meta)
_WRAP_CHECKS = 8  # wraps per mode and device compared with the constructor's
_NO_TEMPLATE = object()


# ---- foreach ops (the optimizers' updates) ----------------------------------------------------

_REAL_SCALARS = frozenset({int, float, bool})
_INPLACE_FOREACH: dict[Any, bool] = {}


def _is_inplace_foreach(func: Any) -> bool:
    """``aten::_foreach_*_`` ops that write their first list and return nothing."""
    known = _INPLACE_FOREACH.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = _INPLACE_FOREACH[func] = bool(
            schema is not None
            and schema.name.startswith("aten::_foreach_")
            and not schema.returns
            and schema.arguments
            and schema.arguments[0].alias_info is not None
            and schema.arguments[0].alias_info.is_write
        )
    return known


_RETURNS_LIST: dict[Any, bool] = {}
_BYPASS = object()
# entries of foreach ops that return lists (TracingMode._cached_list_dispatch), by cache key
_list_cache: dict[str, Any] = {"entries": {}}


def _returns_tensor_list(func: Any) -> bool:
    """``aten::_foreach_*`` ops that write nothing and return one list of tensors."""
    known = _RETURNS_LIST.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = False
        if (
            schema is not None
            and schema.name.startswith("aten::_foreach_")
            and len(schema.returns) == 1
            and not any(a.alias_info is not None for a in schema.arguments)
        ):
            with contextlib.suppress(Exception):
                known = schema.returns[0].type == torch._C.ListType.ofTensors()
        _RETURNS_LIST[func] = known
    return known


class TracingMode(FakeTensorMode):
    """FakeTensorMode that records CUDA storages, answers ``.item()`` with plausible values
    and picks the attention kernels the profiled GPU would run."""

    def __init__(self, recorder: Recorder, profile: GpuProfile) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.recorder = recorder
        self.profile = profile
        # keyed by identity: a tensor's == is an op, which would come back here
        self.shadows: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.producers: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._local = threading.local()
        self._fake_templates: dict[torch.device, Any] = {}

    @property
    def avoid_device_init(self) -> bool:  # never move constants to the (absent) device
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing here is compiled: skip the torch._dynamo.disable wrapper on every op
        return False

    def _cache_key(self, *arguments: Any) -> Any:
        """torch's cache key, built by ``_fast_cache_key`` where it can (the same key)."""
        if not FAST_PATHS["key"] or self.shape_env is not None:
            return super()._cache_key(*arguments)
        state, func, args, kwargs = arguments
        fast = _fast_cache_key(self, func, args, kwargs)
        if fast is None:
            return super()._cache_key(state, func, args, kwargs)
        count = _KEY_CHECKED.get(func, 0)
        if count < _FAST_KEY_CHECKS:
            _KEY_CHECKED[func] = count + 1
            try:
                key = super()._cache_key(state, func, args, kwargs)
            except Exception:
                FAST_PATHS["key"] = False
                raise
            if key.key != fast:
                FAST_PATHS["key"] = False
            return key
        return _DispatchCacheKey(fast)

    def __torch_dispatch__(  # type: ignore[override]
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return self.dispatch(func, types, args, kwargs)

    def _get_output_tensor_from_cache_entry(self, *arguments: Any) -> Any:
        """A cache hit's new output, as torch makes it (a meta tensor of the cached metadata,
        on the viewed storage for a view op, wrapped as a fake tensor), with less overhead;
        in-place and symbolic entries go to torch's own method."""
        if not FAST_PATHS["wrap"]:
            return super()._get_output_tensor_from_cache_entry(*arguments)
        state, entry, key, func, args = arguments
        metadata = entry.metadata
        if (
            metadata is None
            or entry.inplace_idx is not None
            or self.shape_env is not None
            or metadata.layout != torch.strided
            or not isinstance(func, torch._ops.OpOverload)
        ):
            return super()._get_output_tensor_from_cache_entry(state, entry, key, func, args)
        shape, stride, offset = metadata.shape, metadata.stride, metadata.storage_offset
        storage = args[entry.view_idx].untyped_storage() if func.is_view else None
        previous = self.in_kernel_invocation
        # what in_kernel_invocation_manager(self) does
        with torch._C._DisableTorchDispatch():
            self.in_kernel_invocation = True
            with torch._C._PreserveDispatchKeyGuard():
                torch._C._set_meta_in_tls_dispatch_include(True)
                try:
                    empty = torch.empty_strided(
                        shape,
                        stride,
                        dtype=metadata.dtype,
                        layout=metadata.layout,
                        device="meta",
                        requires_grad=metadata.requires_grad,
                    )
                    if metadata.is_conj:
                        torch._C._set_conj(empty, True)
                    if metadata.is_neg:
                        torch._C._set_neg(empty, True)
                    if storage is not None:
                        empty.set_(storage, offset, shape, stride)
                finally:
                    self.in_kernel_invocation = previous
        return self._wrap_meta(empty, metadata.device)

    def _wrap_meta(self, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        """``FakeTensor(self, elem, device)``, with the Python part of the constructor replaced
        by a copy of the attributes a first ``FakeTensor(...)`` of this mode and device got
        (all None but the device and the mode; anything else keeps the constructor). The first
        wraps of every device are compared with the constructor's."""
        template = self._fake_templates.get(device, _NO_TEMPLATE)
        if template is _NO_TEMPLATE:
            made = FakeTensor(self, elem, device)
            state = dict(made.__dict__)
            ok = (
                FAST_PATHS["wrap"]
                and device.type != "meta"
                and state.get("_fake_device") == device
                and state.get("fake_mode") is self
                and all(
                    v is None for k, v in state.items() if k not in ("_fake_device", "fake_mode")
                )
            )
            self._fake_templates[device] = (state, [_WRAP_CHECKS]) if ok else None
            return made
        if template is None or not FAST_PATHS["wrap"]:
            return FakeTensor(self, elem, device)
        state, checks = template
        made = torch.Tensor._make_subclass(
            FakeTensor,
            elem,
            elem.requires_grad,
            dispatch_device=True,
            device_for_backend_keys=device,
        )
        if not self._allow_unsafe_data_ptr_access:
            torch._C._set_throw_on_mutable_data_ptr(made)
        else:
            torch._C._set_warn_deprecated_on_mutable_data_ptr(made)
        made.__dict__.update(state)
        made.__init__()
        if checks[0]:
            checks[0] -= 1
            reference = FakeTensor(self, elem, device)
            if (
                reference.__dict__ != made.__dict__
                or torch._C._dispatch_keys(reference) != torch._C._dispatch_keys(made)
                or reference.requires_grad != made.requires_grad
            ):
                FAST_PATHS["wrap"] = False
                self._fake_templates[device] = None
                return reference
        return made

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        handler = _META_HANDLERS.get(func)
        if handler is not None:
            # metadata queries (``prim.device`` above all: about half of all the ops the
            # autograd engine dispatches): no output, no allocation, nothing to record
            return handler(args)
        kwargs = kwargs or {}
        if func is _LOCAL_SCALAR_DENSE:
            return self._scalar(args[0])
        if func is _FUSED_SDP_CHOICE:
            return kernels.choose_sdpa_backend(self.profile, self.recorder, *args, **kwargs)
        if func is _EQUAL:
            shadow = self._shadow_args(args)
            if shadow is not None:
                with no_dispatch():
                    return bool(func(*shadow))
            self._note_data_dependent("aten.equal", None)
            return True
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        try:
            if (
                FAST_PATHS["foreach"]
                and _is_inplace_foreach(func)
                and self._plain_foreach(args, kwargs)
            ):
                out = None  # what the fake kernel returns, after its checks would pass
            elif FAST_PATHS["key"] and _returns_tensor_list(func):
                out = self._cached_list_dispatch(func, types, args, kwargs)
            else:
                out = self._cache_hit(func, args, kwargs)
                if out is _MISS:
                    out = super().dispatch(func, types, args, kwargs)
        except DynamicOutputShapeException:
            out = self._dynamic_shape(func, types, args, kwargs)
        except DataDependentOutputException as exc:
            where = _user_location() or "the standard step"
            raise TraceError(
                f"{func} needs the values of a tensor, which an estimate does not have "
                f"(at {where}): {exc}"
            ) from None
        finally:
            local.depth = depth
        if depth:
            # an op the fake mode runs to compute another (a Python decomposition or meta
            # function): on the GPU it is inside one kernel, so it allocates nothing of its own
            return out
        recorder = self.recorder
        if isinstance(out, torch.Tensor):
            recorder.see(out, func.__name__)
            if func is _ADD and recorder.in_backward and recorder.recording:
                with recorder.lock:
                    recorder.gradient_sum(out, args)
            outs = (out,)
        elif isinstance(out, (tuple, list)):
            outs = tuple(out)
            for t in outs:
                if isinstance(t, torch.Tensor):
                    recorder.see(t, func.__name__)
                elif isinstance(t, (tuple, list)):
                    for u in t:
                        if isinstance(u, torch.Tensor):
                            recorder.see(u, func.__name__)
        else:
            outs = ()
        if recorder.recording:
            kernels.after_op(self.profile, recorder, func, args, kwargs, out)
        self._track_small(func, args, kwargs, outs)
        return out

    def _cache_hit(self, func: Any, args: Any, kwargs: Any) -> Any:
        """``FakeTensorMode.dispatch`` when the op's output is in torch's cache: the same
        lookup and the same output, without the per-op logging context, the key wrapper and
        the cache-key state object; ``_MISS`` when it is not a plain cache hit (a miss, a
        bypass, an op torch answers directly, debug logging or cross-checks on), for torch's
        own path."""
        if (
            not FAST_PATHS["key"]
            or self.shape_env is not None
            or not self.cache_enabled
            or self.cache_crosscheck_enabled
            or func in _DISPATCH_HANDLE_DIRECTLY
            or _fake_log.isEnabledFor(logging.DEBUG)
            or _KEY_CHECKED.get(func, 0) < _FAST_KEY_CHECKS
        ):
            return _MISS
        fast = _fast_cache_key(self, func, args, kwargs)
        if fast is None:
            return _MISS
        key = _DispatchCacheKey(fast)
        entry = FakeTensorMode.cache.get(key)
        if entry is None or type(entry) is not _DispatchCacheValidEntry:
            return _MISS
        output = self._output_from_cache_entry(_CacheKeyState(None), entry, key, func, args)
        FakeTensorMode.cache_hits += 1
        return output

    def _cached_list_dispatch(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """A foreach op that returns a list of new tensors (``_foreach_sqrt``...). torch's
        cache takes tuple outputs but not lists, so each call would run a Python meta function
        per element; here the list is cached as torch caches a tuple (the same entry, made by
        ``_make_cache_entry``), once the outputs synthesized from it are checked to have the
        storages the kernel made."""
        fast = (
            _fast_cache_key(self, func, args, kwargs)
            if FAST_PATHS["key"] and self.shape_env is None
            else None
        )
        if fast is None:
            return super().dispatch(func, types, args, kwargs)
        key = _DispatchCacheKey(fast)
        entries = _list_cache["entries"]
        entry = entries.get(key)
        if entry is _BYPASS:
            return super().dispatch(func, types, args, kwargs)
        state = _CacheKeyState(self.shape_env)
        if entry is not None:
            return [
                self._get_output_tensor_from_cache_entry(state, info, key, func, args)
                for info in entry.output_infos
            ]
        entry = self._deduplicated_entry(state, key, func, types, args, kwargs)
        if entry is not None:
            entries[key] = entry
            return [
                self._get_output_tensor_from_cache_entry(state, info, key, func, args)
                for info in entry.output_infos
            ]
        out = super().dispatch(func, types, args, kwargs)
        try:
            entry = self._list_entry(state, key, func, args, kwargs, out)
        except Exception:
            entry = None
        entries[key] = _BYPASS if entry is None else entry
        return out

    def _deduplicated_entry(
        self, state: Any, key: Any, func: Any, types: Any, args: Any, kwargs: Any
    ) -> Any | None:
        """The entry of a foreach call computed on one element of each kind: elements whose
        arguments have the same metadata (an optimizer's parameters come in a few shapes) get
        the same output metadata, as the kernel runs element by element. None when nothing
        repeats or anything is unusual."""
        lists = [
            (i, arg)
            for i, arg in enumerate((*args, *kwargs.values()))
            if type(arg) in (list, tuple)
        ]
        if not lists:
            return None
        n = len(lists[0][1])
        if n < 2 or any(len(arg) != n for _, arg in lists):
            return None
        firsts: dict[tuple[Any, ...], int] = {}
        position: list[int] = []
        try:
            for i in range(n):
                signature: list[Any] = []
                for _, arg in lists:
                    item = arg[i]
                    if type(item) is FakeTensor:
                        _flatten_tensor(self, signature, item)
                    elif type(item) in _REAL_SCALARS:
                        signature += (type(item), item)
                    else:
                        return None
                position.append(firsts.setdefault(tuple(signature), len(firsts)))
        except _UnusualArgument:
            return None
        if len(firsts) == n:
            return None
        representatives = [position.index(k) for k in range(len(firsts))]
        taken = {i: type(arg)(arg[r] for r in representatives) for i, arg in lists}
        everything = [taken.get(i, a) for i, a in enumerate((*args, *kwargs.values()))]
        sub_args = tuple(everything[: len(args)])
        sub_kwargs = dict(zip(kwargs, everything[len(args) :], strict=True))
        try:
            out = super().dispatch(func, types, sub_args, sub_kwargs)
            sub = self._list_entry(state, key, func, sub_args, sub_kwargs, out)
        except Exception:
            return None
        if sub is None:
            return None
        return _DispatchCacheValidEntry(
            output_infos=tuple(sub.output_infos[k] for k in position), is_output_tuple=True
        )

    def _list_entry(
        self, state: Any, key: Any, func: Any, args: Any, kwargs: Any, out: Any
    ) -> Any | None:
        if type(out) is not list or not out or any(type(t) is not FakeTensor for t in out):
            return None
        entry = self._make_cache_entry(state, key, func, args, kwargs, tuple(out))
        if len(entry.output_infos) != len(out):
            return None
        inputs = {
            t.untyped_storage()._cdata
            for arg in (*args, *kwargs.values())
            for t in (arg if isinstance(arg, (list, tuple)) else (arg,))
            if isinstance(t, torch.Tensor)
        }
        seen: set[int] = set()
        for made, info in zip(out, entry.output_infos, strict=True):
            if info.metadata is None or info.inplace_idx is not None or info.view_idx is not None:
                return None
            storage = made.untyped_storage()
            if storage._cdata in inputs or storage._cdata in seen:
                return None
            seen.add(storage._cdata)
            again = self._get_output_tensor_from_cache_entry(state, info, key, func, args)
            if (
                again.untyped_storage().nbytes() != storage.nbytes()
                or again.storage_offset() != made.storage_offset()
            ):
                return None
        return entry

    def _plain_foreach(self, args: Any, kwargs: dict[str, Any]) -> bool:
        """An in-place foreach op (``_foreach_add_``, ``_foreach_lerp_``...: the optimizers'
        updates) whose lists are fake tensors of this mode that agree, element for element, in
        shape, floating dtype and device, with real-number scalars: its fake kernel would check
        that and return None; each element of each list would otherwise pass through a Python
        meta function (most of an optimizer's first step). Anything else takes the fake path."""
        length = -1
        lists: list[Any] = []
        for arg in (*args, *kwargs.values()):
            if type(arg) is list or type(arg) is tuple:
                if length < 0:
                    length = len(arg)
                if len(arg) != length or not length:
                    return False
                if isinstance(arg[0], torch.Tensor):
                    lists.append(arg)
                elif not all(type(x) in _REAL_SCALARS for x in arg):
                    return False
            elif type(arg) not in _REAL_SCALARS:
                return False
        if not lists:
            return False
        for t in (t for tensors in lists for t in tensors):
            if (
                type(t) is not FakeTensor
                or t.fake_mode is not self
                or t.constant is not None
                or not t.is_floating_point()
                or t.layout != torch.strided
                or t._has_symbolic_sizes_strides
            ):
                return False
        first = lists[0]
        for tensors in lists[1:]:
            for a, b in zip(first, tensors, strict=True):
                if a.shape != b.shape or a.dtype != b.dtype or a.fake_device != b.fake_device:
                    return False
        return True

    # ---- small tensors keep real values ---------------------------------------------------
    def _shadow_args(self, args: Any) -> list[Any] | None:
        result = []
        for a in args:
            if isinstance(a, torch.Tensor):
                s = self.shadows.get(a) if isinstance(a, FakeTensor) else a
                if s is None:
                    return None
                result.append(s)
            elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
                inner = self._shadow_args(a)
                if inner is None:
                    return None
                result.append(type(a)(inner))
            else:
                result.append(a)
        return result

    def _track_small(self, func: Any, args: Any, kwargs: Any, outs: tuple[Any, ...]) -> None:
        small = [t for t in outs if isinstance(t, FakeTensor) and t.numel() <= SHADOW_LIMIT]
        writes = _WRITTEN_ARGS.get(func)
        if writes is None:
            writes = _WRITTEN_ARGS[func] = tuple(
                i
                for i, arg in enumerate(func._schema.arguments)
                if arg.alias_info is not None and arg.alias_info.is_write
            )
        if not small and not writes:
            return
        mutated: list[FakeTensor] = []
        for i in writes:
            a = args[i] if i < len(args) else None
            if isinstance(a, FakeTensor):
                mutated.append(a)
            elif isinstance(a, (list, tuple)):
                mutated.extend(x for x in a if isinstance(x, FakeTensor))
        if not small and not mutated:
            return
        shadow_args = self._shadow_args(args)
        shadow_kwargs: dict[str, Any] | None = {}
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                s = self.shadows.get(v) if isinstance(v, FakeTensor) else v
                if s is None:
                    shadow_kwargs = None
                    break
                shadow_kwargs[k] = s
            elif isinstance(v, torch.device):
                shadow_kwargs[k] = torch.device("cpu")
            else:
                shadow_kwargs[k] = v
        name = func.__name__
        for t in (*small, *mutated):
            with contextlib.suppress(TypeError):
                self.producers[t] = name
        if (
            shadow_args is None
            or shadow_kwargs is None
            or any(isinstance(t, FakeTensor) and t.numel() > SHADOW_LIMIT for t in outs)
        ):
            for t in mutated:
                self.shadows.pop(t, None)
            return
        try:
            with no_dispatch():
                real = func(*shadow_args, **shadow_kwargs)
        except Exception:
            for t in mutated:
                self.shadows.pop(t, None)
            return
        reals = (
            (real,)
            if isinstance(real, torch.Tensor)
            else tuple(real)
            if isinstance(real, (tuple, list))
            else ()
        )
        for fake, value in zip(outs, reals, strict=False):
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                with contextlib.suppress(TypeError):
                    self.shadows[fake] = value

    def _scalar(self, tensor: torch.Tensor) -> Any:
        shadow = self.shadows.get(tensor) if isinstance(tensor, FakeTensor) else None
        if shadow is not None:
            with no_dispatch():
                return shadow.item()
        if isinstance(tensor, FakeTensor) and tensor.constant is not None:
            with no_dispatch():
                return tensor.constant.item()
        producer = self.producers.get(tensor, "") if isinstance(tensor, FakeTensor) else ""
        self._note_data_dependent("Tensor.item()", producer)
        dtype = tensor.dtype
        if dtype == torch.bool:
            return producer not in ("any", "isnan", "isinf", "isneginf", "isposinf")
        if dtype.is_floating_point:
            # GradScaler's found_inf and other overflow flags read 0; anything else 1
            if producer.startswith("_amp") or producer in ("isnan", "isinf"):
                return 0.0
            return 1.0
        if dtype.is_complex:
            return complex(1.0)
        return 1

    def _note_data_dependent(self, what: str, producer: str | None) -> None:
        where = _user_location()
        if where is None:
            return
        key = f"{what} at {where}"
        if key not in self.recorder.data_dependent:
            made = f" of {producer}" if producer else ""
            self.recorder.data_dependent[key] = f"{what}{made} at {where}"

    def _dynamic_shape(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """Ops whose output size depends on values: exact when the input has real values,
        else the largest possible size (every element selected)."""
        name = func._schema.name
        overload = f"{name}.{func._overloadname}" if func._overloadname != "default" else name
        shadow = self._shadow_args(args)
        where = _user_location() or "the standard step"
        if shadow is not None:
            with no_dispatch():
                real = func(*shadow, **kwargs)
            shape = real.shape if isinstance(real, torch.Tensor) else None
        else:
            shape = None
        x = args[0]
        if overload == "aten::nonzero":
            rows = shape[0] if shape is not None else x.numel()
            result = super().dispatch(
                aten.empty.memory_format,
                types,
                ((rows, x.dim()),),
                {"dtype": torch.long, "device": x.device},
            )
        elif overload == "aten::masked_select":
            n = (
                shape[0]
                if shape is not None
                else torch.broadcast_shapes(x.shape, args[1].shape).numel()
            )
            result = super().dispatch(
                aten.empty.memory_format, types, ((n,),), {"dtype": x.dtype, "device": x.device}
            )
        elif overload == "aten::index.Tensor":
            # a boolean mask of k dims selects (at most) all its elements: k long indices
            indices: list[Any] = []
            for idx in args[1]:
                if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
                    count = idx.numel()
                    long_index = super().dispatch(
                        aten.empty.memory_format,
                        types,
                        ((count,),),
                        {"dtype": torch.long, "device": idx.device},
                    )
                    indices.extend([long_index] * idx.dim())
                else:
                    indices.append(idx)
            result = super().dispatch(func, types, (x, indices), kwargs)
        elif overload in (
            "aten::_unique2",
            "aten::_unique",
            "aten::unique_consecutive",
            "aten::unique_dim",
        ):
            raise TraceError(
                f"{overload} has a size that depends on the tensor's values (at {where}); an "
                "estimate cannot know it. Compute it outside the traced step (e.g. in build())"
            )
        else:
            raise TraceError(
                f"{overload} has an output size that depends on tensor values (at {where}); "
                "an estimate cannot know it"
            )
        self._note_data_dependent(overload, None)
        if shape is None:
            self.recorder.notes.append(
                f"{overload} at {where}: output size depends on values; assumed the largest"
            )
        return result


# ============================================================================================
# Running the workload


class _PhaseListener:
    """Phase marks from the same global hooks the measuring session uses; gradients and
    optimizer state are labelled when backward and the optimizer end."""

    def __init__(self, recorder: Recorder, workload: Workload) -> None:
        self.recorder = recorder
        self.workload = workload

    def on_forward_start(self, module: torch.nn.Module) -> None:
        if self.recorder.phase != "forward":
            self.recorder.set_phase("forward")

    def on_forward_end(self, module: torch.nn.Module) -> None:
        return None

    def on_backward_start(self) -> None:
        self.recorder.in_backward += 1
        self.recorder.set_phase("backward")

    def on_backward_end(self) -> None:
        self.recorder.in_backward -= 1
        _label_persistent(self.recorder, self.workload)

    def on_optimizer_start(self, optimizer: torch.optim.Optimizer) -> None:
        self.recorder.set_phase("optimizer")

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer) -> None:
        _label_persistent(self.recorder, self.workload)

    def on_zero_grad(self) -> None:
        self.recorder.set_phase("zero_grad")

    def on_data(self, loader_id: int | None) -> None:
        self.recorder.set_phase("data")

    def on_loader_iter(self, loader: Any) -> None:
        return None

    def on_oom_in_module(self, module: torch.nn.Module) -> None:
        return None


def _apply_order(module: torch.nn.Module) -> Iterator[tuple[torch.Tensor, str]]:
    """Parameters and buffers in the order ``Module._apply`` (``.to(device)``) visits them."""
    for child in module.children():
        yield from _apply_order(child)
    for p in module._parameters.values():
        if p is not None:
            yield p, "parameter"
    for b in module._buffers.values():
        if b is not None:
            yield b, "buffer"


def _storage(t: torch.Tensor) -> Any | None:
    if isinstance(t, FakeTensor) and t.fake_device.type == "cuda":
        return t.untyped_storage()
    return None


def _check_device(workload: Workload, spec: str) -> None:
    """The model must be on the device build() was given; say so when it is not."""
    for name, p in list(workload.model.named_parameters())[:1000]:
        device = p.fake_device if isinstance(p, FakeTensor) else p.device
        if device.type != "cuda" or (device.index or 0) != 0:
            raise WorkloadError(
                f"{spec} built its model on {device} (parameter {name}), ignoring the "
                "device passed to build(); move it with model.to(device) so it can be estimated"
            )


def _force_foreach(optimizer: torch.optim.Optimizer | None) -> list[str]:
    """On CUDA, torch's optimizers pick the foreach implementation by default; fake tensors
    are not of the types that default checks, so ask for it explicitly."""
    changed: list[str] = []
    if optimizer is None or "foreach" not in optimizer.defaults:
        return changed
    for group in optimizer.param_groups:
        if (
            group.get("foreach") is None
            and not group.get("fused")
            and not group.get("differentiable")
        ):
            group["foreach"] = True
            changed.append(type(optimizer).__name__)
    if optimizer.defaults.get("foreach") is None and changed:
        optimizer.defaults["foreach"] = True
    return changed


@contextlib.contextmanager
def _patched_swap(mode: TracingMode) -> Iterator[None]:
    """``Module._apply`` swaps fake parameters; the fake mode's memo holds weak references to
    them, which swapping refuses. Drop those memo entries first."""
    original = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        memo = mode.fake_tensor_converter.tensor_memo
        for key, value in list(memo.items()):
            if value is t1 or value is t2:
                del memo[key]
        for t in (t1, t2):
            mode.shadows.pop(t, None)
            mode.producers.pop(t, None)
        return original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


@contextlib.contextmanager
def _module_stack(recorder: Recorder, names: dict[int, str]) -> Iterator[None]:
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    def pre(module: torch.nn.Module, _args: Any) -> None:
        recorder.module_stack.append(names.get(id(module), type(module).__name__))

    def post(module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if recorder.module_stack:
            recorder.module_stack.pop()

    handles = [
        register_module_forward_pre_hook(pre),
        register_module_forward_hook(post, always_call=True),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        recorder.module_stack.clear()


@contextlib.contextmanager
def cuda_emulation(profile: GpuProfile, recorder: Recorder) -> Iterator[None]:
    """ATen, autograd and ``torch.cuda`` behave as if the profiled GPU were device 0."""
    _NATIVE.enter()
    try:
        with _CudaModulePatches(profile, recorder), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*CUDA.*")
            warnings.filterwarnings("ignore", message=".*cuda.*")
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        _NATIVE.exit()


def trace_workload(
    spec: WorkloadSpec,
    batch_size: int,
    profile: GpuProfile,
    precision: str | None = None,
    accumulate: int | None = None,
    steps: int = 2,
) -> Trace:
    """Build the workload and trace ``steps`` standard steps on the emulated GPU."""
    import time

    if steps < 1:
        raise VramscopeError(f"steps must be 1 or more, not {steps}")
    start = time.perf_counter()
    kernels.register_cuda_placeholders()
    recorder = Recorder(profile)
    mode = TracingMode(recorder, profile)
    step_starts: list[int] = []
    old_limit = sys.getrecursionlimit()
    with (
        cuda_emulation(profile, recorder),
        _patched_swap(mode),
        mode,
        kernels.AttentionKernels(profile, recorder),
    ):
        from vramscope.workload import build_workload

        try:
            workload = build_workload(spec.builder, batch_size, CUDA, spec.spec)
        except WorkloadError as exc:
            raise _explain_build_error(exc, spec.spec) from None
        workload = workload.with_overrides(precision=precision, accumulate=accumulate)
        _check_device(workload, spec.spec)
        if workload.precision in ("bf16-mixed", "bf16-true") and not profile.supports_bf16:
            recorder.notes.append(
                f"{profile.display_name} has no bfloat16 support (sm{profile.sm}); torch would "
                "refuse bf16 autocast there"
            )
        changed = _force_foreach(workload.optimizer)
        if changed:
            recorder.notes.append(
                f"{changed[0]}: foreach implementation, as torch picks by default on CUDA"
            )
        names = {
            id(m): (n or type(workload.model).__name__) for n, m in workload.model.named_modules()
        }
        # what the build left on the device, in the order model.to(device) allocates it
        ordered = _built_state(workload)
        build_seconds = time.perf_counter() - start
        recorder.adopt_built_state(ordered)
        del ordered
        build_end = len(recorder.events)
        params = list(workload.model.parameters())
        parameters = sum(p.numel() for p in params)
        parameter_bytes = sum(p.numel() * p.element_size() for p in params)
        del params
        recorder.set_phase("setup", -2)
        try:
            runner = StepRunner(workload, CUDA)
        except VramscopeError:
            raise
        except Exception as exc:
            raise _explain_step_error(exc, spec.spec, recorder) from None
        _label_persistent(recorder, workload)
        setup_end = len(recorder.events)
        from vramscope.tracking.hooks import GlobalHooks

        hooks = GlobalHooks(_PhaseListener(recorder, workload))
        hooks.install()
        try:
            # Backward runs on the calling thread: autograd's per-device threads may have
            # been sized, before this trace, for a process without CUDA. The kernels module
            # accounts cuBLAS handles per thread as the GPU would (backward on its own).
            with _module_stack(recorder, names), torch.autograd.set_multithreading_enabled(False):
                step_seconds: list[float] = []
                for index in range(steps):
                    t_step = time.perf_counter()
                    step_starts.append(len(recorder.events))
                    recorder.set_phase("data", index)
                    try:
                        runner()
                    except VramscopeError:
                        raise
                    except Exception as exc:
                        raise _explain_step_error(exc, spec.spec, recorder) from None
                    _label_persistent(recorder, workload)
                    step_seconds.append(round(time.perf_counter() - t_step, 3))
        finally:
            hooks.remove()
            sys.setrecursionlimit(old_limit)
        recorder.set_phase("end", steps)
        modules = _module_table(recorder, workload, names)
        training = workload.training
        precision_used = workload.precision
        accumulate_used = workload.accumulate
        del runner, workload
    return Trace(
        events=recorder.events,
        blocks=recorder.blocks,
        marks=recorder.marks,
        step_starts=step_starts,
        build_end=build_end,
        setup_end=setup_end,
        training=training,
        precision=precision_used,
        accumulate=accumulate_used,
        parameters=parameters,
        parameter_bytes=parameter_bytes,
        modules=modules,
        notes=list(dict.fromkeys(recorder.notes)),
        data_dependent=list(recorder.data_dependent.values()),
        sdpa=dict(recorder.sdpa),
        workspaces=dict(recorder.workspaces),
        fallbacks=dict(recorder.fallbacks),
        libraries=set(recorder.libraries),
        backward_ran=any(p == "backward" for _, _, p in recorder.marks),
        seconds=time.perf_counter() - start,
        build_seconds=round(build_seconds, 3),
        step_seconds=step_seconds,
    )


def _built_state(workload: Workload) -> list[tuple[Any, str]]:
    """Storages of the model (in ``.to(device)`` order) and of any optimizer state.

    A function of its own so that no loop variable keeps a storage alive afterwards."""
    ordered: list[tuple[Any, str]] = []
    for t, kind in _apply_order(workload.model):
        st = _storage(t)
        if st is not None:
            ordered.append((st, kind))
    if workload.optimizer is not None:
        for state in workload.optimizer.state.values():
            for t in _tensors_in(state):
                st = _storage(t)
                if st is not None:
                    ordered.append((st, "optimizer_state"))
    return ordered


def _label_persistent(recorder: Recorder, workload: Workload) -> None:
    """Parameters, buffers, gradients and optimizer state are what the objects hold now
    (called after set-up, when backward ends and when the optimizer step ends)."""
    for t in workload.model.parameters():
        st = _storage(t)
        if st is not None:
            recorder.retag(st, "parameter")
    for t in workload.model.buffers():
        st = _storage(t)
        if st is not None:
            recorder.retag(st, "buffer")
    for p in workload.model.parameters():
        if p.grad is not None:
            st = _storage(p.grad)
            if st is not None:
                recorder.retag(st, "gradient")
    if workload.optimizer is not None:
        for state in workload.optimizer.state.values():
            for t in _tensors_in(state):
                st = _storage(t)
                if st is not None:
                    recorder.retag(st, "optimizer_state")


def _module_table(
    recorder: Recorder, workload: Workload, names: dict[int, str]
) -> list[dict[str, Any]]:
    """Parameters, gradients and optimizer state each module owns (its own tensors)."""
    rows: dict[str, dict[str, Any]] = {}
    opt_state: dict[int, int] = {}
    if workload.optimizer is not None:
        for p, state in workload.optimizer.state.items():
            opt_state[id(p)] = sum(
                _block(t.untyped_storage().nbytes())
                for t in _tensors_in(state)
                if _storage(t) is not None
            )
    seen: set[int] = set()
    for name, module in workload.model.named_modules():
        own = [p for p in module._parameters.values() if p is not None and id(p) not in seen]
        seen.update(id(p) for p in own)
        row = {
            "name": name,
            "class": type(module).__name__,
            "depth": 0 if not name else name.count(".") + 1,
            "parameters_bytes": sum(_block(p.untyped_storage().nbytes()) for p in own),
            "gradients_bytes": sum(
                _block(p.untyped_storage().nbytes()) for p in own if p.requires_grad
            )
            if workload.training
            else 0,
            "optimizer_state_bytes": sum(opt_state.get(id(p), 0) for p in own),
            "buffers_bytes": sum(
                _block(b.untyped_storage().nbytes())
                for b in module._buffers.values()
                if b is not None
            ),
        }
        rows[row["name"]] = row
    return list(rows.values())


def _block(nbytes: int) -> int:
    return -(-max(nbytes, 1) // 512) * 512


def _explain_build_error(exc: WorkloadError, spec: str) -> VramscopeError:
    message = str(exc)
    if "Torch not compiled with CUDA" in message or "not linked with support for cuda" in message:
        return WorkloadError(f"{message}; the estimate emulates cuda:0 — pass device to .to()")
    if "meta" in message and "data" in message:
        return WorkloadError(
            f"{message}; the build reads tensor values, which an estimate does not have"
        )
    return exc


def _explain_step_error(exc: BaseException, spec: str, recorder: Recorder) -> VramscopeError:
    from vramscope.workload import _where

    where = _where(exc)
    phase = recorder.phase
    text = str(exc)
    if "Expected all tensors to be on the same device" in text or (
        "device" in text and "cpu" in text and "cuda" in text
    ):
        return WorkloadError(
            f"tracing {spec} failed in the {phase} phase of step {recorder.step}: {where}; "
            "the workload mixes devices — create every tensor with device=device (the device "
            "build() receives) rather than a fixed one"
        )
    return TraceError(
        f"tracing {spec} failed in the {phase} phase of step {recorder.step}: {where}"
    )
