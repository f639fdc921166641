"""A simulator of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``).

Feed it the sequence of allocations and frees a run makes -- ``(size, stream)`` requests and
the frees of those blocks -- and it tells what the real allocator would hold: allocated,
reserved, active, requested and inactive-split bytes, their peaks, the number of segments,
``num_alloc_retries``, and an out-of-memory error when a memory cap is given.  It is written
from reading the allocator's source (torch 2.4 … 2.1x); nothing of it is copied.

What is modelled, rule by rule (names in parentheses are the C++ constants):

* Rounding: requests round up to 512 B (``kMinBlockSize``); with ``roundup_power2_divisions``
  requests above ``512 B × divisions`` round up to the next of N equal steps between two powers
  of two (per power-of-two interval from 1 MiB to 64 GiB when a list is given).
* Pools: rounded sizes up to 1 MiB (``kSmallSize``) live in the small pool, carved from 2 MiB
  segments (``kSmallBuffer``); larger ones in the large pool: requests below 10 MiB
  (``kMinLargeAlloc``) get a 20 MiB segment (``kLargeBuffer``, or ``large_segment_size_mb``),
  larger requests a segment of the request rounded up to 2 MiB (``kRoundLarge``).  Free blocks
  are kept per pool, ordered by ``(stream, size, address)``: a block is only reused by the
  stream that allocated it.
* Best fit: the smallest free block of the same stream that is large enough (lowest address on
  a tie).  Blocks of ``max_split_size_mb`` or more ("oversize") are never split, serve no request
  below that size, and serve larger requests only when they are less than
  ``max_non_split_rounding_mb`` (default 20 MiB) bigger than the request.
* Splitting: a small-pool block is split when at least 512 B remain, a large-pool block when
  more than 1 MiB remains (and the request is below ``max_split_size``); with expandable
  segments every block is split when 512 B remain.
* Freeing: a freed block merges with its free neighbours of the same segment.
* A miss: garbage collection first (only with ``garbage_collection_threshold`` and a fraction
  cap), then a new segment (``cudaMalloc``).  When the cap would be exceeded: free oversize
  cached blocks until enough is freed (only with ``max_split_size_mb``) and try again; then free
  every unsplit cached segment (and unmap every free page of expandable segments) and try a last
  time -- that last try counts in ``num_alloc_retries``; then out of memory (``num_ooms``).
* ``expandable_segments:True``: one segment per (stream, pool) reserves virtual address space
  (1⅛ × the device's memory) and maps physical pages as needed -- 2 MiB pages for the small pool,
  20 MiB (``large_segment_size_mb``) pages for the large pool -- at the lowest address where the
  request fits; ``empty_cache()`` and the out-of-memory path unmap the free whole pages.
  Reserved bytes are the mapped pages.
* ``empty_cache()`` releases every unsplit free segment and every free page.
* Statistics follow ``torch.cuda.memory_stats()``: ``memory_stats()`` returns the same keys.

Caps: ``allowed_bytes`` is the cap ``torch.cuda.set_per_process_memory_fraction`` sets
(``int(fraction × total device memory)``): the allocator checks it before asking the device,
with the segment size it would ask for, and it also switches on ``garbage_collection_threshold``.
``total_bytes`` is the physical memory the device can still give the allocator: a ``cudaMalloc``
or a page mapping that would take reserved memory above it fails.

Not modelled: ``record_stream`` (a block used by another stream is returned to its pool when it
is freed, not when that stream's work is done -- cross-stream frees are treated as immediate);
CUDA-graph private memory pools and ``torch.cuda.MemPool``; ``backend:cudaMallocAsync``; free
memory callbacks; memory other processes or the CUDA context take (give ``total_bytes`` net of
them); and the addresses the driver returns, which decide ties between equally sized free
blocks: by default new segments take the lowest free address range that fits (a first-fit model
of the driver), or pass ``segment_addresses`` to replay the addresses a real run got.

The package: :mod:`.config` (the options, ``PYTORCH_CUDA_ALLOC_CONF`` syntax, and the
allocator's size constants), :mod:`.simulator` (:class:`CachingAllocatorSim`),
:mod:`.replay` (:func:`replay` of an event sequence, and events from a recorded allocator
trace).
"""

from vramscope.estimate.allocator.config import (
    LARGE_BUFFER,
    MIB,
    MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    UNLIMITED,
    AllocatorConfig,
)
from vramscope.estimate.allocator.replay import (
    DeviceTraceEvents,
    ReplayResult,
    events_from_device_trace,
    replay,
)
from vramscope.estimate.allocator.simulator import (
    BlockInfo,
    CachingAllocatorSim,
    SegmentInfo,
    SimulatedOOM,
)

__all__ = [
    "LARGE_BUFFER",
    "MIB",
    "MIN_BLOCK_SIZE",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "SMALL_BUFFER",
    "SMALL_SIZE",
    "UNLIMITED",
    "AllocatorConfig",
    "BlockInfo",
    "CachingAllocatorSim",
    "DeviceTraceEvents",
    "ReplayResult",
    "SegmentInfo",
    "SimulatedOOM",
    "events_from_device_trace",
    "replay",
]
