"""The simulated caching allocator: pools, best fit, splitting and merging, segments and
expandable segments, the free-and-retry path, caps and statistics."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from vramscope.errors import VramscopeError
from vramscope.estimate.allocator.config import (
    MIN_BLOCK_SIZE,
    SMALL_BUFFER,
    SMALL_SIZE,
    UNLIMITED,
    AllocatorConfig,
)
from vramscope.units import format_bytes

# Free blocks are kept in sorted lists of integer keys, (stream, size, address) packed into one
# Python int so that bisect compares machine-sized digits rather than tuples.
_ADDR_BITS = 52
_STREAM_SHIFT = 2 * _ADDR_BITS
_ADDR_LIMIT = 1 << _ADDR_BITS
_DEFAULT_DEVICE_BASE = 1 << 48  # first address of the simulated cudaMalloc address space
_DEFAULT_VA_BASE = 1 << 50  # first address of simulated expandable-segment reservations
_DEFAULT_DEVICE_TOTAL = 1 << 40  # sizes expandable reservations when no device size is given


class SimulatedOOM(VramscopeError):
    """The simulated allocator ran out of memory (``torch.OutOfMemoryError`` on a real GPU)."""

    def __init__(
        self, size: int, alloc_size: int, stream: int, reserved: int, allocated: int, limit: int
    ):
        self.size = size
        self.alloc_size = alloc_size
        self.stream = stream
        self.reserved_bytes = reserved
        self.allocated_bytes = allocated
        self.limit_bytes = limit
        super().__init__(
            f"simulated CUDA out of memory: tried to allocate {format_bytes(alloc_size)} "
            f"(request {format_bytes(size)}) with {format_bytes(reserved)} reserved, "
            f"{format_bytes(allocated)} allocated, limit {format_bytes(limit)}"
        )


class _Block:
    __slots__ = (
        "addr",
        "allocated",
        "gc_base",
        "mapped",
        "next",
        "pool",
        "prev",
        "requested",
        "seg",
        "size",
        "stream",
    )

    def __init__(self, addr: int, size: int, stream: int, pool: _Pool, seg: _Expandable | None):
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.seg = seg
        self.mapped = True
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.requested = 0
        self.gc_base = 0


class _Pool:
    """Free blocks of one pool: mapped ones by (stream, size, addr), unmapped by (stream, addr)."""

    __slots__ = ("by_key", "gc_calls", "index", "keys", "small", "unmapped", "unmapped_keys")

    def __init__(self, small: bool):
        self.small = small
        self.index = 0 if small else 1
        self.keys: list[int] = []
        self.by_key: dict[int, _Block] = {}
        self.unmapped_keys: list[int] = []
        self.unmapped: dict[int, _Block] = {}
        self.gc_calls = 0


class _Expandable:
    __slots__ = ("base", "page", "stream", "va_size")

    def __init__(self, base: int, va_size: int, page: int, stream: int):
        self.base = base
        self.va_size = va_size
        self.page = page
        self.stream = stream


class _AddressSpace:
    """First-fit model of the addresses the driver hands out.

    Upward: the lowest free range that fits, above ``base``. Downward: the highest free range
    that fits, below ``base`` -- what cudaMalloc does on the H200 we recorded (each new segment
    lies below the previous ones). The order matters where the allocator breaks a tie between
    free blocks of one size by address: with segments placed this way, replaying the CNN and
    ViT traces of ``tests/data/op_trace_h200_*`` reproduces their reserved peaks exactly
    (placed upwards, two of them came out 3.6% low and 1.9% high).
    """

    __slots__ = ("downward", "holes", "live", "top")

    def __init__(self, base: int, downward: bool = False):
        self.top = base  # upward: the end of the used range; downward: its start
        self.downward = downward
        self.holes: list[tuple[int, int]] = []  # sorted by address
        self.live: dict[int, int] = {}

    def take(self, size: int) -> int:
        order = range(len(self.holes) - 1, -1, -1) if self.downward else range(len(self.holes))
        for i in order:
            addr, hole = self.holes[i]
            if hole >= size:
                if hole == size:
                    del self.holes[i]
                elif self.downward:  # the top of the hole
                    self.holes[i] = (addr, hole - size)
                    addr += hole - size
                else:
                    self.holes[i] = (addr + size, hole - size)
                self.live[addr] = size
                return addr
        if self.downward:
            self.top -= size
            addr = self.top
        else:
            addr = self.top
            self.top += size
        self.live[addr] = size
        return addr

    def give_back(self, addr: int) -> None:
        size = self.live.pop(addr, None)
        if size is None:
            return
        i = bisect.bisect_left(self.holes, (addr, 0))
        self.holes.insert(i, (addr, size))
        if i + 1 < len(self.holes) and addr + size == self.holes[i + 1][0]:
            self.holes[i] = (addr, size + self.holes[i + 1][1])
            del self.holes[i + 1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == addr:
            self.holes[i - 1] = (self.holes[i - 1][0], self.holes[i - 1][1] + self.holes[i][1])
            del self.holes[i]
        if self.downward:
            if self.holes and self.holes[0][0] == self.top:
                self.top = sum(self.holes.pop(0))
        elif self.holes and sum(self.holes[-1]) == self.top:
            self.top = self.holes.pop()[0]


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment, as ``torch.cuda.memory_snapshot()`` lists it."""

    address: int
    size: int
    requested_size: int
    allocated: bool


@dataclass(frozen=True)
class SegmentInfo:
    """One segment (one ``cudaMalloc``, or one mapped range of an expandable segment)."""

    address: int
    total_size: int
    stream: int
    pool: str  # "small" or "large"
    expandable: bool
    blocks: tuple[BlockInfo, ...]

    @property
    def allocated_size(self) -> int:
        return sum(b.size for b in self.blocks if b.allocated)


def _key_size(key: int) -> int:
    return (key >> _ADDR_BITS) & (_ADDR_LIMIT - 1)


def _expandable_size(b: _Block) -> int:
    nxt = b.next
    if nxt is not None and not nxt.mapped:
        return b.size + nxt.size
    return b.size


class CachingAllocatorSim:
    """The CUDA caching allocator of one device, replayed in Python.

    ``malloc(size, stream)`` returns a block id (an int), ``free(block_id)`` returns it.
    ``total_bytes`` is the memory the device can give the allocator (``cudaMalloc`` fails above
    it); ``allowed_bytes`` the cap of ``set_per_process_memory_fraction``.  ``segment_addresses``
    replays the addresses a real run's ``cudaMalloc`` calls (and expandable reservations)
    returned, in order; when they run out the first-fit model takes over.
    ``device_total_bytes`` (the GPU's memory) only sizes expandable-segment reservations.

    Blocks freed while another stream still uses them (``record_stream``) are returned at once.
    """

    def __init__(
        self,
        config: AllocatorConfig | str | None = None,
        total_bytes: int | None = None,
        *,
        allowed_bytes: int | None = None,
        device_total_bytes: int | None = None,
        segment_addresses: Iterable[int] | None = None,
        record_segments: bool = True,
    ):
        if config is None or isinstance(config, str):
            config = AllocatorConfig.parse(config)
        if config.backend != "native":
            raise VramscopeError(
                f"backend:{config.backend} is not simulated; only the native caching allocator is"
            )
        self.config = config
        self._plain_rounding = not any(d > 1 for d in config.roundup_power2_divisions)
        self.total_bytes = total_bytes
        self.allowed_bytes = allowed_bytes
        self.device_total_bytes = device_total_bytes or total_bytes or _DEFAULT_DEVICE_TOTAL
        self._small = _Pool(True)
        self._large = _Pool(False)
        self._active: dict[int, _Block] = {}
        self._zero: set[int] = set()
        self._next_id = 1
        self._device_space = _AddressSpace(_DEFAULT_DEVICE_BASE, downward=True)
        self._va_space = _AddressSpace(_DEFAULT_VA_BASE)
        self._addresses: Iterator[int] | None = (
            iter(segment_addresses) if segment_addresses is not None else None
        )
        self.segment_log: list[tuple[str, int, int, int]] | None = [] if record_segments else None
        # statistics, named as in torch.cuda.memory_stats()
        self._allocated = 0
        self._reserved = 0
        self._requested = 0
        self._inactive_split = 0
        self._inactive_split_bytes = 0
        self._segments = 0
        self._allocations = 0
        self._reserved_pool = [0, 0]  # small, large
        self._allocated_pool = [0, 0]
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._peak_requested = 0
        self._peak_inactive_split = 0
        self._peak_inactive_split_bytes = 0
        self._peak_segments = 0
        self._peak_reserved_pool = [0, 0]
        self._oversize_allocations = 0
        self._oversize_segments = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    # -- public API ---------------------------------------------------------------------------

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes for ``stream``; returns a block id or raises SimulatedOOM."""
        if size <= 0 or stream < 0:
            if size < 0:
                raise VramscopeError(f"cannot allocate a negative size: {size}")
            if stream < 0:
                raise VramscopeError(f"streams are numbered from 0, got {stream}")
        bid = self._next_id
        self._next_id = bid + 1
        if size == 0:  # torch hands out a null pointer without asking the allocator
            self._zero.add(bid)
            return bid
        cfg = self.config
        if self._plain_rounding:
            rounded = (size + MIN_BLOCK_SIZE - 1) & -MIN_BLOCK_SIZE
        else:
            rounded = cfg.round_size(size)
        pool = self._small if rounded <= SMALL_SIZE else self._large
        block = self._get_free_block(pool, rounded, stream)
        if block is None:
            block = self._new_block(pool, size, rounded, stream)

        # alloc_found_block: split off the rest when it is worth keeping
        remaining = block.size - rounded
        if pool.small or cfg.expandable_segments:
            split = remaining >= MIN_BLOCK_SIZE
        else:
            split = remaining > SMALL_SIZE and rounded < cfg.max_split_size
        prev = block.prev
        already_split = prev is not None or block.next is not None
        if split:
            rest = block
            block = _Block(rest.addr, rounded, stream, pool, rest.seg)
            block.prev = prev
            if prev is not None:
                prev.next = block
            block.next = rest
            rest.prev = block
            rest.addr += rounded
            rest.size = remaining
            key = (stream << _STREAM_SHIFT) | (remaining << _ADDR_BITS) | rest.addr
            bisect.insort(pool.keys, key)
            pool.by_key[key] = rest
            rest.gc_base = pool.gc_calls
            if rest.seg is None:
                if already_split:
                    self._inactive_split_bytes -= rounded
                else:
                    self._inactive_split += 1
                    if self._inactive_split > self._peak_inactive_split:
                        self._peak_inactive_split = self._inactive_split
                    self._inactive_split_bytes += remaining
                    if self._inactive_split_bytes > self._peak_inactive_split_bytes:
                        self._peak_inactive_split_bytes = self._inactive_split_bytes
        elif already_split and block.seg is None:
            self._inactive_split -= 1
            self._inactive_split_bytes -= block.size
        block.allocated = True
        block.requested = size
        self._active[bid] = block
        bsize = block.size
        self._allocations += 1
        allocated = self._allocated + bsize
        self._allocated = allocated
        if allocated > self._peak_allocated:
            self._peak_allocated = allocated
        requested = self._requested + size
        self._requested = requested
        if requested > self._peak_requested:
            self._peak_requested = requested
        self._allocated_pool[pool.index] += bsize
        if bsize >= cfg.max_split_size:
            self._oversize_allocations += 1
        return bid

    def free(self, block_id: int) -> None:
        """Return a block to its pool (merging it with free neighbours)."""
        block = self._active.pop(block_id, None)
        if block is None:
            if block_id in self._zero:
                self._zero.discard(block_id)
                return
            raise VramscopeError(f"free of a block id that is not allocated: {block_id!r}")
        block.allocated = False
        size = block.size
        pool = block.pool
        self._allocated -= size
        self._allocated_pool[pool.index] -= size
        self._allocations -= 1
        self._requested -= block.requested
        if size >= self.config.max_split_size:
            self._oversize_allocations -= 1
        # free_block: merge with free neighbours, back into the pool
        blocks = 0
        nbytes = 0
        before, after = block.prev, block.next
        if before is not None and not before.allocated and before.mapped == block.mapped:
            nbytes -= self._try_merge(block, before)
            blocks -= 1
        if after is not None and not after.allocated and after.mapped == block.mapped:
            nbytes -= self._try_merge(block, after)
            blocks -= 1
        key = (block.stream << _STREAM_SHIFT) | (block.size << _ADDR_BITS) | block.addr
        bisect.insort(pool.keys, key)
        pool.by_key[key] = block
        block.gc_base = pool.gc_calls
        if block.seg is None:
            if block.prev is not None or block.next is not None:
                blocks += 1
                nbytes += block.size
            if blocks:
                self._inactive_split += blocks
                if self._inactive_split > self._peak_inactive_split:
                    self._peak_inactive_split = self._inactive_split
            if nbytes:
                self._inactive_split_bytes += nbytes
                if nbytes > 0 and self._inactive_split_bytes > self._peak_inactive_split_bytes:
                    self._peak_inactive_split_bytes = self._inactive_split_bytes

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: release every unsplit free segment and free page."""
        self._release_cached_blocks()

    def reset_peak_stats(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved
        self._peak_requested = self._requested
        self._peak_inactive_split = self._inactive_split
        self._peak_inactive_split_bytes = self._inactive_split_bytes
        self._peak_segments = self._segments
        self._peak_reserved_pool = list(self._reserved_pool)

    def set_allowed_bytes(self, allowed_bytes: int | None) -> None:
        """Set (or with None lift) the ``set_per_process_memory_fraction`` cap, in bytes."""
        self.allowed_bytes = allowed_bytes

    def set_memory_fraction(self, fraction: float, device_total_bytes: int | None = None) -> None:
        """``torch.cuda.set_per_process_memory_fraction(fraction)`` on a device of that size."""
        if not 0.0 <= fraction <= 1.0:
            raise VramscopeError(f"memory fraction must lie in [0, 1], got {fraction}")
        total = device_total_bytes or self.device_total_bytes
        self.allowed_bytes = int(fraction * float(total))

    def address_of(self, block_id: int) -> int:
        """The simulated device address of an allocated block."""
        block = self._active.get(block_id)
        if block is None:
            raise VramscopeError(f"block id {block_id!r} is not allocated")
        return block.addr

    @property
    def allocated_bytes(self) -> int:
        return self._allocated

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    @property
    def active_bytes(self) -> int:
        return self._allocated  # no record_stream: active blocks are the allocated ones

    @property
    def requested_bytes(self) -> int:
        return self._requested

    @property
    def inactive_split_bytes(self) -> int:
        return self._inactive_split_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        return self._peak_allocated

    @property
    def peak_reserved_bytes(self) -> int:
        return self._peak_reserved

    @property
    def num_segments(self) -> int:
        """Segments from ``cudaMalloc`` (``segment.all.current``; expandable ones not counted)."""
        return self._segments

    @property
    def segments(self) -> list[SegmentInfo]:
        """The segments and their blocks, ordered by address, as a memory snapshot lists them.

        An expandable segment appears once per contiguous mapped range, as torch reports it.
        """
        blocks: list[_Block] = list(self._active.values())
        for pool in (self._small, self._large):
            blocks.extend(pool.by_key.values())
        out = []
        for head in blocks:
            if head.prev is not None and head.prev.mapped:
                continue
            infos = []
            b: _Block | None = head
            while b is not None and b.mapped:
                infos.append(BlockInfo(b.addr, b.size, b.requested, b.allocated))
                b = b.next
            out.append(
                SegmentInfo(
                    address=head.addr,
                    total_size=sum(i.size for i in infos),
                    stream=head.stream,
                    pool="small" if head.pool.small else "large",
                    expandable=head.seg is not None,
                    blocks=tuple(infos),
                )
            )
        out.sort(key=lambda s: s.address)
        return out

    def memory_stats(self) -> dict[str, int]:
        """The statistics under the names ``torch.cuda.memory_stats()`` uses."""
        stats = {
            "allocated_bytes.all.current": self._allocated,
            "allocated_bytes.all.peak": self._peak_allocated,
            "reserved_bytes.all.current": self._reserved,
            "reserved_bytes.all.peak": self._peak_reserved,
            "active_bytes.all.current": self._allocated,
            "active_bytes.all.peak": self._peak_allocated,
            "requested_bytes.all.current": self._requested,
            "requested_bytes.all.peak": self._peak_requested,
            "inactive_split_bytes.all.current": self._inactive_split_bytes,
            "inactive_split_bytes.all.peak": self._peak_inactive_split_bytes,
            "inactive_split.all.current": self._inactive_split,
            "inactive_split.all.peak": self._peak_inactive_split,
            "segment.all.current": self._segments,
            "segment.all.peak": self._peak_segments,
            "allocation.all.current": self._allocations,
            "oversize_allocations.current": self._oversize_allocations,
            "oversize_segments.current": self._oversize_segments,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
        }
        for index, name in ((0, "small_pool"), (1, "large_pool")):
            stats[f"reserved_bytes.{name}.current"] = self._reserved_pool[index]
            stats[f"reserved_bytes.{name}.peak"] = self._peak_reserved_pool[index]
            stats[f"allocated_bytes.{name}.current"] = self._allocated_pool[index]
        return stats

    # -- pool bookkeeping ---------------------------------------------------------------------

    @staticmethod
    def _insert_free(pool: _Pool, b: _Block) -> None:
        key = (b.stream << _STREAM_SHIFT) | (b.size << _ADDR_BITS) | b.addr
        bisect.insort(pool.keys, key)
        pool.by_key[key] = b
        b.gc_base = pool.gc_calls

    @staticmethod
    def _remove_free(pool: _Pool, b: _Block) -> None:
        key = (b.stream << _STREAM_SHIFT) | (b.size << _ADDR_BITS) | b.addr
        keys = pool.keys
        del keys[bisect.bisect_left(keys, key)]
        del pool.by_key[key]

    @staticmethod
    def _insert_unmapped(pool: _Pool, b: _Block) -> None:
        key = (b.stream << _ADDR_BITS) | b.addr
        bisect.insort(pool.unmapped_keys, key)
        pool.unmapped[key] = b

    @staticmethod
    def _remove_unmapped(pool: _Pool, b: _Block) -> None:
        key = (b.stream << _ADDR_BITS) | b.addr
        keys = pool.unmapped_keys
        del keys[bisect.bisect_left(keys, key)]
        del pool.unmapped[key]

    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
        """Merge the free neighbour ``src`` into ``dst`` (in no pool list); returns its size."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._remove_free(src.pool, src)
        else:
            self._remove_unmapped(src.pool, src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _device_address(self, space: _AddressSpace, size: int) -> int:
        if self._addresses is not None:
            addr = next(self._addresses, None)
            if addr is not None:
                if not 0 <= addr < _ADDR_LIMIT:
                    raise VramscopeError(f"segment address {addr:#x} is out of range")
                return addr
            self._addresses = None
        return space.take(size)

    # -- stats helpers ------------------------------------------------------------------------

    def _grow_reserved(self, pool: _Pool, size: int) -> None:
        self._reserved += size
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved
        i = pool.index
        self._reserved_pool[i] += size
        if self._reserved_pool[i] > self._peak_reserved_pool[i]:
            self._peak_reserved_pool[i] = self._reserved_pool[i]
        self.num_device_alloc += 1

    def _shrink_reserved(self, pool: _Pool, size: int) -> None:
        self._reserved -= size
        self._reserved_pool[pool.index] -= size
        self.num_device_free += 1

    def _log(self, action: str, addr: int, size: int, stream: int) -> None:
        if self.segment_log is not None:
            self.segment_log.append((action, addr, size, stream))

    # -- allocation ---------------------------------------------------------------------------

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        cfg = self.config
        if self.allowed_bytes is not None and cfg.garbage_collection_threshold > 0.0:
            pool.gc_calls += 1
        keys = pool.keys
        n = len(keys)
        i = bisect.bisect_left(keys, (stream << _STREAM_SHIFT) | (size << _ADDR_BITS))
        if i == n or keys[i] >> _STREAM_SHIFT != stream:
            return None
        by_key = pool.by_key
        block = by_key[keys[i]]
        if block.seg is not None:
            if cfg.expandable_segments:
                # Best fit counts the unmapped space after a block as part of its size.
                j = i + 1
                while block.seg is not None and j < n and keys[j] >> _STREAM_SHIFT == stream:
                    candidate = by_key[keys[j]]
                    if _expandable_size(candidate) >= _expandable_size(block):
                        break
                    i, block = j, candidate
                    j += 1
            else:  # expandable segments switched off later: skip their blocks
                while True:
                    i += 1
                    if i == n:
                        return None
                    block = by_key[keys[i]]
                    if block.seg is None or keys[i] >> _STREAM_SHIFT != stream:
                        break
                if keys[i] >> _STREAM_SHIFT != stream:
                    return None
        max_split = cfg.max_split_size
        if size < max_split and block.size >= max_split:
            return None  # no oversize block for a request that could be split off
        if size >= max_split and block.size >= size + cfg.max_non_split_rounding_size:
            return None  # oversize blocks serve requests only within the rounding limit
        del by_key[keys[i]]
        del keys[i]
        return block

    def _new_block(self, pool: _Pool, size: int, rounded: int, stream: int) -> _Block:
        """A miss: collect garbage, ask the device, free cached memory and retry, or OOM."""
        cfg = self.config
        alloc_size = cfg.allocation_size(rounded)
        if self.allowed_bytes is not None and cfg.garbage_collection_threshold > 0.0:
            self._garbage_collect()
        block = self._alloc_block(pool, rounded, alloc_size, stream)
        if block is None and self._release_available_cached_blocks(pool, rounded, stream):
            block = self._alloc_block(pool, rounded, alloc_size, stream)
        if block is None:
            self._release_cached_blocks()
            self.num_alloc_retries += 1
            block = self._alloc_block(pool, rounded, alloc_size, stream)
        if block is None:
            self.num_ooms += 1
            limits = [x for x in (self.allowed_bytes, self.total_bytes) if x is not None]
            raise SimulatedOOM(
                size, alloc_size, stream, self._reserved, self._allocated, min(limits)
            )
        return block

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, stream: int) -> _Block | None:
        """Ask the device for memory: a new segment, or pages of an expandable segment."""
        if self.allowed_bytes is not None and self._reserved + alloc_size > self.allowed_bytes:
            return None
        if self.config.expandable_segments:
            return self._try_allocate_expandable(pool, size, stream)
        if self.total_bytes is not None and self._reserved + alloc_size > self.total_bytes:
            return None
        addr = self._device_address(self._device_space, alloc_size)
        block = _Block(addr, alloc_size, stream, pool, None)
        self._grow_reserved(pool, alloc_size)
        self._segments += 1
        if self._segments > self._peak_segments:
            self._peak_segments = self._segments
        if alloc_size >= self.config.max_split_size:
            self._oversize_segments += 1
        self._log("segment_alloc", addr, alloc_size, stream)
        return block

    # -- expandable segments ------------------------------------------------------------------

    def _find_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block:
        """The lowest-addressed free/unmapped run of this stream with ``size`` bytes of room."""
        keys = pool.unmapped_keys
        i = bisect.bisect_left(keys, stream << _ADDR_BITS)
        while i < len(keys) and keys[i] >> _ADDR_BITS == stream:
            candidate = pool.unmapped[keys[i]]
            before = candidate.prev
            if before is not None and not before.allocated:
                candidate = before
            room, b = 0, candidate
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return candidate
            i += 1
        page = SMALL_BUFFER if pool.small else self.config.large_segment_size
        total = self.device_total_bytes
        va_size = -(-(total + total // 8) // page) * page
        base = self._device_address(self._va_space, va_size)
        segment = _Expandable(base, va_size, page, stream)
        block = _Block(base, va_size, stream, pool, segment)
        block.mapped = False
        self._insert_unmapped(pool, block)
        return block

    def _map_block(self, block: _Block, size: int) -> bool:
        seg = block.seg
        assert seg is not None
        page = seg.page
        offset = block.addr - seg.base
        begin = offset // page
        end = -(-(offset + size) // page)
        mapped = (end - begin) * page
        if mapped == 0:
            return False
        if self.total_bytes is not None and self._reserved + mapped > self.total_bytes:
            return False
        pool = block.pool
        self._remove_unmapped(pool, block)
        block.mapped = True
        addr = block.addr
        if mapped < block.size:
            rest = _Block(addr + mapped, block.size - mapped, block.stream, pool, seg)
            rest.mapped = False
            rest.prev = block
            rest.next = block.next
            if rest.next is not None:
                rest.next.prev = rest
            block.next = rest
            self._insert_unmapped(pool, rest)
            block.size = mapped
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_free(pool, block)
        self._grow_reserved(pool, mapped)
        self._log("segment_map", addr, mapped, block.stream)
        return True

    def _try_allocate_expandable(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None and not following.mapped
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following  # it absorbed the free block before it
        self._remove_free(pool, candidate)
        return candidate

    def _unmap_block(self, block: _Block) -> None:
        seg = block.seg
        assert seg is not None
        page = seg.page
        offset = block.addr - seg.base
        begin = -(-offset // page)
        end = (offset + block.size) // page
        if begin >= end:
            return
        pool = block.pool
        self._remove_free(pool, block)
        start = seg.base + begin * page
        length = (end - begin) * page
        before = start - block.addr
        if before > 0:
            head = _Block(block.addr, before, block.stream, pool, seg)
            head.prev = block.prev
            if head.prev is not None:
                head.prev.next = head
            head.next = block
            block.prev = head
            self._insert_free(pool, head)
        after = block.size - before - length
        if after > 0:
            tail = _Block(start + length, after, block.stream, pool, seg)
            tail.next = block.next
            if tail.next is not None:
                tail.next.prev = tail
            tail.prev = block
            block.next = tail
            self._insert_free(pool, tail)
        block.addr = start
        block.size = length
        block.mapped = False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_unmapped(pool, block)
        self._shrink_reserved(pool, length)
        self._log("segment_unmap", start, length, block.stream)

    # -- giving memory back -------------------------------------------------------------------

    def _release_block(self, block: _Block) -> None:
        """``cudaFree`` an unsplit free segment."""
        pool = block.pool
        self._remove_free(pool, block)
        self._shrink_reserved(pool, block.size)
        self._segments -= 1
        if block.size >= self.config.max_split_size:
            self._oversize_segments -= 1
        self._device_space.give_back(block.addr)
        self._log("segment_free", block.addr, block.size, block.stream)

    def _release_blocks(self, pool: _Pool) -> None:
        to_unmap = []
        for key in list(pool.keys):
            block = pool.by_key[key]
            if block.seg is not None:
                to_unmap.append(block)
            elif block.prev is None and block.next is None:
                self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if block.prev is None and block.next is None and not block.mapped:
                self._remove_unmapped(pool, block)  # the whole reservation is free: drop it
                assert block.seg is not None
                self._va_space.give_back(block.seg.base)

    def _release_cached_blocks(self) -> None:
        self._release_blocks(self._large)
        self._release_blocks(self._small)

    def _release_available_cached_blocks(self, pool: _Pool, size: int, stream: int) -> bool:
        """Free oversize cached blocks, the smallest that suffices or the largest first."""
        max_split = self.config.max_split_size
        if max_split == UNLIMITED:
            return False
        target = max(size, max_split)
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream << _STREAM_SHIFT) | (target << _ADDR_BITS))
        if (
            i == len(keys)
            or keys[i] >> _STREAM_SHIFT != stream
            or pool.by_key[keys[i]].seg is not None
        ):
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < target:
                key = keys[i]
                if (key >> _STREAM_SHIFT) != stream or _key_size(key) < max_split:
                    break
                block = pool.by_key[key]
                if block.seg is None:
                    released += block.size
                    self._release_block(block)
                if i == 0:
                    break
                i -= 1
            return released >= target
        self._release_block(pool.by_key[keys[i]])
        return True

    def _garbage_collect(self) -> None:
        """Free old unsplit large cached blocks once reserved memory passes the threshold."""
        allowed = self.allowed_bytes
        assert allowed is not None
        threshold = int(self.config.garbage_collection_threshold * float(allowed))
        if self._reserved <= threshold:
            return
        target = self._reserved - threshold
        pool = self._large
        calls = pool.gc_calls
        total_age = 0
        count = 0
        for block in pool.by_key.values():
            if block.prev is None and block.next is None:
                total_age += calls - block.gc_base
                count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for key in list(pool.keys):
                block = pool.by_key[key]
                age = calls - block.gc_base
                if (
                    block.prev is None
                    and block.next is None
                    and block.seg is None
                    and age >= age_threshold
                ):
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(block)
