"""Out of memory: where the run ran out, what was asked for, and what filled the device."""

from __future__ import annotations

from vramscope.report.html.blocks import Section, table
from vramscope.report.model import Report
from vramscope.units import format_bytes as b


def section(report: Report) -> Section | None:
    """The OOM's message, numbers and the largest blocks, when the run ran out of memory."""
    oom = report.oom
    if oom is None:
        return None
    items = [
        ("phase", oom.phase),
        ("step", oom.step),
        ("module", oom.module),
        ("requested", b(oom.requested_bytes) if oom.requested_bytes is not None else None),
        ("allocated", b(oom.allocated_bytes) if oom.allocated_bytes is not None else None),
        ("reserved", b(oom.reserved_bytes) if oom.reserved_bytes is not None else None),
        (
            "stuck in fragments",
            b(oom.fragmentation_bytes) if oom.fragmentation_bytes is not None else None,
        ),
        ("free on the device", b(oom.free_bytes) if oom.free_bytes is not None else None),
        ("device total", b(oom.total_bytes) if oom.total_bytes is not None else None),
        (
            "other processes",
            b(oom.other_processes_bytes) if oom.other_processes_bytes is not None else None,
        ),
        (
            "largest free block",
            b(oom.largest_free_block_bytes) if oom.largest_free_block_bytes is not None else None,
        ),
    ]
    blocks = None
    if oom.largest_blocks:
        keys = sorted({k for blk in oom.largest_blocks if isinstance(blk, dict) for k in blk})
        rows = [
            [
                b(blk[k])
                if k.endswith("bytes") and isinstance(blk.get(k), int)
                else str(blk.get(k, ""))
                for k in keys
            ]
            for blk in oom.largest_blocks[:20]
            if isinstance(blk, dict)
        ]
        blocks = table(keys, rows)
    return Section(
        "oom.html",
        "oom",
        "Out of memory",
        "Out of memory",
        "Where the run ran out of memory, and what filled it.",
        {
            "message": oom.message or "",
            "entries": [(k, str(v)) for k, v in items if v is not None],
            "largest_blocks": blocks,
        },
    )
