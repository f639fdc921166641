"""``vramscope watch``: the device view, live: memory bars and history, processes, host.

Reads NVML, psutil and the status files of tracked runs every ``--interval`` seconds and
redraws in place with ``rich.live.Live`` on the alternate screen. Keys are read in cbreak
mode when stdin is a terminal; the terminal is restored in ``finally`` whatever happens.
A terminal too small for the full layout gets a compact one.
"""

from __future__ import annotations

import contextlib
import csv
import os
import platform
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from vramscope.cli.info import (
    bar,
    device_title,
    fmt,
    host_line,
    no_gpu_line,
    percent,
    process_table,
    tracked_table,
    unmatched_tracked,
)
from vramscope.devices import (
    DeviceInfo,
    SystemInfo,
    allocator_config,
    attach_tracked,
    device,
    devices,
    host,
    versions,
)
from vramscope.errors import VramscopeError
from vramscope.sources import nvml
from vramscope.units import format_bytes

SPARK = "▁▂▃▄▅▆▇█"
HISTORY = 240  # readings kept per device for the sparklines
LOG_COLUMNS = [
    "time",
    "kind",
    "device",
    "name",
    "pid",
    "used_bytes",
    "total_bytes",
    "free_bytes",
    "utilization_gpu_percent",
    "temperature_c",
    "power_draw_watts",
    "phase",
    "step",
    "epoch",
    "allocated_bytes",
    "reserved_bytes",
]


def sparkline(values: list[float], top: float, width: int) -> str:
    """The last ``width`` values as block characters, 0..``top`` mapped to ▁..█."""
    if not values or width <= 0 or top <= 0:
        return ""
    chars = []
    for value in values[-width:]:
        level = min(max(value / top, 0.0), 1.0)
        chars.append(SPARK[min(int(level * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)])
    return "".join(chars)


class WatchView:
    """The readings ``watch`` keeps between frames, and the frames it draws from them."""

    def __init__(self, index: int | None = None, interval: float = 0.5) -> None:
        self.index = index
        self.interval = interval
        self.info: SystemInfo | None = None
        self.memory_history: dict[int, deque[float]] = {}
        self.utilization_history: dict[int, deque[float]] = {}
        self._versions = versions(include_torch=False)
        self._allocator = allocator_config()
        self._nvml_reason = nvml.unavailable_reason()

    # ---- reading -------------------------------------------------------------------------
    def refresh(self) -> SystemInfo:
        """Read everything once and add it to the history."""
        try:
            gpus = devices(self.index)
        except VramscopeError:  # the GPU went away while we watched: show what is left
            gpus = []
        info = SystemInfo(
            taken_at=time.time(),
            hostname=platform.node(),
            nvml_unavailable_reason=self._nvml_reason,
            versions=self._versions,
            devices=gpus,
            host=host(),
            allocator=self._allocator,
        )
        attach_tracked(info)
        self.show(info)
        return info

    def show(self, info: SystemInfo) -> None:
        """Take ``info`` as the newest reading (a live one, or one loaded from a file)."""
        self.info = info
        for gpu in info.devices:
            memory = self.memory_history.setdefault(gpu.index, deque(maxlen=HISTORY))
            if gpu.used_bytes is not None:
                memory.append(float(gpu.used_bytes))
            busy = self.utilization_history.setdefault(gpu.index, deque(maxlen=HISTORY))
            if gpu.utilization_gpu_percent is not None:
                busy.append(float(gpu.utilization_gpu_percent))

    def tracked_elsewhere(self) -> list[dict[str, Any]]:
        """Tracked runs that are not in a GPU's process table, limited to ``--device``."""
        assert self.info is not None
        runs = unmatched_tracked(self.info)
        if self.index is None:
            return runs
        uuids = {gpu.uuid for gpu in self.info.devices}
        return [
            run
            for run in runs
            if run.get("device_uuid") in uuids
            or (run.get("device_uuid") is None and run.get("device") == self.index)
        ]

    # ---- drawing -------------------------------------------------------------------------
    def frame(self, console: Console, height: int | None = None) -> RenderableType:
        """The full layout when it fits ``height`` lines, else the compact one."""
        full = self.full_frame(console.width)
        if height is None:
            return full
        lines = console.render_lines(full, console.options.update(width=console.width))
        if len(lines) <= height and console.width >= 60:
            return full
        return self.compact_frame(console.width)

    def header(self) -> Text:
        assert self.info is not None
        v = self.info.versions
        parts = [
            "vramscope watch",
            self.info.hostname,
            time.strftime("%H:%M:%S", time.localtime(self.info.taken_at)),
            f"every {self.interval:g} s",
        ]
        if v.get("driver"):
            parts.insert(2, f"driver {v['driver']} (CUDA {v.get('cuda_driver') or '?'})")
        return Text(" · ".join(parts), style="bold") + Text("   q quits", style="dim")

    def full_frame(self, width: int) -> RenderableType:
        assert self.info is not None
        info = self.info
        parts: list[RenderableType] = [self.header()]
        if not info.devices:
            parts.append(no_gpu_line(info))
        spark_width = max(8, min(60, width - 90))
        for gpu in info.devices:
            parts.append(self._device_panel(gpu, width, spark_width))
        elsewhere = self.tracked_elsewhere()
        if elsewhere:
            parts.append(Panel(tracked_table(elsewhere), title="Tracked runs", title_align="left"))
        if info.tracked_problem:
            parts.append(Text(f"Tracked runs not shown: {info.tracked_problem}", style="yellow"))
        parts.append(
            Panel(host_line(info.host, width=max(10, min(40, width - 70))), title="Host memory")
        )
        return Group(*parts)

    def _device_panel(self, gpu: DeviceInfo, width: int, spark_width: int) -> Panel:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        memory_history = list(self.memory_history.get(gpu.index, []))
        busy_history = list(self.utilization_history.get(gpu.index, []))
        if gpu.total_bytes is not None:
            memory = bar(gpu.used_fraction, width=max(10, min(40, width - 80))) + Text(
                f" {format_bytes(gpu.used_bytes)} / {format_bytes(gpu.total_bytes)}"
                f" ({percent(gpu.used_bytes, gpu.total_bytes)})"
            )
            # scaled to the window's peak, so a few GiB on a large GPU still show a shape
            top = max(memory_history[-spark_width:], default=0.0)
            history = Text(sparkline(memory_history, top, spark_width), style="cyan")
            if top:
                history += Text(f" ≤{format_bytes(top)}", style="dim")
        else:
            why = gpu.not_available.get("memory", "not reported")
            memory = Text(f"not available: {why}", style="yellow")
            history = Text("")
        grid.add_row(Text("memory ") + memory, history)
        power = fmt(gpu.power_draw_watts, " W")
        if gpu.power_limit_watts is not None:
            power += f" / {fmt(gpu.power_limit_watts, ' W')}"
        sensors = Text(
            f"util {fmt(gpu.utilization_gpu_percent, '%'):>4} · "
            f"mem util {fmt(gpu.utilization_memory_percent, '%')} · "
            f"{fmt(gpu.temperature_c, ' °C')} · {power}"
        )
        grid.add_row(sensors, Text(sparkline(busy_history, 100.0, spark_width), style="magenta"))
        body: list[RenderableType] = [grid]
        if gpu.processes:
            body.append(process_table(gpu, command_width=max(20, width - 60)))
        else:
            body.append(Text("no processes", style="dim"))
        for what, why in gpu.not_available.items():
            if what != "memory":
                body.append(Text(f"{what.replace('_', ' ')}: not available: {why}", style="dim"))
        return Panel(Group(*body), title=device_title(gpu), title_align="left")

    def compact_frame(self, width: int) -> RenderableType:
        """One line per device, tracked run and host: for terminals too small for panels."""
        assert self.info is not None
        info = self.info
        lines = [Text("vramscope watch (compact: enlarge for more) · q quits", style="bold")]
        if not info.devices:
            lines.append(Text(f"no GPU: {info.nvml_unavailable_reason or 'none listed'}"))
        for gpu in info.devices:
            lines.append(
                Text(
                    f"GPU{gpu.index} {format_bytes(gpu.used_bytes)}/{format_bytes(gpu.total_bytes)}"
                    f" {percent(gpu.used_bytes, gpu.total_bytes)}"
                    f" util {fmt(gpu.utilization_gpu_percent, '%')}"
                    f" {fmt(gpu.temperature_c, 'C')} {len(gpu.processes)} proc"
                )
            )
            for proc in gpu.processes:
                if proc.tracked:
                    lines.append(_compact_run(proc.tracked))
        for run in self.tracked_elsewhere():
            lines.append(_compact_run(run))
        used = info.host.total_bytes - info.host.available_bytes
        lines.append(
            Text(
                f"Host memory {format_bytes(used)}/{format_bytes(info.host.total_bytes)}"
                f" {percent(used, info.host.total_bytes)}"
            )
        )
        for line in lines:
            line.no_wrap = True
            line.overflow = "ellipsis"
        return Group(*lines)

    # ---- logging -------------------------------------------------------------------------
    def log_rows(self) -> Iterator[dict[str, Any]]:
        """One CSV row per device, per tracked run and for the host, for this reading."""
        assert self.info is not None
        info = self.info
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(info.taken_at))
        stamp += f".{int(info.taken_at % 1 * 1000):03d}"
        for gpu in info.devices:
            yield {
                "time": stamp,
                "kind": "device",
                "device": gpu.index,
                "name": gpu.name,
                "used_bytes": gpu.used_bytes,
                "total_bytes": gpu.total_bytes,
                "free_bytes": gpu.free_bytes,
                "utilization_gpu_percent": gpu.utilization_gpu_percent,
                "temperature_c": gpu.temperature_c,
                "power_draw_watts": gpu.power_draw_watts,
            }
        by_pid = {p.pid: (gpu, p) for gpu in info.devices for p in gpu.processes}
        runs = [s for s in info.tracked if s.get("pid") in by_pid] + self.tracked_elsewhere()
        for run in runs:
            gpu_proc = by_pid.get(run.get("pid"))
            yield {
                "time": stamp,
                "kind": "tracked",
                "device": gpu_proc[0].index if gpu_proc else run.get("device"),
                "name": run.get("name") or run.get("workload"),
                "pid": run.get("pid"),
                "used_bytes": gpu_proc[1].device_memory_bytes if gpu_proc else None,
                "phase": run.get("phase"),
                "step": run.get("step"),
                "epoch": run.get("epoch"),
                "allocated_bytes": run.get("allocated_bytes"),
                "reserved_bytes": run.get("reserved_bytes"),
            }
        yield {
            "time": stamp,
            "kind": "host",
            "name": info.hostname,
            "used_bytes": info.host.total_bytes - info.host.available_bytes,
            "total_bytes": info.host.total_bytes,
            "free_bytes": info.host.available_bytes,
        }


def _compact_run(run: dict[str, Any]) -> Text:
    return Text(
        f" pid {run.get('pid')} {run.get('phase') or '-'} step {fmt(run.get('step'))}"
        f" epoch {fmt(run.get('epoch'))} alloc {format_bytes(run.get('allocated_bytes'))}"
        f" res {format_bytes(run.get('reserved_bytes'))}"
    )


class CsvLog:
    """Appends ``watch`` readings to a CSV file, writing the header to a new file."""

    def __init__(self, path: Path) -> None:
        try:
            self._file: IO[str] = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise VramscopeError(
                f"cannot write the log {path}: {exc.strerror}; give a writable file path"
            ) from None
        self._writer = csv.DictWriter(self._file, fieldnames=LOG_COLUMNS, extrasaction="ignore")
        if self._file.tell() == 0:
            self._writer.writeheader()

    def write(self, rows: Iterator[dict[str, Any]]) -> None:
        self._writer.writerows(rows)
        self._file.flush()  # so `tail -f` and a crash both see every reading

    def close(self) -> None:
        self._file.close()


class KeyReader:
    """Single key presses from a terminal stdin, in cbreak mode; a no-op for a pipe.

    cbreak keeps Ctrl-C working (it raises KeyboardInterrupt); ``__exit__`` restores the
    terminal settings exactly as they were.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._fd: int | None = None
        self._saved: Any = None
        try:
            if stream.isatty():
                self._fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None

    def __enter__(self) -> KeyReader:
        if self._fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)

    def wait(self, timeout: float) -> str:
        """Keys pressed within ``timeout`` seconds ('' when none)."""
        if self._fd is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self._fd], [], [], max(timeout, 0.0))
        if not ready:
            return ""
        data = os.read(self._fd, 64)
        return data.decode(errors="replace")


class _Quit(Exception):
    """SIGTERM: stop as on q, through every ``finally`` (terminal, log)."""


@contextlib.contextmanager
def _sigterm_quits() -> Iterator[None]:
    """Turn SIGTERM into ``_Quit`` so ``finally`` blocks restore the terminal."""

    def stop(_signum: int, _frame: Any) -> None:
        raise _Quit

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_live(view: WatchView, console: Console, log: CsvLog | None) -> None:
    """Refresh until q or Ctrl-C; redraw at once when the terminal is resized."""
    from rich.live import Live

    next_read = 0.0
    size = None
    with (
        KeyReader(sys.stdin) as keys,
        Live(
            console=console,
            screen=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="crop",
        ) as live,
    ):
        while True:
            now = time.monotonic()
            redraw = False
            if now >= next_read:
                view.refresh()
                if log is not None:
                    log.write(view.log_rows())
                next_read = now + view.interval
                redraw = True
            if console.size != size:
                size = console.size
                redraw = True
            if redraw:
                live.update(view.frame(console, height=size.height), refresh=True)
            pressed = keys.wait(min(0.1, max(0.0, next_read - time.monotonic())))
            if "q" in pressed.lower():
                return


def _positive(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    if value <= 0:
        raise click.BadParameter(f"must be a positive number of seconds, like 0.5 (got {value:g})")
    return value


@click.command("watch")
@click.option(
    "--interval",
    type=float,
    default=0.5,
    show_default=True,
    callback=_positive,
    metavar="SECONDS",
    help="Seconds between readings.",
)
@click.option("--device", "index", type=int, metavar="N", help="Show only GPU N (NVML's index).")
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PATH",
    help="Append one CSV row per device, tracked run and host to PATH at every reading.",
)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
def command(interval: float, index: int | None, log_path: Path | None, once: bool) -> None:
    """GPU and host memory, live: per device, per process, per tracked run. q quits."""
    if index is not None:
        device(index)  # raises with the reason when there is no such GPU
    view = WatchView(index=index, interval=interval)
    log = CsvLog(log_path) if log_path is not None else None
    try:
        if once:
            _print_frame(view, log, Console(highlight=False))
        elif not sys.stdout.isatty():
            run_plain(view, log)
        else:
            # the terminal's own size, never a stale exported COLUMNS/LINES: resizes must show
            environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
            # Ctrl-C and SIGTERM are how one leaves: not errors
            with _sigterm_quits(), contextlib.suppress(KeyboardInterrupt, _Quit):
                run_live(view, Console(_environ=environ), log)
    finally:
        if log is not None:
            log.close()


def _print_frame(view: WatchView, log: CsvLog | None, console: Console) -> None:
    view.refresh()
    if log is not None:
        log.write(view.log_rows())
    height = console.height if console.is_terminal else None
    console.print(view.frame(console, height=height))


def run_plain(view: WatchView, log: CsvLog | None) -> None:
    """Output is a pipe or file (``top -b`` style): one frame per reading, until stopped."""
    console = Console(highlight=False)
    with _sigterm_quits(), contextlib.suppress(KeyboardInterrupt, _Quit):
        while True:
            started = time.monotonic()
            _print_frame(view, log, console)
            console.file.flush()
            time.sleep(max(0.0, view.interval - (time.monotonic() - started)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(command())
