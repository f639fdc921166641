"""NVML through nvidia-ml-py: device memory as nvidia-smi shows it, per device and per process.

Every NVML quirk is handled here: no driver, v2 memory info (which does not count the
driver's reserved memory as used), processes listed from another PID namespace, MIG and
devices where per-process memory is not available. Nothing here raises to the caller for
a missing driver: functions return ``None`` and ``unavailable_reason()`` says why.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

try:
    import pynvml  # provided by the nvidia-ml-py package
except ImportError:  # pragma: no cover - a hard dependency, but never crash on it
    pynvml = None

_lock = threading.Lock()
_state: dict[str, object] = {"initialized": False, "reason": None}


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


def _describe(exc: BaseException) -> str:
    try:
        return str(exc) or exc.__class__.__name__
    except Exception:  # some NVMLError subclasses fail to format on old drivers
        return exc.__class__.__name__


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here, or None when it can."""
    return None if _init() else str(_state["reason"])


def driver_version() -> str | None:
    if not _init():
        return None
    try:
        return _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        return None


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
        """Compute and graphics processes with their device memory."""
        found: dict[int, GpuProcess] = {}
        for query in (
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                entries = query(self._handle)
            except pynvml.NVMLError:
                continue
            for entry in entries:
                used = entry.usedGpuMemory
                if used is None or used >= 2**63 - 1 or used == getattr(
                    pynvml, "NVML_VALUE_NOT_AVAILABLE", -1
                ):
                    used = None
                found.setdefault(entry.pid, GpuProcess(entry.pid, used))
        return list(found.values())

    def process_used_bytes(self, pid: int | None = None) -> int | None:
        """Device memory of one process (this one by default), as nvidia-smi shows it.

        Inside a container NVML may list host PIDs; when exactly one process is listed
        and our PID is not among them, that one process is taken to be us only if the
        caller passes ``pid=None`` and ``VRAMSCOPE_NVML_SINGLE_PROCESS`` is not ``0``.
        """
        own = os.getpid() if pid is None else pid
        procs = self.processes()
        for proc in procs:
            if proc.pid == own:
                return proc.used_bytes
        if pid is None and len(procs) == 1 and os.environ.get("VRAMSCOPE_NVML_SINGLE_PROCESS") != "0":
            return procs[0].used_bytes
        return None


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
    if not _init():
        return None
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
    return NvmlDevice(index, handle)
