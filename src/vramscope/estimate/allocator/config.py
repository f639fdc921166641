"""The caching allocator's options (``PYTORCH_CUDA_ALLOC_CONF`` syntax) and size constants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramscope.errors import VramscopeError

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is a multiple of this
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request of the small pool (1 MiB)
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small-pool segments (and expandable pages), 2 MiB
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests below this share 20 MiB segments
ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests get segments rounded up to 2 MiB
LARGE_BUFFER = 20 << 20  # kLargeBuffer: default large segment / expandable large page, 20 MiB
MIB = 1 << 20
UNLIMITED = (1 << 64) - 1  # SIZE_MAX, the allocator's "no max_split_size"

_ROUNDUP_INTERVALS = 16  # one per power of two from 1 MiB to 64 GiB
_ROUNDUP_FIRST_LOG2 = 20


# Options the device allocator reads and this simulator models.
_MODELLED_KEYS = (
    "backend",
    "expandable_segments",
    "garbage_collection_threshold",
    "large_segment_size_mb",
    "max_non_split_rounding_mb",
    "max_split_size_mb",
    "roundup_power2_divisions",
)
# Options torch accepts that do not change device-memory behaviour (pinned host memory, locking,
# CUDA-graph stream reuse): accepted and kept in ``AllocatorConfig.ignored``.
_IGNORED_KEYS = (
    "graph_capture_record_stream_reuse",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_use_background_threads",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
)


# --------------------------------------------------------------------------------------------
# Options


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _tokenize(text: str) -> list[str]:
    """Split an option string into names, values and the punctuation ``, : [ ]``."""
    tokens: list[str] = []
    word: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        elif not ch.isspace():
            word.append(ch)
    if word:
        tokens.append("".join(word))
    return tokens


def _bad(text: str, why: str) -> VramscopeError:
    return VramscopeError(f"allocator option string {text!r}: {why}")


def _int_value(text: str, key: str, value: object) -> int:
    if not isinstance(value, str) or not value.isdigit():
        raise _bad(text, f"{key} takes a whole number, got {value!r}")
    return int(value)


def _bool_value(text: str, key: str, value: object) -> bool:
    if value not in ("True", "False"):
        raise _bad(text, f"{key} takes True or False (capitalized), got {value!r}")
    return value == "True"


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's options, as ``PYTORCH_CUDA_ALLOC_CONF`` sets them.

    Sizes are in bytes.  ``AllocatorConfig.parse(text)`` reads the environment variable's syntax.
    """

    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = LARGE_BUFFER
    large_segment_size: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * _ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    backend: str = "native"
    ignored: tuple[tuple[str, str], ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, text: str | None) -> AllocatorConfig:
        """Parse e.g. ``"expandable_segments:True,max_split_size_mb:128"``.

        Follows torch's parser: ``max_split_size_mb`` and ``max_non_split_rounding_mb`` must be
        at least ``large_segment_size_mb`` (20), ``garbage_collection_threshold`` lies in
        (0, 1), ``roundup_power2_divisions`` is a power of two or a list
        ``[64:8,256:4,>:1]`` (interval start in MiB: divisions).  Unknown keys and malformed
        values raise :class:`~vramscope.errors.VramscopeError`.
        """
        if text is None or not text.strip():
            return cls(text=text or "")
        entries = _parse_entries(text)
        values: dict[str, object] = {}
        ignored: list[tuple[str, str]] = []
        for key, value in entries:
            if key in _MODELLED_KEYS:
                values[key] = value
            elif key in _IGNORED_KEYS:
                ignored.append((key, value if isinstance(value, str) else str(value)))
            else:
                known = ", ".join(sorted(_MODELLED_KEYS + _IGNORED_KEYS))
                raise _bad(text, f"unknown option {key!r} (known: {known})")

        large_segment = LARGE_BUFFER
        if "large_segment_size_mb" in values:
            mb = _int_value(text, "large_segment_size_mb", values["large_segment_size_mb"])
            if mb <= MIN_LARGE_ALLOC // MIB:
                raise _bad(text, f"large_segment_size_mb must be > {MIN_LARGE_ALLOC // MIB}")
            large_segment = mb * MIB
        min_mb = large_segment // MIB

        max_split = UNLIMITED
        if "max_split_size_mb" in values:
            mb = _int_value(text, "max_split_size_mb", values["max_split_size_mb"])
            if mb < min_mb:
                raise _bad(text, f"max_split_size_mb must be >= {min_mb}, got {mb}")
            max_split = min(mb, UNLIMITED // MIB) * MIB

        non_split = large_segment
        if "max_non_split_rounding_mb" in values:
            mb = _int_value(text, "max_non_split_rounding_mb", values["max_non_split_rounding_mb"])
            if mb < min_mb:
                raise _bad(text, f"max_non_split_rounding_mb must be >= {min_mb}, got {mb}")
            non_split = min(mb, UNLIMITED // MIB) * MIB

        gc = 0.0
        if "garbage_collection_threshold" in values:
            raw = values["garbage_collection_threshold"]
            try:
                gc = float(raw)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                why = f"garbage_collection_threshold takes a number, got {raw!r}"
                raise _bad(text, why) from None
            if not 0.0 < gc < 1.0:
                raise _bad(text, f"garbage_collection_threshold must lie in (0, 1), got {raw}")

        divisions = (0,) * _ROUNDUP_INTERVALS
        if "roundup_power2_divisions" in values:
            divisions = _parse_divisions(text, values["roundup_power2_divisions"])

        expandable = False
        if "expandable_segments" in values:
            expandable = _bool_value(text, "expandable_segments", values["expandable_segments"])

        backend = "native"
        if "backend" in values:
            backend = str(values["backend"])
            if backend not in ("native", "cudaMallocAsync"):
                raise _bad(text, f"backend is native or cudaMallocAsync, got {backend!r}")

        for key, value in ignored:
            if key.startswith(("release_lock", "pinned_use", "graph_capture")):
                _bool_value(text, key, value)
            else:
                _int_value(text, key, value)

        return cls(
            max_split_size=max_split,
            max_non_split_rounding_size=non_split,
            large_segment_size=large_segment,
            roundup_power2_divisions=divisions,
            garbage_collection_threshold=gc,
            expandable_segments=expandable,
            backend=backend,
            ignored=tuple(ignored),
            text=text,
        )

    # -- the size rules --------------------------------------------------------------------

    def divisions_for(self, size: int) -> int:
        """The ``roundup_power2_divisions`` value that applies to a request of ``size`` bytes."""
        index = size.bit_length() - 1 - _ROUNDUP_FIRST_LOG2
        if index < 0:
            index = 0
        elif index >= _ROUNDUP_INTERVALS:
            index = _ROUNDUP_INTERVALS - 1
        return self.roundup_power2_divisions[index]

    def round_size(self, size: int) -> int:
        """The block size the allocator hands out for a request of ``size`` bytes."""
        if size < MIN_BLOCK_SIZE:
            return MIN_BLOCK_SIZE
        divisions = self.divisions_for(size)
        if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
            return _roundup_power2_next_division(size, divisions)
        return (size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE * MIN_BLOCK_SIZE

    def allocation_size(self, rounded: int) -> int:
        """The size of the segment a miss asks the device for, given the rounded request."""
        if rounded <= SMALL_SIZE:
            return SMALL_BUFFER
        if rounded < MIN_LARGE_ALLOC:
            return self.large_segment_size
        return (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE

    def __str__(self) -> str:
        return self.text


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if _is_power_of_two(size):
        return size
    floor_pow2 = 1 << (size.bit_length() - 1)
    step = floor_pow2 >> (divisions.bit_length() - 1)
    if step == 0:
        return floor_pow2 << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def _parse_entries(text: str) -> list[tuple[str, Any]]:
    tokens = _tokenize(text)
    entries: list[tuple[str, Any]] = []
    i, n = 0, len(tokens)
    while i < n:
        key = tokens[i]
        if key in ",:[]":
            raise _bad(text, f"expected an option name, found {key!r}")
        if i + 1 >= n or tokens[i + 1] != ":":
            raise _bad(text, f"expected ':' after {key!r}")
        i += 2
        if i >= n or tokens[i] in ",:]":
            raise _bad(text, f"missing value for {key!r}")
        value: Any
        if tokens[i] == "[":
            items: list[tuple[str, str]] = []
            i += 1
            while i < n and tokens[i] != "]":
                if i + 2 >= n or tokens[i + 1] != ":" or tokens[i + 2] in ",:[]":
                    raise _bad(text, f"list items of {key!r} are written as start:value")
                items.append((tokens[i], tokens[i + 2]))
                i += 3
                if i < n and tokens[i] == ",":
                    i += 1
            if i >= n:
                raise _bad(text, f"missing ']' in the value of {key!r}")
            value = items
            i += 1
        else:
            value = tokens[i]
            i += 1
        entries.append((key, value))
        if i < n:
            if tokens[i] != ",":
                raise _bad(text, f"expected ',' after the value of {key!r}, found {tokens[i]!r}")
            i += 1
    return entries


def _parse_divisions(text: str, value: object) -> tuple[int, ...]:
    key = "roundup_power2_divisions"
    if isinstance(value, str):
        divisions = _int_value(text, key, value)
        if not _is_power_of_two(divisions):
            raise _bad(text, f"{key} must be a power of two, got {divisions}")
        return (divisions,) * _ROUNDUP_INTERVALS
    table = [0] * _ROUNDUP_INTERVALS
    first = True
    last = 0
    for start, raw in value:  # type: ignore[attr-defined]
        divisions = _int_value(text, key, raw)
        if divisions != 0 and not _is_power_of_two(divisions):
            raise _bad(text, f"{key} values must be 0 or a power of two, got {divisions}")
        if start == ">":
            for j in range(last + 1, _ROUNDUP_INTERVALS):
                table[j] = divisions
            continue
        boundary = _int_value(text, key, start)
        if not _is_power_of_two(boundary):
            raise _bad(text, f"{key} interval starts (MiB) must be powers of two, got {boundary}")
        index = min(boundary.bit_length() - 1, _ROUNDUP_INTERVALS - 1)
        if first:
            for j in range(index):
                table[j] = divisions
            first = False
        table[index] = divisions
        last = index
    return tuple(table)
