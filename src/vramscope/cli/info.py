"""``vramscope info``: what nvidia-smi shows, explained, plus versions, allocator and host.

The renderers here take a ``SystemInfo`` (plain data) and return rich renderables; they
know nothing of NVML or torch, so a saved ``--json`` file renders the same as a live read.
``watch`` reuses them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from vramscope.devices import DeviceInfo, HostInfo, ProbeResult, SystemInfo, system_info
from vramscope.errors import VramscopeError
from vramscope.report.widths import fitting
from vramscope.units import format_bytes

BAR_FULL, BAR_EMPTY = "█", "░"


# --------------------------------------------------------------------------- pieces


def percent(part: int | float | None, whole: int | float | None) -> str:
    if part is None or not whole:
        return "n/a"
    return f"{100 * part / whole:.0f}%"


def bar(fraction: float | None, width: int = 20) -> Text:
    """A memory bar, coloured by how full it is."""
    if fraction is None:
        return Text(BAR_EMPTY * width, style="dim")
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    style = "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"
    return Text(BAR_FULL * filled, style=style) + Text(BAR_EMPTY * (width - filled), style="dim")


def fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def versions_line(info: SystemInfo) -> Text:
    v = info.versions
    parts = [
        f"driver {v.get('driver') or 'n/a'}",
        f"CUDA (driver) {v.get('cuda_driver') or 'n/a'}",
        f"nvidia-ml-py {v.get('nvidia_ml_py') or 'not installed'}",
    ]
    if v.get("torch"):
        built = v.get("torch_cuda")
        torch_part = f"torch {v['torch']}"
        if "torch_cuda" in v:
            torch_part += f" (CUDA {built})" if built else " (CPU-only build)"
        if v.get("cudnn"):
            torch_part = torch_part[:-1] + f", cuDNN {v['cudnn']})"
        parts.append(torch_part)
    else:
        parts.append("torch not installed")
    parts.append(f"Python {v.get('python') or 'n/a'}")
    return Text(" · ".join(parts))


def memory_line(gpu: DeviceInfo, width: int = 20) -> Text:
    if gpu.total_bytes is None:
        reason = gpu.not_available.get("memory", "not reported")
        return Text(f"memory not available: {reason}", style="yellow")
    line = bar(gpu.used_fraction, width) + Text(
        f" {format_bytes(gpu.used_bytes)} used of {format_bytes(gpu.total_bytes)}"
        f" ({percent(gpu.used_bytes, gpu.total_bytes)}) · {format_bytes(gpu.free_bytes)} free"
    )
    return line


def reserve_note(gpu: DeviceInfo) -> Text | None:
    if gpu.memory_info_version == 1:
        return Text(
            "memory info v1 (the driver is older than nvidia-ml-py): "
            "used includes what the driver reserves",
            style="dim",
        )
    if gpu.reserved_bytes:
        return Text(
            f"{format_bytes(gpu.reserved_bytes)} reserved by the driver counts as neither used "
            "nor free (NVML v2 memory info; older nvidia-smi counted it as used)",
            style="dim",
        )
    return None


def sensors_line(gpu: DeviceInfo) -> Text:
    power = f"power {fmt(gpu.power_draw_watts, ' W')}"
    if gpu.power_limit_watts is not None:
        power += f" of {fmt(gpu.power_limit_watts, ' W')}"
    return Text(
        f"temperature {fmt(gpu.temperature_c, ' °C')} · {power} · utilization "
        f"GPU {fmt(gpu.utilization_gpu_percent, '%')}, "
        f"memory {fmt(gpu.utilization_memory_percent, '%')}"
    )


def device_title(gpu: DeviceInfo) -> str:
    parts = [f"GPU {gpu.index}", gpu.name]
    if gpu.compute_capability:
        parts.append(f"compute {gpu.compute_capability}")
    if gpu.mig_enabled:
        parts.append("MIG on")
    if gpu.addressing_mode:
        parts.append(f"{gpu.addressing_mode} addressing")
    if gpu.pci_bus_id:
        parts.append(gpu.pci_bus_id)
    return " · ".join(parts)


def tracked_cells(status: dict[str, Any] | None) -> list[str]:
    """Phase, step, epoch and allocated/reserved of a tracked run, or blanks."""
    if not status:
        return ["", "", "", ""]
    split = (
        f"{format_bytes(status.get('allocated_bytes'))} / "
        f"{format_bytes(status.get('reserved_bytes'))}"
    )
    return [
        str(status.get("phase") or "-"),
        fmt(status.get("step"), "") if status.get("step") is not None else "-",
        fmt(status.get("epoch"), "") if status.get("epoch") is not None else "-",
        split,
    ]


def process_table(
    gpu: DeviceInfo, command_width: int | None = None, cut_commands: bool = True
) -> Table:
    """One row per process on the GPU; tracked processes also show phase, step, memory split.

    ``cut_commands``: a long command is cut to the space left (a live view); else wrapped."""
    any_tracked = any(p.tracked for p in gpu.processes)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("USER", no_wrap=True, max_width=16, overflow="ellipsis")
    table.add_column("DEVICE MEMORY", justify="right", no_wrap=True)
    if any_tracked:
        for name in ("PHASE", "STEP", "EPOCH"):
            table.add_column(name, justify="left" if name == "PHASE" else "right", no_wrap=True)
        table.add_column("ALLOCATED / RESERVED", justify="right", no_wrap=True)
    # the command takes what is left
    overflow = "ellipsis" if cut_commands else "fold"
    table.add_column("COMMAND", overflow=overflow, max_width=command_width, min_width=8)
    for proc in gpu.processes:
        command = proc.command or ""
        if proc.note:
            command = f"{command} ({proc.note})" if command else proc.note
        command = Text(command, no_wrap=cut_commands, overflow=overflow)
        row = [str(proc.pid), proc.user or "?", format_bytes(proc.device_memory_bytes)]
        if any_tracked:
            row += tracked_cells(proc.tracked)
        table.add_row(*row, command)
    return table


def host_line(host: HostInfo, width: int = 20) -> Text:
    used = host.total_bytes - host.available_bytes
    line = bar(host.used_fraction, width) + Text(
        f" {format_bytes(used)} in use of {format_bytes(host.total_bytes)}"
        f" ({percent(used, host.total_bytes)}) · {format_bytes(host.available_bytes)} available"
    )
    if host.swap_total_bytes:
        line += Text(
            f" · swap {format_bytes(host.swap_used_bytes)} of {format_bytes(host.swap_total_bytes)}"
        )
    return line


def cgroup_line(host: HostInfo) -> Text | None:
    if host.cgroup_limit_bytes is None:
        return None
    return Text(
        f"container limit {format_bytes(host.cgroup_limit_bytes)}"
        f" ({format_bytes(host.cgroup_used_bytes)} charged to it,"
        f" {percent(host.cgroup_used_bytes, host.cgroup_limit_bytes)})"
    )


def no_gpu_line(info: SystemInfo) -> Text:
    reason = info.nvml_unavailable_reason or "NVML lists no GPU"
    return Text(f"No NVIDIA GPU to show: {reason}. Host memory only.", style="yellow")


def tracked_table(statuses: list[dict[str, Any]]) -> Table:
    """Runs tracked by ``vramscope run`` (or ``vramscope.track()``), from their status files."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name, justify in (
        ("PID", "right"),
        ("RUN", "left"),
        ("DEVICE", "right"),
        ("PHASE", "left"),
        ("STEP", "right"),
        ("EPOCH", "right"),
        ("ALLOCATED / RESERVED", "right"),
        ("PEAK ALLOCATED", "right"),
        ("HOST RSS", "right"),
        ("UPDATED", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=name != "RUN")  # type: ignore[arg-type]
    for status in statuses:
        phase, step, epoch, split = tracked_cells(status)
        age = status.get("age_s")
        device = status.get("device")
        table.add_row(
            str(status.get("pid")),
            str(status.get("name") or status.get("workload") or status.get("script") or "?"),
            "cpu" if device is None else str(device),
            phase,
            step,
            epoch,
            split,
            format_bytes(status.get("peak_allocated_bytes")),
            format_bytes(status.get("host_rss_bytes")),
            "n/a" if age is None else f"{age:.0f} s ago",
            style="dim" if age is not None and age > 10 else None,
        )
    return table


def _tracked_words(status: dict[str, Any] | None) -> str:
    """A tracked run's phase, step, epoch and memory in words, for narrow layouts."""
    if not status:
        return ""
    phase, step, epoch, split = tracked_cells(status)
    return f"{phase}, step {step}, epoch {epoch} · allocated / reserved {split}"


def process_list(processes: list[Any]) -> Table:
    """``process_table`` for narrow widths: the command, and a tracked run's state, in words."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("DEVICE MEMORY", justify="right", no_wrap=True)
    table.add_column("USER · COMMAND", overflow="fold")
    for proc in processes:
        words = f"{proc.user or '?'} · {proc.command or ''}"
        if proc.note:
            words += f" ({proc.note})"
        if proc.tracked:
            words += f"\n{_tracked_words(proc.tracked)}"
        table.add_row(str(proc.pid), format_bytes(proc.device_memory_bytes), words)
    return table


def tracked_list(statuses: list[dict[str, Any]]) -> Table:
    """``tracked_table`` for narrow widths: one run per row, in words."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("RUN", overflow="fold")
    for status in statuses:
        device = status.get("device")
        age = status.get("age_s")
        words = (
            f"{status.get('name') or status.get('workload') or status.get('script') or '?'}"
            f" · device {'cpu' if device is None else device} · {_tracked_words(status)}"
            f" · peak allocated {format_bytes(status.get('peak_allocated_bytes'))}"
            f" · host RSS {format_bytes(status.get('host_rss_bytes'))}"
            f" · updated {'n/a' if age is None else f'{age:.0f} s ago'}"
        )
        dim = "dim" if age is not None and age > 10 else None
        table.add_row(str(status.get("pid")), words, style=dim)
    return table


def unmatched_tracked(info: SystemInfo) -> list[dict[str, Any]]:
    """Tracked runs not shown in any GPU's process table (CPU runs, container PIDs)."""
    shown = {p.pid for gpu in info.devices for p in gpu.processes if p.tracked}
    return [s for s in info.tracked if s.get("pid") not in shown]


def probe_section(probe: ProbeResult) -> RenderableType:
    if not probe.available:
        return Text(f"Probe: not run: {probe.reason}", style="yellow")
    how = (
        "NVML's memory of the child process"
        if probe.method == "process"
        else "the change in the device's used memory (other processes may add noise)"
    )
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name in ("STAGE", "DEVICE MEMORY (NVML)", "TORCH RESERVED", "OUTSIDE THE ALLOCATOR"):
        table.add_column(name, justify="left" if name == "STAGE" else "right")
    base = probe.stages[0].device_used_bytes if probe.stages else None
    for stage in probe.stages:
        used = stage.process_used_bytes
        if probe.method == "device" and stage.device_used_bytes is not None and base is not None:
            used = stage.device_used_bytes - base
        outside = None if used is None else used - (stage.reserved_bytes or 0)
        table.add_row(
            stage.name,
            format_bytes(used),
            format_bytes(stage.reserved_bytes),
            format_bytes(outside),
        )
    summary = Text(
        f"CUDA context: {format_bytes(probe.context_bytes)} · cuBLAS and kernels loaded by the "
        f"first matmul: {format_bytes(probe.libraries_bytes)}. Every process that uses this GPU "
        "pays these on top of what torch reserves."
    )
    return Group(
        Text(
            f"Probe on GPU {probe.device_index} ({probe.device_name}), torch {probe.torch_version},"
            f" in a child process; measured by {how}:"
        ),
        _indent(table),
        _indent(summary),
    )


def allocator_section(info: SystemInfo) -> RenderableType:
    from vramscope.devices import ALLOCATOR_OPTIONS

    config = info.allocator
    if config.variable is None:
        head = Text("Allocator: PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF not set")
    else:
        head = Text(f"Allocator: {config.variable}={config.value}")
    lines: list[RenderableType] = [head]
    if config.options:
        table = Table(box=None, pad_edge=False, show_edge=False, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        table.add_column(style="dim")
        for key, value in config.options.items():
            table.add_row(key, value, ALLOCATOR_OPTIONS.get(key, ""))
        lines.append(_indent(table))
    lines += [_indent(Text(note, style="dim")) for note in config.notes]
    return Group(*lines)


def _indent(renderable: RenderableType, by: int = 2) -> RenderableType:
    from rich.padding import Padding

    return Padding(renderable, (0, 0, 0, by))


# --------------------------------------------------------------------------- whole view


def render_info(info: SystemInfo) -> Group:
    """The ``vramscope info`` page for one reading."""
    parts: list[RenderableType] = [
        Text(f"vramscope info · {info.hostname} · {_clock(info.taken_at)}", style="bold"),
        versions_line(info),
        Text(""),
    ]
    if not info.devices:
        parts += [no_gpu_line(info), Text("")]
    for gpu in info.devices:
        parts.append(Text(device_title(gpu), style="bold cyan"))
        body: list[RenderableType] = [memory_line(gpu)]
        note = reserve_note(gpu)
        if note is not None:
            body.append(note)
        body.append(sensors_line(gpu))
        if gpu.uuid:
            body.append(Text(gpu.uuid, style="dim"))
        for mig in gpu.mig_instances:
            body.append(
                Text(
                    f"MIG {mig.index}: {format_bytes(mig.used_bytes)} used of "
                    f"{format_bytes(mig.total_bytes)} ({mig.uuid or 'no UUID'})"
                )
            )
        if gpu.processes:
            body.append(
                fitting(process_table(gpu, cut_commands=False), process_list(gpu.processes))
            )
        else:
            body.append(Text("no processes", style="dim"))
        for what, why in gpu.not_available.items():
            body.append(Text(f"{what.replace('_', ' ')}: not available: {why}", style="yellow"))
        parts += [_indent(Group(*body)), Text("")]
    tracked = unmatched_tracked(info)
    if tracked:
        table = fitting(tracked_table(tracked), tracked_list(tracked))
        parts += [Text("Tracked runs", style="bold"), _indent(table), Text("")]
    if info.tracked_problem:
        parts += [Text(f"Tracked runs not shown: {info.tracked_problem}", style="yellow")]
    parts += [allocator_section(info), Text("")]
    parts.append(Text("Host memory", style="bold") + Text("  ") + host_line(info.host))
    cgroup = cgroup_line(info.host)
    if cgroup is not None:
        parts.append(_indent(cgroup))
    if info.probe is not None:
        parts += [Text(""), probe_section(info.probe)]
    return Group(*parts)


def _clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def render_text(renderable: RenderableType, width: int = 120) -> str:
    """Plain text of a renderable (no colour), for files, pipes and tests."""
    console = Console(width=width, record=True, file=_Null(), color_system=None)
    console.print(renderable)
    return console.export_text()


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


# --------------------------------------------------------------------------- command


@click.command("info")
@click.option(
    "--json",
    "json_path",
    metavar="PATH",
    help="Also write everything shown as JSON to PATH ('-' prints only the JSON to stdout).",
)
@click.option(
    "--probe",
    is_flag=True,
    help="Create a CUDA context in a child process and measure what it and cuBLAS cost.",
)
@click.option("--device", "index", type=int, metavar="N", help="Show only GPU N (NVML's index).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; --json is written.")
def command(json_path: str | None, probe: bool, index: int | None, quiet: bool) -> None:
    """Devices, processes, versions, allocator settings and host memory, explained."""
    target = _json_target(json_path)
    info = system_info(index=index, probe=probe)
    if json_path != "-" and not quiet:
        Console(highlight=False).print(render_info(info))
    if json_path == "-":
        click.echo(json.dumps(info.to_dict(), indent=2))
    elif target is not None:
        try:
            target.write_text(json.dumps(info.to_dict(), indent=2) + "\n")
        except OSError as exc:
            raise VramscopeError(f"cannot write {target}: {exc.strerror}") from None
        if not quiet:
            click.echo(f"vramscope: wrote {target}", err=True)


def _json_target(path: str | None) -> Path | None:
    """Check an output path before reading anything (the probe can take seconds)."""
    if path is None or path == "-":
        return None
    target = Path(path)
    if target.is_dir():
        raise VramscopeError(f"cannot write {target}: it is a folder; give a file name")
    if not target.parent.is_dir():
        raise VramscopeError(f"cannot write {target}: folder {target.parent} does not exist")
    return target


if __name__ == "__main__":  # pragma: no cover
    sys.exit(command())
