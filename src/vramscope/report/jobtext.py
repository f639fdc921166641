"""What a distributed job's report says in words (the imbalance, how the ranks' reports were
gathered, the distributed memory), shared by the terminal and the HTML page; it reads the
free-form ``distributed`` section, so anything of the wrong type there reads as missing."""

from __future__ import annotations

from typing import Any

from vramscope.report.freeform import number, records, text
from vramscope.units import format_bytes as b


def imbalance(job: dict[str, Any]) -> str | None:
    """``Imbalance (peak allocated): heaviest rank 1 1.2 GiB, lightest rank 0 ...``."""
    spread = job.get("imbalance")
    if not isinstance(spread, dict) or number(spread.get("max_bytes")) is None:
        return None
    what = "peak allocated" if spread.get("by") == "peak_allocated_bytes" else "peak host RSS"
    ratio = number(spread.get("max_over_min"))
    return (
        f"Imbalance ({what}): heaviest rank {text(spread.get('heaviest_rank'))} "
        f"{b(number(spread.get('max_bytes')))}, lightest rank "
        f"{text(spread.get('lightest_rank'))} {b(number(spread.get('min_bytes')))}: "
        + (f"{ratio:.2f}× " if ratio is not None else "")
        + f"(spread {b(number(spread.get('spread_bytes')))})"
    )


def gathering(job: dict[str, Any]) -> str | None:
    """How rank 0 gathered the reports: the channels, the time, who sent none, the folder."""
    got = job.get("gather")
    if not isinstance(got, dict):
        return None
    via = ", ".join(text(v) for v in _list(got.get("via"))) or "nothing but its own"
    words = f"Gathered by rank 0 via {via} in {number(got.get('seconds')) or 0:.2f} s"
    missing = _list(got.get("missing"))
    if missing:
        words += f"; no report from rank {', '.join(text(m) for m in missing)} within "
        words += f"{number(got.get('timeout_s')) or 0:g} s"
    if got.get("dir"):
        words += f"; each rank's own report in {text(got['dir'])}"
    return words


def per_rank(job: dict[str, Any]) -> str | None:
    """For a per-rank estimate: which rank was traced, and what the strategy sharded."""
    if job.get("estimated") is not True:
        return None
    traced = [text(r.get("rank")) for r in records(job.get("traced_ranks"))]
    words = f"Traced rank {' and '.join(traced) or text(job.get('rank'))} of {text(job.get('world_size'))}"
    words += f" ({text(job.get('description'))})"
    units = job.get("sharded_modules")
    if isinstance(units, dict):
        count = number(units.get("count")) or 0
        if count:
            words += (
                f"; fully_shard on {count:g} × {text(units.get('class'))} "
                f"({text(units.get('chosen_by'))}), then the root: "
                f"{text(job.get('groups'))} groups"
            )
        else:
            words += "; fully_shard on the root alone: one group"
    tp = job.get("tensor_parallel")
    if isinstance(tp, dict):
        words += (
            f"; tensor parallel over {text(tp.get('size'))} ranks ({text(tp.get('source'))}, "
            f"sequence parallel {'on' if tp.get('sequence_parallel') else 'off'}): "
            f"{text(tp.get('sharded_modules'))} modules split"
        )
        replicated = number(tp.get("replicated_modules")) or 0
        if replicated:
            words += f", {replicated:g} whole on every rank"
        for note in _list(tp.get("notes")):
            words += f"; {text(note)}"
    ep = job.get("expert_parallel")
    if isinstance(ep, dict):
        exchanged = ep.get("exchange_bytes_per_layer")
        exchanged = exchanged if isinstance(exchanged, dict) else {}
        words += (
            f"; experts {text(ep.get('local_experts'))} of {text(ep.get('experts_per_layer'))} "
            f"in each of {text(ep.get('layers'))} MoE layers; routing "
            f"{text(ep.get('routing'))}; all-to-all per layer in forward: dispatch "
            f"{b(number(exchanged.get('dispatch')))} received, combine "
            f"{b(number(exchanged.get('combine')))} received"
        )
    cp = job.get("context_parallel")
    if isinstance(cp, dict):
        words += (
            f"; {text(cp.get('local_sequence'))} of {text(cp.get('sequence'))} tokens of each "
            f"sequence on this rank; attention: {text(cp.get('attention'))}"
        )
    host = job.get("host_bytes")
    if isinstance(host, dict):
        total = sum(number(v) or 0 for v in host.values())
        words += f"; offloaded to host memory: {b(total)}"
    return words


def roles(job: dict[str, Any]) -> list[dict[str, str]]:
    """A per-rank estimate's ranks by role: which ranks share a row, where they sit in the
    mesh, which rank was traced for them, and their peaks (a role not traced says which
    traced rank it is like)."""
    rows = []
    for role in records(job.get("roles")):
        peak = role.get("peak") if isinstance(role.get("peak"), dict) else {}
        traced = role.get("traced_rank")
        if traced is not None:
            how = f"rank {text(traced)}"
        elif role.get("like_rank") is not None:
            how = f"not traced (as rank {text(role.get('like_rank'))}, less optimizer state)"
        else:
            how = "not traced"
        state = number(role.get("optimizer_state_bytes"))
        rows.append(
            {
                "ranks": text(role.get("ranks")),
                "count": text(role.get("count")),
                "tp": text(role.get("tp_ranks")) if role.get("tp_ranks") is not None else "",
                "dp": text(role.get("dp_ranks")),
                "traced": how,
                "allocated": b(number(peak.get("allocated_bytes"))) if peak else "",
                "reserved": b(number(peak.get("reserved_bytes"))) if peak else "",
                "device_used": b(number(peak.get("device_used_bytes"))) if peak else "",
                "optimizer_state": b(state) if state is not None else "",
                "heaviest": "heaviest" if traced is not None and traced == job.get("rank") else "",
                "stage": text(role.get("stage")) if role.get("stage") is not None else "",
                "holds": "; ".join(text(h) for h in _list(role.get("holds"))),
                "in_flight": ", ".join(text(n) for n in _list(role.get("in_flight"))),
            }
        )
    return rows


def memory(job: dict[str, Any]) -> list[dict[str, str]]:
    """Each piece of distributed memory: its label, its size in words, its note."""
    items = []
    for item in records(job.get("memory")):
        size = b(number(item.get("bytes")))
        total = number(item.get("total_bytes"))
        if item.get("name") == "ddp_gradient_buckets":
            size += f" in {text(item.get('buckets'))} bucket(s)"
        elif total is not None:
            size += f" (largest of {text(item.get('groups'))} groups; {b(total)} in all)"
        if item.get("category"):
            size += f", inside '{text(item['category'])}'"
        items.append(
            {
                "label": text(item.get("label") or item.get("name")),
                "size": size,
                "note": text(item.get("note")),
            }
        )
    return items


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
