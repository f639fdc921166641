"""The sentences of a fit's answer, written once from its ``fit`` section: the terminal, the
HTML page and the report's findings all say the answer, the target it fits and how it was
found in these words. Pure (no torch, no rich): a section loaded from a saved file works
too, and a field of the wrong type reads as missing."""

from __future__ import annotations

from typing import Any

from vramscope.fit.answer import final_answer
from vramscope.report.freeform import mapping, number, text
from vramscope.report.words import a, count, plural, ranges, signed_pct
from vramscope.units import format_bytes, format_percent


def _answer(section: dict[str, Any]) -> dict[str, Any]:
    answer = section.get("answer")
    return answer if isinstance(answer, dict) else final_answer(section)


def _margin(section: dict[str, Any]) -> float:
    return number(mapping(section.get("target")).get("margin")) or 0


def gpu_name(target: dict[str, Any]) -> str:
    """The GPU of a target, as the device calls itself (its profile name in older files)."""
    return text(target.get("gpu_name") or target.get("gpu")) or "the GPU"


def answer_line(section: dict[str, Any]) -> str:
    """The answer: ``Largest batch size: 1,669``; ``… at least 1,024 (the search's cap)``
    when the cap bound it; what batch size 1 needs when nothing fits; per GPU for a rank of
    a job; the longest sequence for ``--seq-len``."""
    if "max_seq_len" in section:
        return _sequence_line(section)
    answer = _answer(section)
    best = number(answer.get("max_batch_size"))
    per_rank = mapping(section.get("per_rank"))
    what = "Largest batch size per GPU" if per_rank else "Largest batch size"
    if best == 0:
        return _nothing_fits(section, "batch size 1", "needed_at_batch_1_bytes")
    shown = count(best) if best is not None else "?"
    capped = answer.get("source") != "verify" and section.get("capped") and best is not None
    if capped:
        shown = f"at least {shown} (the search's cap; --max-batch-size to look further)"
    line = f"{what}: {shown}"
    # the data-parallel ranks each take a micro-batch (a tensor-parallel group shares one)
    world = number(per_rank.get("dp_size")) or number(per_rank.get("world_size"))
    if per_rank.get("pp") and best is not None:
        stage = per_rank.get("most_loaded_stage")
        line = line.replace("Largest batch size per GPU", "Largest micro-batch")
        line += (
            f" for the most loaded stage{f' ({text(stage)})' if stage is not None else ''} "
            f"({text(per_rank.get('summary'))}: "
            f"{count(number(per_rank.get('job_batch_size')) or 0)} samples a step)"
        )
    elif per_rank and best is not None and world is not None:
        line += (
            f" ({text(per_rank.get('summary'))}: {count(best * world)} samples a step over the job)"
        )
    return line


def _sequence_line(section: dict[str, Any]) -> str:
    best = number(section.get("max_seq_len"))
    new = number(section.get("new_tokens"))
    batch = f" at batch {count(number(section.get('batch_size')))}"
    if best == 0:
        step = number(section.get("step")) or 16
        what = "prompt length" if new else "sequence length"
        return _nothing_fits(section, f"{what} {count(step)}", "needed_at_shortest_bytes")
    shown = count(best) if best is not None else "?"
    note = ""
    if section.get("capped"):
        cap_from = section.get("cap_from")
        if cap_from == "positions":
            note = " (the longest the model's positions allow)"
        else:
            shown = f"at least {shown}"
            note = (
                " (the search's cap, --max-seq-len)"
                if cap_from == "option"
                else " (the search's cap; --max-seq-len to look further)"
            )
    if new:
        total = f" + {count(new)} new = {count((best or 0) + new)} tokens" if best else ""
        return f"Longest prompt: {shown}{total}{batch}{note}"
    return f"Longest sequence: {shown} tokens{batch}{note}"


def _nothing_fits(section: dict[str, Any], smallest: str, key: str) -> str:
    target = mapping(section.get("target"))
    line = f"Does not fit, even at {smallest}"
    needed = number(section.get(key))
    if needed is not None:
        line += (
            f": it needs {format_bytes(needed)}, the target allows "
            f"{format_bytes(number(target.get('usable_bytes')))}"
        )
    params = number(section.get("parameters_bytes"))
    usable = number(target.get("usable_bytes"))
    if params is not None and usable is not None and params > usable:
        line += f" (the parameters alone take {format_bytes(params)})"
    closest = mapping(section.get("closest_strategy"))
    if closest.get("name"):
        line += (
            f"; closest strategy: {text(closest['name'])} at "
            f"{format_bytes(number(closest.get('value_bytes')))}"
        )
    return line


def target_line(section: dict[str, Any]) -> str:
    """What must fit, with the margin, and which option decided it: a GPU's memory (device
    used, as nvidia-smi shows it), or a budget (what the allocator may reserve), where the
    GPU only gives the kernels and the CUDA context."""
    target = mapping(section.get("target"))
    if number(target.get("limit_bytes")) is None or number(target.get("usable_bytes")) is None:
        return ""  # a section saved without its target
    margin = _margin(section)
    limit = format_bytes(number(target.get("limit_bytes")))
    usable = format_bytes(number(target.get("usable_bytes")))
    kept = f"{format_percent(margin)} margin kept free" if margin else "no margin"
    if target.get("kind") == "budget":
        gpu = gpu_name(target)
        line = f"fits {a(limit)} budget: reserved ≤ {usable} ({kept}); "
        total = number(target.get("gpu_total_bytes"))
        given = target.get("gpu_given")
        if given is False:
            return line + f"kernels and CUDA context of {gpu}, the default GPU (--gpu to choose)"
        if given is None:  # a file saved before the target said
            return line + f"kernels and CUDA context of {gpu}"
        shown = f" {format_bytes(total)} of" if total is not None else ""
        return (
            line + f"the budget is the limit, not the{shown} {gpu}, which gives the kernels "
            "and the CUDA context"
        )
    gpu = gpu_name(target)
    if target.get("gpu_given") is False:
        gpu += ", the default GPU (--gpu to choose)"
    return f"fits {gpu}: device used ≤ {usable} (its {limit}, {kept})"


def method_line(section: dict[str, Any]) -> str:
    """How the answer was found: the estimates (and the answer without the margin), or the
    real trials with the estimate's answer beside them."""
    answer = _answer(section)
    key = "max_seq_len" if "max_seq_len" in section else "max_batch_size"
    estimates = plural(number(section.get("estimates")) or 0, "estimate")
    estimated = count(number(section.get(key)))
    without = number(section.get(f"{key}_without_margin"))
    margin = _margin(section)
    if answer.get("source") == "verify":
        limit = "budget" if mapping(section.get("target")).get("kind") == "budget" else "GPU memory"
        trials = number(answer.get("real_trials")) or 0
        return (
            f"verified with {plural(trials, 'real trial')} at the full {limit}; the estimate "
            f"said {estimated} with the {format_percent(margin)} margin, {count(without)} without, from "
            f"{estimates}"
        )
    if number(section.get("estimates")) is None:
        return ""  # a section saved without how it was found
    line = f"from the estimator, {estimates}"
    if margin and without:
        capped = without == number(section.get("search_cap")) and without != 0
        line = f"without the margin: {'at least ' * capped}{count(without)} · " + line
    return line


def not_verified_line(section: dict[str, Any]) -> str | None:
    """Why ``--verify`` gave no answer (a trial crashed), when it did not."""
    verify = section.get("verify")
    if (
        isinstance(verify, dict)
        and verify.get("error")
        and _answer(section).get("source") != "verify"
    ):
        return f"Not verified: {text(verify['error'])}; the answer is the estimate's"
    return None


def not_monotone_line(section: dict[str, Any]) -> str | None:
    """Where memory is not monotone in the size searched: the one above the answer runs
    out, yet larger ones estimated fit; named, as runs."""
    above = [r for r in section.get("fits_above") or [] if isinstance(r, list) and len(r) == 2]
    if not above:
        return None
    sequence = "max_seq_len" in section
    best = number(section.get("max_seq_len" if sequence else "max_batch_size")) or 0
    step = (number(section.get("step")) or 16) if sequence else 1
    fitting = (
        sum(b - a + 1 for a, b in above)
        if not sequence
        else sum((b - a) // step + 1 for a, b in above)
    )
    what = "sequence length" if sequence else "batch size"
    return (
        f"memory is not monotone in the {what} here: {what} {count(best + step)} runs out, "
        f"yet {plural(fitting, 'larger ' + what)} estimated fit ({ranges(above, limit=4)}); "
        f"the answer is the largest {what} that fits with every smaller one (an epoch's "
        "last, smaller batch must fit too)"
    )


def is_warning(line: str) -> bool:
    """Whether a headline line is one of its warnings (not verified, not monotone) rather
    than the answer's target or method."""
    return line.startswith(("Not verified", "memory is not monotone"))


def headline_lines(section: dict[str, Any]) -> list[str]:
    """The fit's answer as the terminal and the HTML page lead with it: the answer, the
    target, how it was found, then why it is not verified or not monotone, where so."""
    lines = [answer_line(section)]
    lines += [line for line in (target_line(section), method_line(section)) if line]
    lines += [line for line in (not_verified_line(section), not_monotone_line(section)) if line]
    return lines


def change_header(rows: list[dict[str, Any]]) -> str:
    """The heading of the column that compares each strategy's reserved memory with the
    first row's: ``vs baseline``."""
    first = next((r for r in rows if "peak" in r), rows[0] if rows else {})
    return f"vs {text(first.get('name')) or 'the first'}"


def reserved_change(row: dict[str, Any], first: dict[str, Any] | None = None) -> str:
    """A strategy's reserved memory against the first row's, signed as a change: ``-54.4%``
    (less), ``+0.9%`` (more); blank where it was not estimated. From the row's
    ``saving_pct`` (what ``compare`` computed), or from the two peaks in a file without it."""
    saving = number(mapping(row.get("saving_pct")).get("reserved_bytes"))
    if saving is None and first is not None:
        base = number(mapping(first.get("peak")).get("reserved_bytes"))
        value = number(mapping(row.get("peak")).get("reserved_bytes"))
        if base and value is not None:
            saving = 100 * (base - value) / base
    return signed_pct(-saving if saving is not None else None)


def compare_headline(section: dict[str, Any]) -> str:
    """What ``compare``'s "fits" column means, with the defaults that decide it: ``A row
    fits NVIDIA H200, the default GPU (--gpu to choose): device used ≤ 132.81 GiB …``."""
    return f"A row {target_line(section)}"
