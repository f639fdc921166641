"""``compare``: the strategies (AMP, checkpointing, accumulation, allocator settings, model
variants, and per rank the distributed strategies) side by side, estimated or measured.

Each strategy is estimated through ``search.Estimator``; with ``measured`` each also runs
in a fresh process. Returns a Report whose ``compare`` section holds the rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vramscope.errors import VramscopeError
from vramscope.fit.search import (
    DEFAULT_GPU,
    Estimator,
    Progress,
    Target,
    _peak_dict,
    _target_section,
    make_target,
)
from vramscope.fit.strategies import NotApplicable, Strategy, default_strategies, get_strategy
from vramscope.fit.trial import run_trial
from vramscope.report.model import Finding, Report
from vramscope.stops import partial_on_stop
from vramscope.units import format_bytes

if TYPE_CHECKING:
    from vramscope.distributed.sharding import ParallelPlan


def compare(
    workloads: list[str],
    batch_size: int,
    gpu: str | None = None,
    budget: str | int | None = None,
    margin: str | float | None = None,
    strategies: list[str] | None = None,
    precision: str | None = None,
    accumulate: int | None = None,
    allocator_config: str | None = None,
    measured: bool | None = None,
    progress: Progress | None = None,
    parallel: ParallelPlan | None = None,
    parallel_each: bool = False,
) -> Report:
    """Strategies side by side (one workload), or model variants (several workloads).

    With ``parallel``, every row is one rank of that job (the batch size per GPU); with
    ``parallel_each`` too, the rows are the data-parallel strategies themselves (DDP, ZeRO,
    FSDP, HSDP at ``parallel``'s world size and settings) and ``strategies`` picks them."""
    if not workloads:
        raise VramscopeError("give at least one workload to compare")
    target = make_target(gpu, budget, margin, default_gpu=DEFAULT_GPU)
    if parallel is not None:
        measured = False  # one GPU here cannot run the job's ranks
        if parallel_each and len(workloads) > 1:
            raise VramscopeError(
                "model variants side by side with --world-size need --strategy: the one "
                "every variant runs"
            )
    if measured is None:
        import torch

        measured = torch.cuda.is_available()
    rows_to_do = _compared(workloads, strategies, parallel, parallel_each)
    rows: list[dict[str, Any]] = []
    reports: dict[str, Report] = {}

    def partial() -> Report | None:
        """The rows compared before a stop: each as far as it got."""
        done = next(iter(reports.values()), None)
        if done is None:
            return None
        finished = [r for r in rows if "peak" in r or "skipped" in r]
        _savings(finished, target)
        done.extra["fit"] = {
            "strategies": finished,
            "interrupted": True,
            "target": _target_section(target),
            "batch_size": batch_size,
            "method": "measured" if measured else "estimated",
        }
        return done

    with partial_on_stop(partial):
        for spec, label, strategy, plan, description, cost in rows_to_do:
            name = strategy.name
            row: dict[str, Any] = {
                "name": label,
                "strategy": name,
                "workload": spec,
                "description": description,
                "cost": cost,
                "measured": bool(measured),
            }
            rows.append(row)  # filled in below; a stop keeps it when it has its peak
            if plan is not None:
                row["parallel"] = plan.strategy
            try:
                strategy.micro_batch(batch_size)
                if plan is not None:
                    try:
                        plan.check()
                    except VramscopeError as exc:
                        raise NotApplicable(str(exc)) from None
                est = Estimator(
                    spec, target, strategy, precision, accumulate, allocator_config, parallel=plan
                )
                report = est.report(batch_size)
                reports[label] = report
                row["estimated_peak"] = _peak_dict(report)
                row["peak"] = dict(row["estimated_peak"])
                # as fit judges a batch: it must not run out, nor (within a margin) run short
                row["fits"] = est.fits(batch_size)
                needs = None if row["fits"] else _needs(est, report, batch_size)
                if needs is not None:
                    # it runs out: its figures, its saving and the closest row are what it
                    # needs on a large enough device, not the bytes where it ran out
                    row["peak"] = needs
                    row["runs_out"] = True
                if plan is not None:  # what a rank holds of the model, by strategy
                    cats = report.categories_at_peak
                    row["model_state"] = {
                        "parameters_bytes": cats.parameters,
                        "optimizer_state_bytes": cats.optimizer_state,
                    }
                if measured:
                    trial = run_trial(
                        spec,
                        batch_size,
                        strategy=name,
                        precision=precision,
                        accumulate=accumulate,
                        allocator_config=allocator_config,
                    )
                    row["trial_status"] = trial.status
                    if trial.status == "fits":
                        row["peak"] = trial.peak
                        row["step_time_s"] = trial.step_time_s
                        row["fits"] = (target.measure_of(trial.peak) or 0) <= target.usable_bytes
                    else:
                        row["error"] = trial.error
                        row["fits"] = False
                if progress:
                    progress(f"{label}: {format_bytes(target.measure_of(row['peak']))}")
            except NotApplicable as exc:
                row["skipped"] = str(exc)
            except VramscopeError as exc:
                row["skipped"] = f"could not be estimated: {exc}"
    _savings(rows, target)
    recommendation = _recommend(rows, target)
    base_label = rows[0]["name"]
    report = reports.get(base_label) or next(iter(reports.values()), None)
    if report is None:
        raise VramscopeError("no strategy could be evaluated for this workload")
    section: dict[str, Any] = {
        "strategies": rows,
        "recommendation": recommendation,
        "target": _target_section(target),
        "batch_size": batch_size,
        "method": "measured" if measured else "estimated",
    }
    if parallel is not None:
        section["per_rank"] = {
            "world_size": parallel.world_size,
            "strategy": None if parallel_each else parallel.strategy,
            "summary": None if parallel_each else parallel.describe(),
            "side_by_side": parallel_each,
        }
    if len(workloads) > 1:
        section["module_diff"] = _module_diff(reports)
    report.extra["fit"] = section
    report.findings = [Finding("compare", "info", recommendation["message"], {}), *report.findings]
    return report


# data-parallel strategies compared side by side, cheapest in communication first
PARALLEL_ORDER = ("ddp", "zero1", "zero2", "hsdp", "fsdp")


def default_shard_size(world_size: int) -> int | None:
    """HSDP's shard group when compared without --shard-size: a node of 8 GPUs when the world
    is several nodes, else the largest group that leaves 2 or more replicas (None: a prime
    world size, which HSDP cannot split)."""
    if world_size > 8 and world_size % 8 == 0:
        return 8
    return next((d for d in range(world_size // 2, 1, -1) if world_size % d == 0), None)


def _compared(
    workloads: list[str],
    strategies: list[str] | None,
    parallel: ParallelPlan | None,
    parallel_each: bool,
) -> list[tuple[str, str, Strategy, ParallelPlan | None, str, int]]:
    """The rows to compare: (workload, label, memory-saving strategy, data-parallel plan,
    description, cost)."""
    base = get_strategy("baseline")
    if parallel is not None and parallel_each:
        from vramscope.distributed.sharding import (
            DESCRIPTIONS,
            STRATEGY_NAMES,
            WITH_TENSOR_PARALLEL,
        )

        # with tensor parallel (or an interleaved pipeline), the strategies that run on its
        # mesh (FSDP2 underneath)
        fsdp2_only = parallel.tensor_parallel or (
            parallel.pipeline and parallel.schedule == "interleaved-1f1b"
        )
        names = strategies or [
            n for n in PARALLEL_ORDER if not fsdp2_only or n in WITH_TENSOR_PARALLEL
        ]
        for name in names:
            if name not in STRATEGY_NAMES:
                raise VramscopeError(
                    f"with --world-size and no --strategy, --strategies picks data-parallel "
                    f"strategies ({', '.join(PARALLEL_ORDER)}), not {name!r}"
                )
        rows = []
        for name in names:
            plan = parallel.with_strategy(name)
            label, description = name, DESCRIPTIONS[name]
            if name == "hsdp" and parallel.shard_size is None:
                size = default_shard_size(parallel.dp_size)
                if size is not None:  # else the row says what --shard-size must be
                    plan = replace(plan, shard_size=size)
                    label = f"hsdp (shard {size})"
                    description += f", shard groups of {size} ranks"
            rows.append((workloads[0], label, base, plan, description, PARALLEL_ORDER.index(name)))
        return rows
    if len(workloads) > 1:
        return [(spec, spec, base, parallel, "model variant", 0) for spec in workloads]
    # LoRA among the defaults for one process: with a data-parallel plan, the plan's rows
    names = strategies or default_strategies(workloads[0], lora=parallel is None)
    if "baseline" not in names:
        names = ["baseline", *names]
    rows = []
    for name in names:
        strategy = get_strategy(name)
        rows.append((workloads[0], name, strategy, parallel, strategy.description, strategy.cost))
    return rows


def _needs(est: Estimator, report: Report, batch_size: int) -> dict[str, Any] | None:
    """What a row that runs out needs on a device large enough (its peak uncapped); None
    when it did not run out (it fits within the margin only)."""
    verdict = report.extra.get("verdict") or {}
    needs = verdict.get("needs")
    if isinstance(needs, dict) and needs.get("reserved_bytes"):
        return {
            "allocated_bytes": needs.get("allocated_bytes"),
            "reserved_bytes": needs.get("reserved_bytes"),
            "device_used_bytes": needs.get("device_used_bytes"),
        }
    if est.target.kind == "budget":  # capped at the budget: the same step without the cap
        uncapped = _peak_dict(est.report(batch_size, capped=False))
        if (uncapped.get("reserved_bytes") or 0) > (_peak_dict(report).get("reserved_bytes") or 0):
            return uncapped
    return None


def _savings(rows: list[dict[str, Any]], target: Target) -> None:
    base = next((r for r in rows if "peak" in r), None)
    if base is None:
        return
    for row in rows:
        if "peak" not in row:
            continue
        for key in ("allocated_bytes", "reserved_bytes", "device_used_bytes"):
            b, v = base["peak"].get(key), row["peak"].get(key)
            if b and v is not None:
                row.setdefault("saving_pct", {})[key] = round(100 * (b - v) / b, 2)
        row.setdefault("fits", (target.measure_of(row["peak"]) or 0) <= target.usable_bytes)
        if base.get("step_time_s") and row.get("step_time_s"):
            row["slowdown_pct"] = round(100 * (row["step_time_s"] / base["step_time_s"] - 1), 1)


def _recommend(rows: list[dict[str, Any]], target: Target) -> dict[str, Any]:
    usable = [r for r in rows if "peak" in r]
    if not usable:
        return {"name": None, "message": "no strategy could be evaluated"}
    base = usable[0]
    fitting = [r for r in usable if r.get("fits")]
    if base.get("fits"):
        saver = max(usable, key=lambda r: r.get("saving_pct", {}).get("reserved_bytes", 0))
        return {
            "name": base["name"],
            "message": f"{base['name']} already fits {target.describe()}; "
            f"{saver['name']} would save the most ({saver.get('saving_pct', {}).get('reserved_bytes', 0):.0f}% reserved)",
        }
    if fitting:
        pick = min(fitting, key=lambda r: (r["cost"], target.measure_of(r["peak"]) or 0))
        return {
            "name": pick["name"],
            "message": f"cheapest change that fits {target.describe()}: {pick['name']} "
            f"({pick['description']}), {format_bytes(target.measure_of(pick['peak']))}",
        }
    closest = min(usable, key=lambda r: target.measure_of(r["peak"]) or 0)
    return {
        "name": None,
        "closest": closest["name"],
        "message": f"nothing here fits {target.describe()}; closest: {closest['name']} at "
        f"{format_bytes(target.measure_of(closest['peak']))} — try a smaller batch (vramscope fit)",
    }


def _module_diff(reports: dict[str, Report]) -> list[dict[str, Any]]:
    """Per-module bytes of each variant, for modules named alike (the first variant first)."""
    labels = list(reports)
    table: dict[str, dict[str, Any]] = {}
    for label in labels:
        for module in reports[label].modules:
            name = module.get("name", "")
            total = sum(
                int(module.get(k) or 0)
                for k in (
                    "parameters_bytes",
                    "gradients_bytes",
                    "optimizer_state_bytes",
                    "activations_bytes",
                )
            )
            table.setdefault(name, {"name": name})[label] = total
    rows = list(table.values())
    for row in rows:
        values = [row.get(label) for label in labels]
        if len(values) >= 2 and values[0] is not None and values[1] is not None:
            row["difference_bytes"] = values[1] - values[0]
    rows.sort(key=lambda r: abs(r.get("difference_bytes", 0)), reverse=True)
    return rows[:40]
