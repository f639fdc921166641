"""NVML through nvidia-ml-py: device memory as nvidia-smi shows it, per device and per process.

Every NVML quirk is handled here: no driver, v2 memory info (which does not count the
driver's reserved memory as used), processes listed from another PID namespace, MIG and
devices where per-process memory is not available. Nothing here raises to the caller for
a missing driver: functions return ``None`` and ``unavailable_reason()`` says why.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import pynvml  # provided by the nvidia-ml-py package
except ImportError:  # pragma: no cover - a hard dependency, but never crash on it
    pynvml = None

# Every exception an NVML call can raise: NVMLError and its subclasses, and the
# NVMLLibraryMismatchError that unversioned wrappers raise (it is not an NVMLError) when
# nvidia-ml-py is newer than the driver's libnvidia-ml.
NVML_ERRORS: tuple[type[BaseException], ...] = (
    (pynvml.NVMLError, getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError))
    if pynvml is not None
    else ()
)

_lock = threading.Lock()
_state: dict[str, object] = {"initialized": False, "reason": None}
# what cannot change while the process runs: the driver's version, each device's handle
_driver_version: list[str] = []
_by_uuid: dict[str, NvmlDevice] = {}


def _init() -> bool:
    """Initialise NVML once per process; remember why it failed."""
    with _lock:
        if _state["initialized"]:
            return True
        if _state["reason"] is not None:
            return False
        if pynvml is None:
            _state["reason"] = "nvidia-ml-py is not installed"
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _state["reason"] = f"NVML is not available ({_describe(exc)}): no NVIDIA driver here"
            return False
        _state["initialized"] = True
        return True


def _new_lock_after_fork() -> None:
    """A child forked while NVML was starting on its thread (a DataLoader worker) must not
    inherit the lock that thread held: it starts NVML itself if it ever needs it."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def init_soon() -> None:
    """Start NVML on a thread of its own, once per process: its start can take tens of
    milliseconds, which a run that has not made its CUDA context yet need not wait for
    (whoever needs NVML first waits for it then, under the same lock)."""
    if _state["initialized"] or _state["reason"] is not None or pynvml is None:
        return
    threading.Thread(target=_init, name="vramscope-nvml-init", daemon=True).start()


def _describe(exc: BaseException) -> str:
    try:
        return str(exc) or exc.__class__.__name__
    except Exception:  # some NVMLError subclasses fail to format on old drivers
        return exc.__class__.__name__


def explain(exc: BaseException) -> str:
    """Why a reading is missing, in a phrase a user can act on."""
    if pynvml is None:
        return _describe(exc)
    if _is_missing_function(exc):
        return (
            f"not in this driver's NVML (nvidia-ml-py {binding_version() or '?'} is newer "
            "than the driver)"
        )
    if isinstance(exc, AttributeError):
        return f"not in nvidia-ml-py {binding_version() or '?'} (upgrade it)"
    if isinstance(exc, getattr(pynvml, "NVMLError_NotSupported", ())):
        return "not supported on this device"
    if isinstance(exc, getattr(pynvml, "NVMLError_NoPermission", ())):
        return "no permission to read it"
    if isinstance(exc, getattr(pynvml, "NVMLError_GpuIsLost", ())):
        return "the GPU is lost (fell off the bus); the driver needs a reset"
    return _describe(exc)


def binding_version() -> str | None:
    """The installed nvidia-ml-py version."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None


def _first(*calls: tuple[str, tuple[Any, ...]]) -> Any:
    """Call the first NVML function (by name) that this binding and driver both have.

    Newer functions come first; a function missing from the binding (AttributeError) or
    from the driver (FunctionNotFound, LibraryMismatch) falls through to the next. Any
    other NVML error is raised: the reading exists but failed.
    """
    missing: BaseException | None = None
    for name, args in calls:
        fn: Callable[..., Any] | None = getattr(pynvml, name, None)
        if fn is None:
            missing = missing or AttributeError(name)
            continue
        try:
            return fn(*args)
        except NVML_ERRORS as exc:
            if _is_missing_function(exc):
                missing = exc
                continue
            raise
    assert missing is not None
    raise missing


def _is_missing_function(exc: BaseException) -> bool:
    if pynvml is None:
        return False
    kinds = tuple(
        getattr(pynvml, name)
        for name in ("NVMLLibraryMismatchError", "NVMLError_FunctionNotFound")
        if hasattr(pynvml, name)
    )
    return isinstance(exc, kinds)


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here, or None when it can."""
    return None if _init() else str(_state["reason"])


def driver_version() -> str | None:
    if _driver_version:
        return _driver_version[0]
    if not _init():
        return None
    try:
        version = _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        return None
    _driver_version[:] = [version]
    return version


def cuda_driver_version() -> str | None:
    """The newest CUDA the driver supports, like ``"12.8"`` (nvidia-smi's "CUDA Version")."""
    if not _init():
        return None
    try:
        value = int(
            _first(
                ("nvmlSystemGetCudaDriverVersion_v2", ()), ("nvmlSystemGetCudaDriverVersion", ())
            )
        )
    except (*NVML_ERRORS, AttributeError):
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class DeviceMemory:
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int  # held by the driver; not in `used` with v2 memory info


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where the driver does not report it (MIG, WSL)


class NvmlDevice:
    """One GPU as NVML sees it."""

    def __init__(self, index: int, handle: object) -> None:
        self.index = index
        self._handle = handle
        self._v2 = hasattr(pynvml, "nvmlMemory_v2")

    @property
    def name(self) -> str:
        return _text(pynvml.nvmlDeviceGetName(self._handle))

    @property
    def uuid(self) -> str:
        return _text(pynvml.nvmlDeviceGetUUID(self._handle))

    def memory(self) -> DeviceMemory:
        if self._v2:
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(self._handle, version=pynvml.nvmlMemory_v2)
                return DeviceMemory(info.total, info.used, info.free, getattr(info, "reserved", 0))
            except pynvml.NVMLError:
                self._v2 = False  # driver older than the binding: fall back to v1
        info = pynvml.nvmlDeviceGetMemoryInfo(self._handle)
        return DeviceMemory(info.total, info.used, info.free, 0)

    def processes(self) -> list[GpuProcess]:
        """Compute and graphics processes with their device memory.

        The versioned calls are tried newest first, so a driver older than nvidia-ml-py
        still lists its processes; a list the driver cannot give is skipped.
        """
        found: dict[int, GpuProcess] = {}
        for kind in ("Compute", "Graphics"):
            base = f"nvmlDeviceGet{kind}RunningProcesses"
            try:
                entries = _first(
                    (f"{base}_v3", (self._handle,)),
                    (f"{base}_v2", (self._handle,)),
                    (base, (self._handle,)),
                )
            except (*NVML_ERRORS, AttributeError):
                continue
            for entry in entries:
                used = entry.usedGpuMemory
                if (
                    used is None
                    or used >= 2**63 - 1
                    or used == getattr(pynvml, "NVML_VALUE_NOT_AVAILABLE", -1)
                ):
                    used = None
                found.setdefault(entry.pid, GpuProcess(entry.pid, used))
        return list(found.values())

    def process_used_bytes(
        self, pid: int | None = None, procs: list[GpuProcess] | None = None
    ) -> int | None:
        """Device memory of one process (this one by default), as nvidia-smi shows it;
        ``procs``: the device's processes as just listed (else they are listed now).

        Inside a container NVML may list host PIDs. When exactly one process is listed,
        our PID is not among them, and that PID does not exist in our PID namespace (so it
        cannot be some other local process), it is taken to be us; set
        ``VRAMSCOPE_NVML_SINGLE_PROCESS=0`` to turn that off.
        """
        own = os.getpid() if pid is None else pid
        if procs is None:
            procs = self.processes()
        for proc in procs:
            if proc.pid == own:
                return proc.used_bytes
        if (
            pid is None
            and len(procs) == 1
            and os.environ.get("VRAMSCOPE_NVML_SINGLE_PROCESS") != "0"
            and not _pid_exists_here(procs[0].pid)
        ):
            return procs[0].used_bytes
        return None

    # Readings below raise an NVML error (or AttributeError for a binding too old) when
    # the device cannot give them; ``explain(exc)`` turns that into a reason.

    def memory_info_version(self) -> int:
        """2 when memory() reads NVML's v2 memory info, 1 after falling back to v1."""
        return 2 if self._v2 else 1

    def temperature_c(self) -> int:
        sensor = getattr(pynvml, "NVML_TEMPERATURE_GPU", 0)
        return int(
            _first(
                ("nvmlDeviceGetTemperatureV", (self._handle, sensor)),
                ("nvmlDeviceGetTemperature", (self._handle, sensor)),
            )
        )

    def power_draw_watts(self) -> float:
        return pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    def power_limit_watts(self) -> float:
        return (
            _first(
                ("nvmlDeviceGetEnforcedPowerLimit", (self._handle,)),
                ("nvmlDeviceGetPowerManagementLimit", (self._handle,)),
            )
            / 1000.0
        )

    def utilization_percent(self) -> tuple[int, int]:
        """(GPU, memory-controller) utilization over the driver's last sample period."""
        rates = pynvml.nvmlDeviceGetUtilizationRates(self._handle)
        return int(rates.gpu), int(rates.memory)

    def compute_capability(self) -> str:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(self._handle)
        return f"{major}.{minor}"

    def pci_bus_id(self) -> str:
        return _text(pynvml.nvmlDeviceGetPciInfo(self._handle).busId)

    def mig_enabled(self) -> bool:
        current, _pending = pynvml.nvmlDeviceGetMigMode(self._handle)
        return current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)

    def addressing_mode(self) -> str | None:
        """``"HMM"`` or ``"ATS"`` when the GPU can address host memory (ATS: Grace Hopper)."""
        mode = pynvml.nvmlDeviceGetAddressingMode(self._handle)
        return {
            getattr(pynvml, "NVML_DEVICE_ADDRESSING_MODE_HMM", 1): "HMM",
            getattr(pynvml, "NVML_DEVICE_ADDRESSING_MODE_ATS", 2): "ATS",
        }.get(mode)

    def mig_devices(self) -> list[NvmlDevice]:
        """The MIG instances of this GPU (empty when MIG is off); index is the slot."""
        found = []
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(self._handle))):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(self._handle, slot)
            except NVML_ERRORS:  # an empty slot
                continue
            found.append(NvmlDevice(slot, handle))
        return found


def _pid_exists_here(pid: int) -> bool:
    """Whether ``pid`` names a process in our PID namespace."""
    try:
        import psutil

        return psutil.pid_exists(pid)
    except Exception:
        return os.path.exists(f"/proc/{pid}")


def device_count() -> int:
    if not _init():
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0


def device(index: int) -> NvmlDevice | None:
    """The NVML device at NVML's own ``index`` (as nvidia-smi numbers them)."""
    if not _init():
        return None
    try:
        return NvmlDevice(index, pynvml.nvmlDeviceGetHandleByIndex(index))
    except pynvml.NVMLError:
        return None


def device_by_uuid(uuid: str) -> NvmlDevice | None:
    """The NVML device with this UUID (torch's device properties carry it)."""
    known = _by_uuid.get(uuid)
    if known is not None:
        return known
    if not _init():
        return None
    key = uuid
    if not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError:
        return None
    try:
        index = int(pynvml.nvmlDeviceGetIndex(handle))
    except pynvml.NVMLError:
        index = -1
    found = _by_uuid[key] = NvmlDevice(index, handle)
    return found
