"""The device view as plain data: GPUs, their processes, host memory, allocator settings.

This is the library under ``vramscope info`` and ``vramscope watch``, usable alone::

    import vramscope.devices as vd

    for gpu in vd.devices():
        print(gpu.index, gpu.name, gpu.used_bytes, [p.pid for p in gpu.processes])
    print(vd.host().available_bytes)

Every reading that cannot be taken is ``None`` and the reason is kept in the object's
``not_available`` mapping (reading name → why), so a renderer can say "not available:
<reason>" instead of guessing. Nothing here imports torch at import time; ``system_info``
imports it inside the call when asked for versions, and ``probe_context`` runs torch in a
child process so the caller never holds a CUDA context.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from vramscope.errors import VramscopeError
from vramscope.sources import nvml

SCHEMA = "vramscope.devices/1"


# --------------------------------------------------------------------------- data


@dataclass
class ProcessInfo:
    """One process that holds memory on a GPU, as NVML lists it."""

    pid: int
    device_memory_bytes: int | None  # as nvidia-smi shows it; None where NVML cannot say
    user: str | None = None
    command: str | None = None
    host_rss_bytes: int | None = None
    note: str | None = None  # why user/command/memory are missing
    tracked: dict[str, Any] | None = None  # its status when `vramscope run` tracks it


@dataclass
class MigInstance:
    """One MIG slice of a GPU, with its own memory."""

    index: int
    uuid: str | None = None
    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None


@dataclass
class DeviceInfo:
    """One GPU: memory, temperature, power, utilization and the processes on it."""

    index: int  # NVML's index, as nvidia-smi numbers the GPUs
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    total_bytes: int | None = None
    used_bytes: int | None = None  # v2 memory info: excludes what the driver reserves
    free_bytes: int | None = None
    reserved_bytes: int | None = None  # held by the driver, counted in neither used nor free
    memory_info_version: int | None = None  # 2, or 1 on a driver older than the binding
    temperature_c: int | None = None
    power_draw_watts: float | None = None
    power_limit_watts: float | None = None
    utilization_gpu_percent: int | None = None
    utilization_memory_percent: int | None = None
    mig_enabled: bool | None = None
    addressing_mode: str | None = None  # "HMM"/"ATS": the GPU can address host memory
    processes: list[ProcessInfo] = field(default_factory=list)
    mig_instances: list[MigInstance] = field(default_factory=list)
    not_available: dict[str, str] = field(default_factory=dict)  # reading → why

    @property
    def used_fraction(self) -> float | None:
        if not self.total_bytes or self.used_bytes is None:
            return None
        return self.used_bytes / self.total_bytes

    @property
    def process_memory_bytes(self) -> int | None:
        """Device memory of all listed processes, where NVML reports it for each."""
        values = [p.device_memory_bytes for p in self.processes]
        if not values or any(v is None for v in values):
            return None
        return sum(values)  # type: ignore[arg-type]


@dataclass
class HostInfo:
    """The machine's memory, and the container's limit where one applies."""

    total_bytes: int
    available_bytes: int
    used_bytes: int
    swap_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    cgroup_limit_bytes: int | None = None  # memory.max of this process's cgroup, if set
    cgroup_used_bytes: int | None = None

    @property
    def used_fraction(self) -> float:
        return (self.total_bytes - self.available_bytes) / self.total_bytes


@dataclass
class AllocatorConfig:
    """The caching-allocator settings torch will read from the environment."""

    variable: str | None  # the variable in effect, None when none is set
    value: str | None
    options: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)  # set, but not read by this torch
    notes: list[str] = field(default_factory=list)


@dataclass
class ProbeStage:
    """Memory after one step of bringing CUDA up in the probe's child process."""

    name: str
    process_used_bytes: int | None  # NVML: the child process
    device_used_bytes: int | None  # NVML: the whole device (other processes included)
    reserved_bytes: int | None  # torch: the caching allocator
    allocated_bytes: int | None


@dataclass
class ProbeResult:
    """What a CUDA context and the math libraries cost on this machine."""

    available: bool
    reason: str | None = None  # why the probe could not run
    device_index: int | None = None
    device_name: str | None = None
    torch_version: str | None = None
    method: str | None = None  # "process" (NVML per-process) or "device" (device-wide delta)
    context_bytes: int | None = None  # device memory outside the allocator after the first alloc
    libraries_bytes: int | None = None  # added outside the allocator by the first cuBLAS matmul
    stages: list[ProbeStage] = field(default_factory=list)


@dataclass
class SystemInfo:
    """Everything ``vramscope info`` shows: one value to render, save and load."""

    taken_at: float
    hostname: str
    nvml_unavailable_reason: str | None  # None when NVML works
    versions: dict[str, str | None]
    devices: list[DeviceInfo]
    host: HostInfo
    allocator: AllocatorConfig
    tracked: list[dict[str, Any]] = field(default_factory=list)  # status of tracked runs
    tracked_problem: str | None = None  # why tracked runs cannot be shown
    probe: ProbeResult | None = None
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SystemInfo:
        if not str(data.get("schema", "")).startswith("vramscope.devices/"):
            raise VramscopeError(
                f"not a vramscope device view (schema {data.get('schema')!r}); "
                "write one with 'vramscope info --json PATH'"
            )
        fields = _known(cls, data)
        fields["devices"] = [_device_from_dict(d) for d in data.get("devices", [])]
        fields["host"] = HostInfo(**_known(HostInfo, data["host"]))
        fields["allocator"] = AllocatorConfig(**_known(AllocatorConfig, data["allocator"]))
        if data.get("probe") is not None:
            probe = _known(ProbeResult, data["probe"])
            probe["stages"] = [ProbeStage(**_known(ProbeStage, s)) for s in probe.get("stages", [])]
            fields["probe"] = ProbeResult(**probe)
        return cls(**fields)

    @classmethod
    def load(cls, path: str | Path) -> SystemInfo:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise VramscopeError(f"cannot read {path}: {exc}") from None
        return cls.from_dict(data)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``cls`` has: a newer file's extra keys are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _device_from_dict(data: dict[str, Any]) -> DeviceInfo:
    fields = _known(DeviceInfo, data)
    fields["processes"] = [ProcessInfo(**_known(ProcessInfo, p)) for p in data.get("processes", [])]
    fields["mig_instances"] = [
        MigInstance(**_known(MigInstance, m)) for m in data.get("mig_instances", [])
    ]
    return DeviceInfo(**fields)


# --------------------------------------------------------------------------- devices


def device_count() -> int:
    """How many GPUs NVML sees (0 without a driver)."""
    return nvml.device_count()


def devices(index: int | None = None) -> list[DeviceInfo]:
    """Every GPU NVML sees (or only ``index``), read now; empty without a driver."""
    if index is not None:
        return [device(index)]
    return [_read_device(nvml.device(i), i) for i in range(nvml.device_count())]


def device(index: int) -> DeviceInfo:
    """One GPU by NVML's index; raises VramscopeError when there is no such GPU."""
    count = nvml.device_count()
    if not 0 <= index < count:
        reason = nvml.unavailable_reason()
        if reason is not None:
            raise VramscopeError(f"there is no GPU {index}: {reason}")
        have = "no NVIDIA GPU" if count == 0 else f"GPUs 0 to {count - 1}"
        raise VramscopeError(f"there is no GPU {index}; this machine has {have}")
    return _read_device(nvml.device(index), index)


def _read_device(handle: nvml.NvmlDevice | None, index: int) -> DeviceInfo:
    if handle is None:
        return DeviceInfo(index, "unknown", not_available={"device": "NVML gave no handle"})
    missing: dict[str, str] = {}

    def read(what: str, fn: Any, default: Any = None) -> Any:
        try:
            return fn()
        except (*nvml.NVML_ERRORS, AttributeError) as exc:
            missing[what] = nvml.explain(exc)
            return default

    info = DeviceInfo(index=index, name=read("name", lambda: handle.name, "unknown GPU"))
    info.uuid = read("uuid", lambda: handle.uuid)
    info.pci_bus_id = read("pci_bus_id", handle.pci_bus_id)
    info.compute_capability = read("compute_capability", handle.compute_capability)
    memory = read("memory", handle.memory)
    if memory is not None:
        info.total_bytes = memory.total_bytes
        info.used_bytes = memory.used_bytes
        info.free_bytes = memory.free_bytes
        info.memory_info_version = handle.memory_info_version()
        if info.memory_info_version == 2:
            info.reserved_bytes = memory.reserved_bytes
    info.temperature_c = read("temperature", handle.temperature_c)
    info.power_draw_watts = read("power_draw", handle.power_draw_watts)
    info.power_limit_watts = read("power_limit", handle.power_limit_watts)
    rates = read("utilization", handle.utilization_percent)
    if rates is not None:
        info.utilization_gpu_percent, info.utilization_memory_percent = rates
    info.mig_enabled = read("mig", handle.mig_enabled)
    missing.pop("mig", None)  # most GPUs have no MIG: nothing worth saying
    # not every driver has addressing modes; only a unified-memory answer is worth showing
    info.addressing_mode = read("addressing_mode", handle.addressing_mode)
    missing.pop("addressing_mode", None)
    slices: list[nvml.NvmlDevice] = []
    if info.mig_enabled:
        slices = read("mig_instances", handle.mig_devices, [])
        info.mig_instances = [_read_mig(mig) for mig in slices]
    info.processes = _read_processes(handle, slices)
    if info.processes and all(p.device_memory_bytes is None for p in info.processes):
        missing["process_memory"] = _why_no_process_memory(info)
    if memory is None and info.addressing_mode is not None:
        missing["memory"] += f" (unified memory, {info.addressing_mode}: see host memory)"
    info.not_available = missing
    return info


def _why_no_process_memory(info: DeviceInfo) -> str:
    if info.mig_enabled:
        return "MIG is enabled: the driver reports memory per MIG instance, not per process"
    if info.addressing_mode is not None and info.total_bytes is None:
        return f"unified memory ({info.addressing_mode}): the driver does not split it by process"
    if sys.platform == "win32" or "microsoft" in platform.release().lower():
        return "the Windows display driver (WDDM/WSL) does not report it"
    return "the driver does not report it for these processes"


def _read_mig(mig: nvml.NvmlDevice) -> MigInstance:
    instance = MigInstance(index=mig.index)
    try:
        instance.uuid = mig.uuid
        memory = mig.memory()
    except (*nvml.NVML_ERRORS, AttributeError):
        return instance
    instance.total_bytes = memory.total_bytes
    instance.used_bytes = memory.used_bytes
    instance.free_bytes = memory.free_bytes
    return instance


def _read_processes(
    handle: nvml.NvmlDevice, slices: list[nvml.NvmlDevice] | None = None
) -> list[ProcessInfo]:
    """NVML's processes (of the GPU and its MIG slices), with user and command from psutil.

    NVML lists PIDs as the host sees them. A PID psutil cannot find either ended between
    the two reads (dropped) or lives in another PID namespace, as when this runs in a
    container (kept, with a note). Re-reading NVML tells the two apart.
    """
    listed = _listed_processes(handle, slices or [])
    rows: list[ProcessInfo] = []
    unseen: list[ProcessInfo] = []
    for proc in listed:
        row = ProcessInfo(pid=proc.pid, device_memory_bytes=proc.used_bytes)
        try:
            ps = psutil.Process(proc.pid)
            with ps.oneshot():
                row.command = _command(ps)
                row.host_rss_bytes = _quiet(lambda ps=ps: ps.memory_info().rss)
                row.user = _quiet(ps.username)
        except psutil.NoSuchProcess:
            unseen.append(row)
            continue
        except psutil.AccessDenied:
            row.note = "no permission to read this process"
        rows.append(row)
    if unseen:
        still_listed = {p.pid for p in _listed_processes(handle, slices or [])}
        for row in unseen:
            if row.pid in still_listed:
                row.note = (
                    "PID from another PID namespace (NVML reports host PIDs, e.g. in a "
                    "container): user and command not available"
                )
                rows.append(row)
    rows.sort(key=lambda r: (-(r.device_memory_bytes or 0), r.pid))
    return rows


def _listed_processes(
    handle: nvml.NvmlDevice, slices: list[nvml.NvmlDevice]
) -> list[nvml.GpuProcess]:
    """One entry per PID; with MIG, a slice's own reading wins when it has the memory."""
    found = {p.pid: p for p in handle.processes()}
    for mig in slices:
        for proc in mig.processes():
            if found.get(proc.pid) is None or found[proc.pid].used_bytes is None:
                found[proc.pid] = proc
    return list(found.values())


def _command(ps: psutil.Process) -> str | None:
    try:
        argv = ps.cmdline()
    except psutil.AccessDenied:
        argv = []
    if argv:
        return " ".join(argv)
    try:
        return f"[{ps.name()}]"
    except psutil.AccessDenied:
        return None


def _quiet(fn: Any) -> Any:
    try:
        return fn()
    except psutil.AccessDenied:
        return None


# --------------------------------------------------------------------------- host


def host() -> HostInfo:
    """The machine's memory and swap, and the container's memory limit when there is one."""
    vm = psutil.virtual_memory()
    info = HostInfo(total_bytes=vm.total, available_bytes=vm.available, used_bytes=vm.used)
    try:
        swap = psutil.swap_memory()
        info.swap_total_bytes, info.swap_used_bytes = swap.total, swap.used
    except (OSError, RuntimeError):
        pass
    info.cgroup_limit_bytes, info.cgroup_used_bytes = _cgroup_memory()
    if info.cgroup_limit_bytes is not None and info.cgroup_limit_bytes >= vm.total:
        info.cgroup_limit_bytes = None  # "limited" to more than the machine has: no limit
    return info


def _cgroup_memory() -> tuple[int | None, int | None]:
    """memory.max and memory.current of this process's cgroup (v2), if readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        if line.startswith("0::"):
            base = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            try:
                limit_text = (base / "memory.max").read_text().strip()
                used_text = (base / "memory.current").read_text().strip()
            except OSError:
                return None, None
            limit = None if limit_text == "max" else int(limit_text)
            return limit, int(used_text)
    return None, None


# --------------------------------------------------------------------------- allocator

# what each PYTORCH_ALLOC_CONF option does, in a line
ALLOCATOR_OPTIONS = {
    "backend": "native (caching allocator) or cudaMallocAsync (the driver's pool)",
    "expandable_segments": "segments grow in place when True, which cuts fragmentation",
    "max_split_size_mb": "blocks larger than this are never split (limits fragmentation)",
    "max_non_split_rounding_mb": "how much larger an unsplit cached block may be than asked",
    "roundup_power2_divisions": "sizes round up to this many steps per power of two",
    "garbage_collection_threshold": "frees cached blocks when reserved passes this fraction",
    "release_lock_on_cudamalloc": "drops the allocator lock around cudaMalloc",
    "pinned_use_cuda_host_register": "pinned host memory via cudaHostRegister",
    "pinned_num_register_threads": "threads that register pinned host memory",
    "pinned_use_background_threads": "pinned host memory is processed off the main thread",
    "per_process_memory_fraction": "caps reserved memory at this fraction of the device",
    "graph_capture_record_stream_reuse": "reuses blocks across streams during graph capture",
}


def allocator_config(
    environ: dict[str, str] | None = None, torch_version: str | None = None
) -> AllocatorConfig:
    """Which allocator settings torch reads from ``environ``, parsed and explained.

    torch 2.9 and newer read ``PYTORCH_ALLOC_CONF`` first and fall back to the deprecated
    ``PYTORCH_CUDA_ALLOC_CONF``; older torch reads only ``PYTORCH_CUDA_ALLOC_CONF``. A
    variable that is set but empty still wins (torch checks that it is set, not its value).
    """
    env = os.environ if environ is None else environ
    new_name, old_name = "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"
    reads_new = _torch_reads_alloc_conf(torch_version)
    order = [new_name, old_name] if reads_new else [old_name]
    config = AllocatorConfig(variable=None, value=None)
    for name in order:
        if name in env:
            config.variable, config.value = name, env[name]
            break
    for name in (new_name, old_name, "PYTORCH_HIP_ALLOC_CONF"):
        if name in env and name != config.variable and name != "PYTORCH_HIP_ALLOC_CONF":
            config.ignored[name] = env[name]
    if config.variable is None:
        config.notes.append("not set: torch uses its defaults (native caching allocator)")
        return config
    if config.variable == old_name and reads_new:
        config.notes.append(f"{old_name} is deprecated in this torch; rename it to {new_name}")
    for name in config.ignored:
        config.notes.append(f"{name} is set but ignored: {config.variable} takes precedence")
    for part in (config.value or "").split(","):
        if not part.strip():
            continue
        key, _, value = part.partition(":")
        key = key.strip()
        config.options[key] = value.strip()
        if key not in ALLOCATOR_OPTIONS:
            config.notes.append(f"{key}: not an option vramscope knows; check its spelling")
    return config


def _torch_reads_alloc_conf(version: str | None) -> bool:
    """Whether this torch reads PYTORCH_ALLOC_CONF (2.9 and newer); unknown → newest."""
    if version is None:
        version = _installed_torch_version()
    if version is None:
        return True
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (2, 9)


def _installed_torch_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- versions


def versions(include_torch: bool = True) -> dict[str, str | None]:
    """Driver, CUDA, NVML binding, Python and (imported here, on demand) torch versions."""
    found: dict[str, str | None] = {
        "driver": nvml.driver_version(),
        "cuda_driver": nvml.cuda_driver_version(),
        "nvidia_ml_py": nvml.binding_version(),
        "python": platform.python_version(),
        "torch": _installed_torch_version(),
    }
    if include_torch:
        try:
            import torch  # imported here: `vramscope info` must start without it

            found["torch"] = torch.__version__
            found["torch_cuda"] = torch.version.cuda
            found["cudnn"] = _cudnn_version(torch)
        except ImportError:
            found["torch"] = None
        except Exception as exc:  # a broken install (missing CUDA libraries) must not stop info
            found["torch"] = f"{found['torch'] or '?'} (cannot import: {exc})"
    return found


def _cudnn_version(torch: Any) -> str | None:
    try:
        value = torch.backends.cudnn.version()
    except Exception:  # no cuDNN in a CPU build, or a library that fails to load
        return None
    if not value:
        return None
    major, rest = divmod(int(value), 10000) if value >= 10000 else divmod(int(value), 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


# --------------------------------------------------------------------------- whole view


def system_info(
    *,
    index: int | None = None,
    include_torch: bool = True,
    include_tracked: bool = True,
    probe: bool = False,
) -> SystemInfo:
    """The whole device view, read now; ``index`` limits it to one GPU (checked)."""
    found_devices = devices(index)
    found_versions = versions(include_torch=include_torch)
    info = SystemInfo(
        taken_at=time.time(),
        hostname=platform.node(),
        nvml_unavailable_reason=nvml.unavailable_reason(),
        versions=found_versions,
        devices=found_devices,
        host=host(),
        allocator=allocator_config(torch_version=found_versions.get("torch")),
    )
    if include_tracked:
        attach_tracked(info)
    if probe:
        info.probe = probe_context(index or 0)
    return info


def attach_tracked(info: SystemInfo) -> None:
    """Read the status of runs tracked by ``vramscope run`` and join them to GPU processes."""
    from vramscope.tracking import status

    info.tracked = status.read_statuses()
    info.tracked_problem = status.status_dir_problem()
    by_pid = {s["pid"]: s for s in info.tracked}
    for gpu in info.devices:
        for proc in gpu.processes:
            proc.tracked = by_pid.get(proc.pid)


# --------------------------------------------------------------------------- probe


def probe_context(index: int = 0, timeout: float = 180.0) -> ProbeResult:
    """Measure what a CUDA context and cuBLAS cost on GPU ``index``, in a child process.

    The child imports torch, brings CUDA up step by step and reports NVML's view of its own
    memory against torch's reserved bytes after each step; the caller never touches CUDA.
    """
    code = f"from vramscope.devices import _probe_in_child; _probe_in_child({int(index)})"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"the probe did not finish within {timeout:.0f} s")
    except OSError as exc:
        return ProbeResult(False, f"cannot start the probe: {exc}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = done.stderr.strip().splitlines()
        last = errors[-1] if errors else f"exit code {done.returncode}"
        return ProbeResult(False, f"the probe failed: {last}")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return ProbeResult(False, f"the probe printed something unexpected: {lines[-1][:200]}")
    data = _known(ProbeResult, data)
    data["stages"] = [ProbeStage(**_known(ProbeStage, s)) for s in data.get("stages", [])]
    return ProbeResult(**data)


def _probe_in_child(index: int) -> None:
    """Runs in the probe's child process; prints one JSON line."""
    result = _probe_steps(index)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


def _probe_steps(index: int) -> ProbeResult:
    try:
        import torch
    except ImportError:
        return ProbeResult(False, "torch is not installed")
    result = ProbeResult(False, torch_version=torch.__version__, device_index=index)
    if torch.version.cuda is None:
        result.reason = (
            f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
            "install a CUDA build of torch to probe"
        )
        return result
    if not torch.cuda.is_available():
        why = nvml.unavailable_reason() or "torch.cuda.is_available() is False"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            why += f" (CUDA_VISIBLE_DEVICES={visible!r})"
        result.reason = f"CUDA is not available to torch: {why}"
        return result
    gpu = nvml.device(index)
    if gpu is None:
        result.reason = f"NVML has no GPU {index}: {nvml.unavailable_reason() or 'no such index'}"
        return result
    result.device_name = gpu.name
    pids_before = {p.pid for p in gpu.processes()}
    own = {"pid": os.getpid()}

    def stage(name: str, has_context: bool) -> None:
        procs = {p.pid: p.used_bytes for p in gpu.processes()}
        if own["pid"] not in procs:
            # in a container NVML lists host PIDs: ours is the one that appeared
            new = [pid for pid in procs if pid not in pids_before]
            if len(new) == 1:
                own["pid"] = new[0]
        # not listed: nothing on the device yet, or (after the context) a PID we cannot match
        process_used = procs.get(own["pid"], None if has_context else 0)
        try:
            device_used = gpu.memory().used_bytes
        except nvml.NVML_ERRORS:
            device_used = None
        ready = torch.cuda.is_initialized()
        result.stages.append(
            ProbeStage(
                name,
                process_used,
                device_used,
                torch.cuda.memory_reserved(cuda) if ready else 0,
                torch.cuda.memory_allocated(cuda) if ready else 0,
            )
        )

    cuda = None
    stage("before CUDA", has_context=False)
    torch.cuda.init()
    cuda = _torch_device_for(torch, gpu.uuid)
    if cuda is None:
        result.reason = f"GPU {index} ({gpu.uuid}) is not visible to torch (CUDA_VISIBLE_DEVICES?)"
        return result
    stage("torch.cuda.init()", has_context=False)
    torch.cuda.set_device(cuda)
    torch.zeros(1, device=cuda)
    torch.cuda.synchronize(cuda)
    stage("first tensor (CUDA context)", has_context=True)
    a = torch.randn(256, 256, device=cuda)
    (a @ a).sum().item()
    torch.cuda.synchronize(cuda)
    stage("256x256 matmul (cuBLAS)", has_context=True)
    result.available = True
    before, _init_stage, context, matmul = result.stages
    if context.process_used_bytes is not None and matmul.process_used_bytes is not None:
        result.method = "process"
        context_used, matmul_used = context.process_used_bytes, matmul.process_used_bytes
    elif before.device_used_bytes is not None and matmul.device_used_bytes is not None:
        result.method = "device"  # other processes' changes leak into this
        context_used = (context.device_used_bytes or 0) - before.device_used_bytes
        matmul_used = matmul.device_used_bytes - before.device_used_bytes
    else:
        result.reason = "NVML reported neither this process's memory nor the device's"
        return result
    result.context_bytes = context_used - (context.reserved_bytes or 0)
    result.libraries_bytes = (matmul_used - (matmul.reserved_bytes or 0)) - result.context_bytes
    return result


def _torch_device_for(torch: Any, uuid: str) -> Any:
    """The torch device whose UUID is ``uuid``: indices differ under CUDA_VISIBLE_DEVICES."""
    want = uuid.lower().removeprefix("gpu-").removeprefix("mig-")
    for i in range(torch.cuda.device_count()):
        have = str(getattr(torch.cuda.get_device_properties(i), "uuid", "")).lower()
        if have.removeprefix("gpu-").removeprefix("mig-") == want:
            return torch.device("cuda", i)
    return None


# --------------------------------------------------------------------------- module


class _CallableModule(types.ModuleType):
    """Makes ``vramscope.devices()`` list the GPUs although ``vramscope.devices`` is this module.

    A package attribute and a submodule of the same name shadow each other depending on
    import order; a callable module is both, whichever import came first.
    """

    def __call__(self, index: int | None = None) -> list[DeviceInfo]:
        return devices(index)


sys.modules[__name__].__class__ = _CallableModule
