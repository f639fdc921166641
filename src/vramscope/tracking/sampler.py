"""A background thread that samples allocator counters, NVML and host RSS into a bounded buffer.

The buffer never grows past its capacity: when full, neighbouring samples are merged
pairwise (keeping the maximum of each memory series, so no peak is lost) and the effective
interval doubles. A run of any length keeps its whole history at falling resolution.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# one sample: (t, allocated, reserved, device_used, host_rss)
Sample = tuple[float, "int | None", "int | None", "int | None", "int | None"]


def max_known(a: int | None, b: int | None) -> int | None:
    """The larger of two values, either of which may be unknown (None)."""
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


@dataclass
class SampleBuffer:
    """Bounded, peak-preserving series of samples."""

    capacity: int = 4096
    samples: list[Sample] = field(default_factory=list)
    stride: int = 1  # how many raw samples each stored one stands for
    _pending: Sample | None = None
    _pending_count: int = 0

    def add(self, sample: Sample) -> None:
        if self.stride > 1:
            self._pending = sample if self._pending is None else _merge(self._pending, sample)
            self._pending_count += 1
            if self._pending_count < self.stride:
                return
            sample, self._pending, self._pending_count = self._pending, None, 0
        self.samples.append(sample)
        if len(self.samples) >= self.capacity:
            self.samples = [
                _merge(self.samples[i], self.samples[i + 1])
                if i + 1 < len(self.samples)
                else self.samples[i]
                for i in range(0, len(self.samples), 2)
            ]
            self.stride *= 2

    def snapshot(self) -> list[Sample]:
        tail = [self._pending] if self._pending is not None else []
        return list(self.samples) + tail


def _merge(a: Sample, b: Sample) -> Sample:
    """Merge two neighbouring samples: the later time, the larger of each value."""
    return (
        b[0],
        max_known(a[1], b[1]),
        max_known(a[2], b[2]),
        max_known(a[3], b[3]),
        max_known(a[4], b[4]),
    )


class Sampler:
    """Calls ``read()`` every ``interval_s`` on a daemon thread and buffers what it returns.

    ``read`` returns a sample tuple; an exception in it stops sampling and is kept in
    ``error`` (the run goes on). ``on_tick`` (optional) is called after each sample, for
    the status file ``watch`` reads. ``on_start`` (optional) runs first on the thread:
    setting up what the samples need but the caller does not wait for (``stop()`` does).
    """

    def __init__(
        self,
        read: Callable[[float], Sample],
        interval_s: float = 0.1,
        capacity: int = 4096,
        on_tick: Callable[[Sample], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.buffer = SampleBuffer(capacity=capacity)
        self.error: str | None = None
        self._read = read
        self._on_tick = on_tick
        self._on_start = on_start
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_at: float | None = None  # when the last sample was taken

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="vramscope-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self._on_start is not None:
            time.sleep(0)  # the interpreter lock back to the thread that started this one first
            try:
                self._on_start()
            except Exception as exc:  # never into the user's run; the timeline goes on
                self.error = f"starting: {type(exc).__name__}: {exc}"
        # the first sample at once, unless one was just taken (the session takes its first
        # before it starts the thread): the grid starts there
        last = self._last_at
        due = time.perf_counter() if last is None else last  # when the last one was due
        sampled = last is not None
        while not self._stop.is_set():
            now = time.perf_counter()
            interval = self.interval_s  # may change while asleep (Session paces it)
            if not sampled or now >= due + interval * 0.98:  # (timers wake a hair early)
                try:
                    self.sample_now()
                except Exception as exc:  # never take the user's run down with us
                    self.error = f"{type(exc).__name__}: {exc}"
                    return
                if sampled:
                    due += interval
                    if now - due > interval:  # fell behind (a long GIL hold): skip ahead
                        due = now
                sampled = True
            # else the interval grew while asleep: wake again when it is up, reading nothing
            # now (each sample gives the interpreter lock up and takes it back)
            self._stop.wait(max(0.0, due + self.interval_s - time.perf_counter()))

    def sample_now(self) -> Sample:
        self._last_at = now = time.perf_counter()
        sample = self._read(now)
        with self._lock:
            self.buffer.add(sample)
        if self._on_tick is not None:
            self._on_tick(sample)
        return sample

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def samples(self) -> list[Sample]:
        with self._lock:
            return self.buffer.snapshot()

    @property
    def effective_interval_s(self) -> float:
        return self.interval_s * self.buffer.stride
