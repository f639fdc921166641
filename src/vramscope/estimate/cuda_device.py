"""The emulated CUDA device: ATen, autograd and ``torch.cuda`` behave as if the profiled GPU
were device 0, on a machine without one (and with the CPU build of torch).

* ATen is shown a CUDA device: a fake device guard (torch's own ``FakeGuardImpl<CUDA>``) is
  registered, and the answers of the CUDA hooks object that the autograd engine asks
  (``isBuilt``, ``hasPrimaryContext``, ...) are switched for the duration of the trace.
  Both are found by symbol in torch's shared libraries; everything is put back afterwards.
* ``torch.cuda`` answers as a device of the chosen profile would (``is_available``,
  ``get_device_capability``, ``memory_allocated`` from the trace, ...).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import struct
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._mode_utils import no_dispatch

from vramscope.estimate.profiles import GpuProfile
from vramscope.estimate.recorder import Recorder, TraceError

CUDA = torch.device("cuda", 0)


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


def _device_generator(generator: type) -> type:
    """``torch.Generator(device="cuda")``, which would start CUDA: a generator of the host's
    that says it is the device's (a fake tensor's random values are never drawn from it;
    the few the trace computes for real are the host's)."""

    class Generator(generator):  # type: ignore[misc,valid-type]
        def __new__(cls, device: Any = "cpu") -> Any:
            where = torch.device(device)
            made = generator.__new__(cls, "cpu" if where.type == "cuda" else device)
            if where.type == "cuda":
                made._vramscope_device = torch.device("cuda", where.index or 0)
            return made

        def __init__(self, device: Any = "cpu") -> None:
            return None

        @property
        def device(self) -> torch.device:
            return getattr(self, "_vramscope_device", None) or generator.device.__get__(self)

    Generator.__name__ = Generator.__qualname__ = "Generator"
    return Generator


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
        has_gpu = torch.cuda.is_available()  # before it answers as the profile
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

        streams = _Streams(rec)
        _Stream = streams.Stream

        class _Event:
            """Events order streams on a GPU; allocations here never wait for them."""

            def __init__(self, *_: Any, **__: Any) -> None:
                return None

            def record(self, *_: Any) -> _Event:
                return self

            def wait(self, *_: Any) -> None:
                return None

            def synchronize(self) -> None:
                return None

            def query(self) -> bool:
                return True

            def elapsed_time(self, *_: Any) -> float:
                return 0.0

        default_stream = streams.default

        def memory_stats(*_: Any, **__: Any) -> dict[str, int]:
            """What the trace has allocated, under the allocator's names for all pools."""
            stats = {}
            for kind in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
                stats[f"{kind}.all.current"] = rec.allocated_bytes
                stats[f"{kind}.all.peak"] = rec.peak_allocated_bytes
            return {**stats, "num_alloc_retries": 0, "num_ooms": 0}

        def memory_summary(*_: Any, **__: Any) -> str:
            mib = 2**20
            return (
                f"vramscope estimate on {p.display_name}: {rec.allocated_bytes / mib:.1f} MiB "
                f"allocated, {rec.peak_allocated_bytes / mib:.1f} MiB at the highest so far "
                "(the caching allocator's tables exist on a GPU only)"
            )

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
            "memory_stats": memory_stats,
            "memory_summary": memory_summary,
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
            "current_stream": lambda *a, **k: streams.current,
            "default_stream": lambda *a, **k: default_stream,
            "set_stream": streams.set,
            "stream": streams.use,
            "Stream": _Stream,
            "Event": _Event,
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
        if hasattr(cuda, "memory"):  # (torch.cuda.memory.memory_summary, as imported there)
            for name in ("memory_stats", "memory_summary"):
                self._set(cuda.memory, name, values[name])
        self._set(torch, "Generator", _device_generator(torch.Generator))
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
        # a fake CUDA tensor first makes a real one to start the CUDA context (torch 2.11
        # does so even under a mode that asks to avoid it): without a GPU there is none
        fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")
        if not has_gpu and hasattr(fake_tensor, "init_gpu_context"):
            self._set(fake_tensor, "init_gpu_context", lambda *a, **k: None)
        # which memory format a convolution's output takes: cuDNN's suggestion on a GPU
        # (channels-last in, channels-last out); a build without cuDNN answers contiguous
        determine = getattr(torch._C, "_conv_determine_backend_memory_format", None)
        if determine is not None and not torch.backends.cudnn.is_available():

            def determine_memory_format(input: Any, weight: Any, backend: Any) -> Any:
                if getattr(input, "fake_device", None) == CUDA:
                    return cudnn_conv_memory_format(input, weight)
                return determine(input, weight, backend)

            self._set(torch._C, "_conv_determine_backend_memory_format", determine_memory_format)
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


class _Streams:
    """CUDA streams of the emulated device: the default stream (0) and every stream the
    workload makes (1, 2, ...). The current one is the stream the recorder gives each
    allocation, as the caching allocator keeps a pool per stream: a block freed on one
    stream is reused by that stream alone (FSDP's all-gather and reduce-scatter streams)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.count = 0
        streams = self

        class Stream:
            def __init__(self, *_: Any, **__: Any) -> None:
                self.stream_id = streams.count
                streams.count += 1
                self.device = CUDA
                self.cuda_stream = self.stream_id
                self.device_index = 0
                self.device_type = 1

            def __enter__(self) -> Stream:
                self._previous = streams.current
                streams.set(self)
                return self

            def __exit__(self, *_: Any) -> None:
                streams.set(self._previous)

            def synchronize(self) -> None:
                return None

            def wait_stream(self, *_: Any) -> None:
                return None

            def wait_event(self, *_: Any) -> None:
                return None

            def record_event(self, *_: Any) -> Any:
                return SimpleNamespace(
                    synchronize=lambda: None, wait=lambda *a: None, query=lambda: True
                )

            def query(self) -> bool:
                return True

            def __eq__(self, other: object) -> bool:
                return self is other

            def __hash__(self) -> int:
                return self.stream_id

        self.Stream = Stream
        self.default = Stream()
        self.current = self.default

    def set(self, stream: Any) -> None:
        if stream is None:
            return
        self.current = stream
        self.recorder.stream = getattr(stream, "stream_id", 0)

    @contextlib.contextmanager
    def use(self, stream: Any = None) -> Iterator[Any]:
        """``torch.cuda.stream(s)``: ``s`` is the current stream inside (None: unchanged)."""
        previous = self.current
        self.set(stream)
        try:
            yield stream
        finally:
            self.set(previous)


def cudnn_conv_memory_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """``cudnn_conv_suggest_memory_format`` (ATen/native/ConvUtils.h): channels-last when the
    input or the weight is, for 4-D and 5-D convolutions, never for float64."""
    from torch._prims_common import suggest_memory_format

    if torch.float64 in (input.dtype, weight.dtype):
        return torch.contiguous_format
    formats = (suggest_memory_format(input), suggest_memory_format(weight))
    if weight.dim() == 4 and torch.channels_last in formats:
        return torch.channels_last
    if weight.dim() == 5 and torch.channels_last_3d in formats:
        return torch.channels_last_3d
    return torch.contiguous_format


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
