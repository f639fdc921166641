"""The CUDA caching allocator's own counters, read cheaply, without disturbing the user.

``torch.cuda.memory_allocated()`` costs 90–175 µs because it flattens the whole stats dict
in Python; reading ``torch._C._cuda_memoryStats`` (the nested dict) and picking the keys
we need is several times cheaper. Peak counters are reset at phase boundaries to get
per-phase peaks, so :class:`PeakLedger` keeps what the user's own calls to
``torch.cuda.max_memory_allocated()`` and friends return unchanged while we track.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

_STAT_KEYS = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
    "segment",
)


_cuda_available = False  # torch.cuda.is_available() said so once: it stays so


def cuda_initialized() -> bool:
    """True once the process has a CUDA context; vramscope never creates one itself.

    Asked at phase boundaries until a device is found: ``is_initialized()`` (a flag) comes
    first, and ``is_available()`` (tens of microseconds on a GPU host) is asked only then,
    once for the process."""
    global _cuda_available
    if not torch.cuda.is_initialized():
        return False
    if not _cuda_available:
        _cuda_available = torch.cuda.is_available()
    return _cuda_available


@dataclass(frozen=True)
class AllocatorReading:
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    inactive_split_bytes: int
    requested_bytes: int
    segments: int
    peak_allocated_bytes: int  # since the last peak reset
    peak_reserved_bytes: int
    num_alloc_retries: int
    num_ooms: int

    @property
    def cached_free_bytes(self) -> int:
        """Free cached memory outside split segments: what empty_cache() would release."""
        return max(0, self.reserved_bytes - self.active_bytes - self.inactive_split_bytes)

    @property
    def rounding_bytes(self) -> int:
        return max(0, self.allocated_bytes - self.requested_bytes)


def _all(stats: dict[str, Any], key: str, which: str) -> int:
    return int(stats.get(key, {}).get("all", {}).get(which, 0))


def reading_from_stats(stats: dict[str, Any]) -> AllocatorReading:
    """Build a reading from the nested stats dict (``memory_stats_as_nested_dict`` form)."""
    return AllocatorReading(
        allocated_bytes=_all(stats, "allocated_bytes", "current"),
        reserved_bytes=_all(stats, "reserved_bytes", "current"),
        active_bytes=_all(stats, "active_bytes", "current"),
        inactive_split_bytes=_all(stats, "inactive_split_bytes", "current"),
        requested_bytes=_all(stats, "requested_bytes", "current"),
        segments=_all(stats, "segment", "current"),
        peak_allocated_bytes=_all(stats, "allocated_bytes", "peak"),
        peak_reserved_bytes=_all(stats, "reserved_bytes", "peak"),
        num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
        num_ooms=int(stats.get("num_ooms", 0)),
    )


def raw_stats(device_index: int) -> dict[str, Any]:
    """The allocator's nested stats for one device (no CUDA context is created)."""
    return torch._C._cuda_memoryStats(device_index)


def read(device_index: int) -> AllocatorReading:
    return reading_from_stats(raw_stats(device_index))


def private_pools(segments: list[dict[str, Any]], device_index: int) -> dict[str, int]:
    """Reserved and allocated bytes in private pools (CUDA graphs, ``torch.cuda.MemPool``),
    from a memory snapshot's segments; pool ``(0, 0)`` is the shared cache."""
    reserved = allocated = count = 0
    pools: set[tuple[int, ...]] = set()
    for segment in segments:
        if segment.get("device", device_index) != device_index:
            continue
        pool = tuple(segment.get("segment_pool_id") or (0, 0))
        if pool == (0, 0):
            continue
        pools.add(pool)
        count += 1
        reserved += int(segment.get("total_size", 0))
        allocated += int(segment.get("allocated_size", 0))
    return {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "segments": count,
        "pools": len(pools),
    }


def _peaks(stats: dict[str, Any], prefix: str = "") -> dict[str, int]:
    """Every ``…peak`` value in a nested stats dict, keyed by its dotted path."""
    found: dict[str, int] = {}
    for key, value in stats.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            if "peak" in value and not isinstance(value["peak"], dict):
                found[path] = int(value["peak"])
            found.update(_peaks(value, path + "."))
    return found


def _peak_paths(stats: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """Where each peak counter sits: (dotted key, outer key, inner key or None)."""
    paths: list[tuple[str, str, str | None]] = []
    for outer, value in stats.items():
        if not isinstance(value, dict):
            continue
        if "peak" in value and not isinstance(value["peak"], dict):
            paths.append((outer, outer, None))
        for inner, sub in value.items():
            if isinstance(sub, dict) and "peak" in sub and not isinstance(sub["peak"], dict):
                paths.append((f"{outer}.{inner}", outer, inner))
    return paths


def _apply_peaks(stats: dict[str, Any], peaks: dict[str, int], prefix: str = "") -> None:
    for key, value in stats.items():
        if not isinstance(value, dict):
            continue
        path = f"{prefix}{key}"
        if "peak" in value and not isinstance(value["peak"], dict) and path in peaks:
            value["peak"] = max(int(value["peak"]), peaks[path])
        _apply_peaks(value, peaks, path + ".")


class PeakLedger:
    """Lets vramscope reset the allocator's peak counters while the user's reads stay true.

    While installed, ``torch.cuda.memory_stats_as_nested_dict`` (and so ``memory_stats``,
    ``max_memory_allocated``, ``max_memory_reserved``, ``memory_summary``) report, for every
    peak counter, the maximum since the *user's* last ``reset_peak_memory_stats()``,
    whatever resets vramscope did in between.
    """

    def __init__(self) -> None:
        self._peaks: dict[int, dict[str, int]] = {}
        self._lock = threading.RLock()
        self._saved: list[tuple[Any, str, Any]] = []
        self._users = 0
        # peaks the user's own resets wiped before vramscope's next read, per device
        self._pending: dict[int, dict[str, int]] = {}
        self._paths: list[tuple[str, str, str | None]] | None = None

    def read_for_tracking(self, device_index: int, reset: bool) -> dict[str, Any]:
        """The nested stats for vramscope's phase accounting, optionally resetting peaks.

        Peaks that a user's ``reset_peak_memory_stats()`` wiped since vramscope's last
        reset are merged back in, so a user's reset never hides a phase's peak. This runs at
        every phase boundary: one read of the allocator, and on reset a flat pass over the
        few dozen peak counters (no walk of the nested dict).
        """
        with self._lock:
            stats = torch._C._cuda_memoryStats(device_index)
            pending = self._pending.get(device_index)
            if reset:  # the user's view: since their last reset (before pending is merged)
                paths = self._paths
                if paths is None:
                    paths = self._paths = _peak_paths(stats)
                ledger = self._peaks.get(device_index)
                if ledger is None:
                    ledger = self._peaks[device_index] = {}
                for key, outer, inner in paths:
                    try:
                        value = stats[outer][inner]["peak"] if inner else stats[outer]["peak"]
                    except (KeyError, TypeError):  # another shape: fall back to the walk
                        self._paths = None
                        for k, v in _peaks(stats).items():
                            if v > ledger.get(k, -1):
                                ledger[k] = v
                        break
                    if value > ledger.get(key, -1):
                        ledger[key] = value
                torch._C._cuda_resetPeakMemoryStats(device_index)
            if pending:  # vramscope's view: what the user's resets wiped since its last read
                _apply_peaks(stats, pending)
            if reset and pending is not None:
                del self._pending[device_index]
        return stats

    def install(self) -> None:
        """Patch torch's stats functions (idempotent; nested sessions share one ledger)."""
        with self._lock:
            self._users += 1
            if self._saved:
                return
        import torch.cuda as tc
        import torch.cuda.memory as tcm

        original_nested = tcm.memory_stats_as_nested_dict
        original_reset = tcm.reset_peak_memory_stats
        ledger = self

        def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
            stats = original_nested(device)
            if stats:
                index = torch.cuda._utils._get_device_index(device, optional=True)
                with ledger._lock:
                    peaks = dict(ledger._peaks.get(index, {}))
                if peaks:
                    _apply_peaks(stats, peaks)
            return stats

        def reset_peak_memory_stats(device: Any = None) -> None:
            index = torch.cuda._utils._get_device_index(device, optional=True)
            with ledger._lock:
                ledger._peaks.pop(index, None)
                if ledger._users:
                    pending = ledger._pending.setdefault(index, {})
                    for key, value in _peaks(torch._C._cuda_memoryStats(index)).items():
                        if value > pending.get(key, -1):
                            pending[key] = value
                done = ledger._users == 0 and not ledger._peaks
                original_reset(device)
            if done:
                ledger._restore()

        memory_stats_as_nested_dict.__doc__ = original_nested.__doc__
        reset_peak_memory_stats.__doc__ = original_reset.__doc__
        for module in (tc, tcm):
            for name, replacement in (
                ("memory_stats_as_nested_dict", memory_stats_as_nested_dict),
                ("reset_peak_memory_stats", reset_peak_memory_stats),
            ):
                if hasattr(module, name):
                    self._saved.append((module, name, getattr(module, name)))
                    setattr(module, name, replacement)

    def uninstall(self) -> None:
        """Stop tracking; put torch back as it was as soon as that changes no number.

        There is no setter for an allocator peak, so while the ledger still holds a peak
        higher than the allocator's own (vramscope reset it), the patched functions stay
        in place, so the user's ``max_memory_allocated()`` stays true. They remove
        themselves at the user's next ``reset_peak_memory_stats()``.
        """
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users or self._peaks:
                return
        self._restore()

    def _restore(self) -> None:
        with self._lock:
            saved, self._saved = self._saved, []
        for module, name, original in reversed(saved):
            setattr(module, name, original)

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def peaks(self, device_index: int) -> dict[str, int]:
        with self._lock:
            return dict(self._peaks.get(device_index, {}))


LEDGER = PeakLedger()
