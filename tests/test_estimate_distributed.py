"""Per-rank estimates of data-parallel jobs: one rank traced under torch's fake process
group, with DDP, FSDP2 (fully_shard), HSDP and ZeroRedundancyOptimizer applied to a workload
written for one GPU. The numbers asserted are what torch's own objects do: FSDP's padded
shards, ZeRO's greedy partition, DDP's bucket rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cli_run import run_cli
from vramscope import schema
from vramscope.distributed.sharding import ParallelPlan
from vramscope.estimate.distributed import _Chunks, communicators, trace_rank
from vramscope.estimate.estimator import estimate
from vramscope.estimate.profiles import get_profile
from vramscope.workload import resolve

HERE = Path(__file__).resolve().parent
TOWER = f"{HERE / 'distributed_workloads.py'}:tower"
UNEVEN = f"{HERE / 'distributed_workloads.py'}:uneven"
CHAIN = f"{HERE / 'distributed_workloads.py'}:chain"
MiB = 2**20


def block(nbytes: int) -> int:
    """What the caching allocator hands out for a request of ``nbytes``."""
    return -(-nbytes // 512) * 512


def shapes(spec: str) -> list[torch.Size]:
    """The workload's parameter shapes, from building it on the meta device."""
    return [p.shape for p in resolve(spec).builder(2, torch.device("meta")).model.parameters()]


def padded_shard_bytes(shape: torch.Size, ranks: int, itemsize: int = 4) -> int:
    """FSDP2's shard of one parameter: dimension 0 split into ``ranks`` chunks of
    ceil(rows / ranks) rows, every rank's padded to that."""
    rows = shape[0]
    return math.ceil(rows / ranks) * (math.prod(shape) // rows) * itemsize


def rank_shard_bytes(shape: torch.Size, ranks: int, rank: int, itemsize: int = 4) -> int:
    """The unpadded part of ``rank``'s shard (what its optimizer state follows)."""
    rows, chunk = shape[0], math.ceil(shape[0] / ranks)
    held = max(0, min(chunk, rows - rank * chunk))
    return held * (math.prod(shape) // rows) * itemsize


def per_rank(spec: str, strategy: str, world: int, batch: int = 4, **settings):
    return estimate(spec, batch, parallel=ParallelPlan(strategy, world, **settings))


# ---- FSDP2 ----------------------------------------------------------------------------------


def test_fsdp_holds_each_parameter_as_its_padded_shard():
    report = per_rank(UNEVEN, "fsdp", 4)
    expected = sum(block(padded_shard_bytes(s, 4)) for s in shapes(UNEVEN))
    assert report.categories_at_peak.parameters == expected


def test_fsdp_optimizer_state_follows_rank_0s_unpadded_shard_the_heaviest():
    report = per_rank(UNEVEN, "fsdp", 4)
    params = shapes(UNEVEN)
    # AdamW: exp_avg and exp_avg_sq per parameter, each its own block (the step count is a
    # host tensor)
    assert report.categories_at_peak.optimizer_state == sum(
        2 * block(rank_shard_bytes(s, 4, 0)) for s in params
    )
    job = report.extra["distributed"]
    assert job["rank"] == 0 and job["heaviest_rank"] == 0 and job["ranks_differ"] is True
    assert [r["rank"] for r in job["traced_ranks"]] == [0]  # rank 0 is the heaviest: no re-trace
    diff = job["differences"]
    assert diff["heaviest_rank"] == 0 and diff["lightest_rank"] == 3
    elements = diff["optimizer_elements"]
    assert elements["heaviest"] == sum(rank_shard_bytes(s, 4, 0, 1) for s in params)
    assert elements["lightest"] == sum(rank_shard_bytes(s, 4, 3, 1) for s in params)


def test_fsdp_over_1024_ranks_runs_in_seconds_and_shards_1024_ways():
    report = per_rank(UNEVEN, "fsdp", 1024)
    assert report.extra["estimate"]["seconds"] < 60  # a few seconds on a 2-core CPU
    expected = sum(block(padded_shard_bytes(s, 1024)) for s in shapes(UNEVEN))
    assert report.categories_at_peak.parameters == expected
    assert report.extra["distributed"]["world_size"] == 1024


def test_fsdp_shards_divide_evenly_to_a_world_size_th_of_the_model():
    report = per_rank(TOWER, "fsdp", 8)
    total = sum(math.prod(s) * 4 for s in shapes(TOWER))
    # within 0.2 %: the 10 classes of the head pad to 16 rows, blocks round to 512 B
    assert report.categories_at_peak.parameters == pytest.approx(total / 8, rel=0.002)
    assert report.categories_at_peak.optimizer_state == pytest.approx(2 * total / 8, rel=0.002)


def test_fsdp_gathers_a_few_groups_at_once_not_all():
    report = per_rank(TOWER, "fsdp", 8)
    job = report.extra["distributed"]
    assert job["groups"] == 5  # four blocks and the root
    assert job["sharded_modules"] == {
        "class": "Block",
        "count": 4,
        "names": ["blocks.0", "blocks.1", "blocks.2", "blocks.3"],
        "chosen_by": "the repeated blocks",
    }
    items = {m["name"]: m for m in job["memory"]}
    gathered = items["fsdp_unsharded_parameters"]
    block_bytes = sum(math.prod(s) * 4 for s in shapes(TOWER)[2:8])  # one Block, padded alike
    assert gathered["bytes"] == pytest.approx(block_bytes, rel=0.001)  # the largest group
    # the current group and the one prefetched, and the root (kept gathered after forward)
    assert 2 <= gathered["most_groups_at_once"] <= 3
    reduce = items["fsdp_reduce_scatter_buffers"]
    assert reduce["most_groups_at_once"] == 1


def test_fsdp_collectives_run_on_their_own_streams():
    spec = resolve(TOWER)
    trace, tracer, _ = trace_rank(
        spec, 4, get_profile("h200"), ParallelPlan("fsdp", 8), None, None, 2
    )
    stream = {e[1]: e[3] for e in trace.events if e[0] == "alloc"}
    gathers = [b for b, (what, _) in tracer.tags.items() if what == "all_gather"]
    reduces = [b for b, (what, _) in tracer.tags.items() if what == "reduce_scatter"]
    assert gathers and reduces
    # all-gather outputs on the copy-in stream; reduce-scatter inputs on the default stream,
    # the sharded gradients on the reduce-scatter stream
    assert {stream[b] for b in gathers} == {1}
    assert {stream[b] for b in reduces} == {0}
    assert 3 in set(stream.values())


def test_fsdp_mixed_precision_gathers_in_the_parameter_dtype():
    full = per_rank(TOWER, "fsdp", 8)
    half = per_rank(TOWER, "fsdp", 8, param_dtype="bf16", reduce_dtype="fp32")

    def gathered(report):
        return {m["name"]: m for m in report.extra["distributed"]["memory"]}

    assert gathered(half)["fsdp_unsharded_parameters"]["bytes"] == pytest.approx(
        gathered(full)["fsdp_unsharded_parameters"]["bytes"] / 2, rel=0.001
    )
    # gradients reduce-scattered in float32, as the shards are
    assert (
        gathered(half)["fsdp_reduce_scatter_buffers"]["bytes"]
        == gathered(full)["fsdp_reduce_scatter_buffers"]["bytes"]
    )
    assert half.categories_at_peak.parameters == full.categories_at_peak.parameters


def test_fsdp_cpu_offload_keeps_the_state_on_the_host():
    report = per_rank(TOWER, "fsdp", 8, cpu_offload=True)
    cats = report.categories_at_peak
    assert cats.parameters == 0 and cats.optimizer_state == 0
    host = report.extra["distributed"]["host_bytes"]
    total = sum(padded_shard_bytes(s, 8) for s in shapes(TOWER))
    assert host["parameters"] == total
    # and on the host, AdamW's step count: a float32 per parameter
    assert host["optimizer_state"] == sum(2 * rank_shard_bytes(s, 8, 0) + 4 for s in shapes(TOWER))


def test_zero2_keeps_every_group_gathered_until_backward():
    fsdp = per_rank(TOWER, "fsdp", 8)
    zero2 = per_rank(TOWER, "zero2", 8)
    items = {m["name"]: m for m in zero2.extra["distributed"]["memory"]}
    assert items["fsdp_unsharded_parameters"]["most_groups_at_once"] == 5
    assert zero2.categories_at_peak.parameters == fsdp.categories_at_peak.parameters
    assert zero2.peak.allocated_bytes > fsdp.peak.allocated_bytes


def test_hsdp_shards_within_a_group_and_makes_two_communicators():
    report = per_rank(UNEVEN, "hsdp", 16, shard_size=4)
    expected = sum(block(padded_shard_bytes(s, 4)) for s in shapes(UNEVEN))
    assert report.categories_at_peak.parameters == expected
    job = report.extra["distributed"]
    assert [(c["group"], c["ranks"]) for c in job["communicators"]] == [
        ("shard", 4),
        ("replicate", 4),
    ]
    nccl = sum(c["bytes"] for c in job["communicators"])
    assert nccl == 2 * 688 * MiB
    assert report.startup.context_and_libraries_bytes >= nccl


# ---- DDP and ZeRO-1 ------------------------------------------------------------------------


def test_ddp_buckets_follow_ddps_rule():
    report = per_rank(TOWER, "ddp", 8)
    (buckets,) = report.extra["distributed"]["memory"]
    sizes = buckets["bucket_sizes"]
    total = sum(math.prod(s) * 4 for s in shapes(TOWER))
    assert sum(sizes) == total  # every gradient in one bucket
    # rebuilt after the first step in the order gradients arrived: a bucket closes once it
    # reaches its cap, 1 MiB for the first and 25 MiB for the others
    caps = [MiB] + [25 * MiB] * (len(sizes) - 1)
    largest = max(math.prod(s) * 4 for s in shapes(TOWER))
    for size, cap in zip(sizes[:-1], caps[:-1], strict=True):
        assert cap <= size < cap + largest
    assert sizes[-1] < caps[-1] + largest
    assert len(sizes) == 3
    assert buckets["bytes"] == sum(block(s) for s in sizes)
    assert buckets["category"] == "other"
    assert report.categories_at_peak.other >= buckets["bytes"]
    assert report.categories_at_peak.parameters == sum(
        block(math.prod(s) * 4) for s in shapes(TOWER)
    )


def test_ddp_bucket_cap_applies_to_every_bucket():
    report = per_rank(TOWER, "ddp", 8, bucket_cap_mb=4)
    (buckets,) = report.extra["distributed"]["memory"]
    assert all(size >= 4 * MiB for size in buckets["bucket_sizes"][:-1])
    assert len(buckets["bucket_sizes"]) >= 8


def test_ddp_gradients_as_bucket_views_are_the_gradients():
    report = per_rank(TOWER, "ddp", 8, gradient_as_bucket_view=True)
    (buckets,) = report.extra["distributed"]["memory"]
    assert buckets["category"] == "gradients" and buckets["gradient_as_bucket_view"] is True
    plain = per_rank(TOWER, "ddp", 8)
    assert report.categories_at_peak.other < plain.categories_at_peak.other


def test_zero1_traces_the_heaviest_rank_of_the_greedy_partition():
    report = per_rank(CHAIN, "zero1", 2)
    job = report.extra["distributed"]
    # largest first, each to the rank with the fewest elements: rank 0 takes the 10,000,
    # rank 1 both 6,000s
    assert job["differences"]["optimizer_elements"] == {"heaviest": 12000, "lightest": 10000}
    assert [r["rank"] for r in job["traced_ranks"]] == [0, 1]
    assert job["rank"] == 1 and job["heaviest_rank"] == 1
    assert report.categories_at_peak.optimizer_state == 2 * 2 * block(6000 * 4)
    rank0 = job["traced_ranks"][0]
    assert rank0["optimizer_state_bytes"] == 2 * block(10000 * 4)
    assert report.categories_at_peak.parameters == sum(block(n * 4) for n in (10000, 6000, 6000))


def test_world_size_1024_with_ddp_and_zero1_runs_in_seconds():
    for strategy in ("ddp", "zero1"):
        report = per_rank(TOWER, strategy, 1024)
        assert report.extra["estimate"]["seconds"] < 60
    # 10 parameters for 1024 ranks: most ranks hold no optimizer state
    assert report.extra["distributed"]["differences"]["optimizer_elements"]["lightest"] == 0


# ---- reports, fit and compare --------------------------------------------------------------


def test_a_per_rank_report_says_so_and_keeps_the_schema():
    report = per_rank(TOWER, "fsdp", 64)
    assert schema.errors(report.to_dict()) == []
    assert report.workload["world_size"] == 64 and report.workload["strategy"] == "fsdp"
    job = report.extra["distributed"]
    assert job["estimated"] is True and job["summary"] == "fsdp over 64 ranks"
    kinds = [f.kind for f in report.findings]
    assert "nccl" in kinds
    assert report.peak.device_used_bytes - report.peak.reserved_bytes == (
        report.startup.context_and_libraries_bytes
    )


def test_nccl_is_a_constant_per_communicator():
    assert communicators(ParallelPlan("ddp", 2)) == [
        {"group": "world", "ranks": 2, "backend": "nccl", "bytes": 544 * MiB, "calibrated": False}
    ]
    assert [c["bytes"] for c in communicators(ParallelPlan("fsdp", 64))] == [688 * MiB]
    gloo = ParallelPlan("hsdp", 16, shard_size=4, backend="gloo")
    assert [(c["group"], c["bytes"]) for c in communicators(gloo)] == [
        ("shard", 0),
        ("replicate", 0),
    ]


# ---- over gloo -----------------------------------------------------------------------------


def gloo_trace(strategy: str = "fsdp", **settings):
    plan = ParallelPlan(strategy, 8, backend="gloo", **settings).check()
    return trace_rank(resolve(TOWER), 4, get_profile("h200"), plan, None, None, 2)


def test_gloo_copies_each_reduce_scatter_input_for_the_collective():
    trace, tracer, _ = gloo_trace()
    sizes = {e[1]: e[2] for e in trace.events if e[0] == "alloc"}
    at = {(e[0], e[1]): i for i, e in enumerate(trace.events) if e[0] in ("alloc", "free")}

    def tagged(what: str) -> list[tuple[int, str]]:
        return sorted((b, g) for b, (w, g) in tracer.tags.items() if w == what)

    inputs, copies = tagged("reduce_scatter"), tagged("gloo_reduce_scatter_copy")
    # one copy per reduce-scatter: 5 groups (4 blocks and the root), 2 steps
    assert len(copies) == len(inputs) == 10
    assert {g for _, g in copies} == {"blocks.0", "blocks.1", "blocks.2", "blocks.3", "the root"}
    starts = sorted(at[("alloc", b)] for b, _ in inputs)
    for (block, group), (copy, copy_group) in zip(inputs, copies, strict=True):
        assert copy_group == group
        assert sizes[copy] == sizes[block]  # the whole input, in the reduce dtype
        # made once FSDP packed the input, freed before FSDP packs the next group's: alive
        # for the collective alone
        made, freed = at[("alloc", copy)], at[("free", copy)]
        assert at[("alloc", block)] < made < freed
        assert all(freed < start for start in starts if start > made)
        assert trace.events[made][3] == 3  # the reduce-scatter stream, where FSDP calls it


def test_gloo_makes_an_all_gather_sized_tensor_and_drops_it_at_once():
    trace, tracer, _ = gloo_trace()
    gathers = {b for b, (w, _) in tracer.tags.items() if w == "all_gather"}
    gathered = sorted(e[2] for e in trace.events if e[0] == "alloc" and e[1] in gathers)
    records = [
        i
        for i, e in enumerate(trace.events)
        if e[0] == "alloc" and trace.blocks[e[1]].op == "gloo all_gather output record"
    ]
    # one per all-gather (forward and backward), the size of its output
    assert sorted(trace.events[i][2] for i in records) == gathered
    assert all(trace.events[i + 1] == ("free", trace.events[i][1]) for i in records)


def test_gloo_adds_no_nccl_buffers_and_nothing_for_all_reduce():
    for strategy, settings in (("ddp", {}), ("zero1", {}), ("fsdp", {})):
        nccl = per_rank(TOWER, strategy, 8, **settings)
        gloo = per_rank(TOWER, strategy, 8, backend="gloo", **settings)
        job = gloo.extra["distributed"]
        assert job["backend"] == "gloo" and job["communicator_bytes"] == 0
        assert job["summary"] == f"{strategy} over 8 ranks, over gloo"
        kinds = [f.kind for f in gloo.findings]
        assert "gloo" in kinds and "nccl" not in kinds
        context = nccl.startup.context_and_libraries_bytes - 688 * MiB
        assert gloo.startup.context_and_libraries_bytes == context
        if strategy != "fsdp":  # all-reduce and broadcast go through pinned host copies
            assert gloo.peak.allocated_bytes == nccl.peak.allocated_bytes
            assert gloo.peak.reserved_bytes == nccl.peak.reserved_bytes
        else:  # the copies of the reduce-scatter inputs
            assert gloo.peak.allocated_bytes >= nccl.peak.allocated_bytes
            items = {m["name"]: m for m in job["memory"]}
            copies = items["gloo_reduce_scatter_copies"]
            assert copies["bytes"] == items["fsdp_reduce_scatter_buffers"]["bytes"]
            assert copies["most_groups_at_once"] == 1


def test_gloo_on_the_command_line(capsys, tmp_path):
    out = tmp_path / "rank.json"
    plan = ["--world-size", "8", "--strategy", "fsdp", "--backend", "gloo"]
    code, stdout, _ = run_cli(capsys, "estimate", TOWER, "-b", "4", *plan, "--json", str(out))
    assert code == 0
    assert (
        stdout.strip()
        .splitlines()[-1]
        .endswith("(per rank: rank 0 of fsdp over 8 ranks, over gloo)")
    )
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    assert data["distributed"]["plan"]["backend"] == "gloo"


def test_chunks_on_demand_are_torchs_chunks():
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    for shape in [(10, 3), (7,), (1, 5), (0, 4), (30, 70)]:
        for count in (1, 2, 3, 4, 7, 16, 1024):
            tensor = torch.randn(*shape)
            expected, made = _chunk_with_empty(tensor, count, 0), _Chunks(tensor, count, 0)
            assert len(made) == len(expected)
            for i in [*range(count), -1]:
                a, b = expected[i], made[i]
                assert (a.shape, a.stride(), a.storage_offset()) == (
                    b.shape,
                    b.stride(),
                    b.storage_offset(),
                )


def test_compare_puts_the_strategies_side_by_side_per_rank():
    from vramscope.fit.compare import compare

    report = compare([TOWER], 4, parallel=ParallelPlan("fsdp", 8), parallel_each=True)
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    assert list(rows) == ["ddp", "zero1", "zero2", "hsdp (shard 4)", "fsdp"]
    params = {name: r["model_state"]["parameters_bytes"] for name, r in rows.items()}
    optim = {name: r["model_state"]["optimizer_state_bytes"] for name, r in rows.items()}
    total = sum(block(math.prod(s) * 4) for s in shapes(TOWER))
    assert params["ddp"] == params["zero1"] == total
    assert params["fsdp"] == params["zero2"] == pytest.approx(total / 8, rel=0.01)
    assert params["hsdp (shard 4)"] == pytest.approx(total / 4, rel=0.01)
    assert optim["ddp"] == 2 * total
    assert optim["fsdp"] < optim["zero1"] < optim["ddp"]
    assert report.extra["fit"]["per_rank"]["side_by_side"] is True


def test_each_strategy_compared_keeps_only_the_settings_it_takes():
    given = ParallelPlan(
        "fsdp",
        16,
        shard_module="Block",
        reshard_after_forward=False,
        param_dtype="bf16",
        bucket_cap_mb=10.0,
    )
    ddp = given.with_strategy("ddp").check()
    assert (ddp.shard_module, ddp.reshard_after_forward, ddp.param_dtype) == (None, None, None)
    assert ddp.bucket_cap_mb == 10.0
    zero2 = given.with_strategy("zero2").check()
    assert (zero2.shard_module, zero2.reshard_after_forward, zero2.bucket_cap_mb) == (
        "Block",
        None,
        None,
    )
    assert zero2.resharding is False
    fsdp = given.with_strategy("fsdp").check()
    assert (fsdp.shard_module, fsdp.reshard_after_forward, fsdp.param_dtype) == (
        "Block",
        False,
        "bf16",
    )


def test_fit_answers_the_batch_per_gpu():
    from vramscope.fit.search import fit

    # at the cap a step needs less than half the budget: the search stops there, a few
    # estimates in
    report = fit(TOWER, budget="600MiB", max_batch_size=256, parallel=ParallelPlan("fsdp", 8))
    section = report.extra["fit"]
    best = section["max_batch_size"]
    assert best > 1
    assert section["per_rank"]["job_batch_size"] == best * 8
    curve = {p["batch_size"]: p for p in section["curve"]}
    assert curve[best]["fits"] is True
    assert all(not p["fits"] for b, p in curve.items() if b > best)
    assert report.workload["world_size"] == 8


# ---- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--strategy", "fsdp"], "--strategy fsdp needs --world-size N"),
        (["--world-size", "8"], "--world-size 8 needs --strategy"),
        (["--world-size", "6", "--strategy", "hsdp", "--shard-size", "4"], "must divide"),
        (["--world-size", "8", "--strategy", "hsdp"], "give --shard-size"),
        (["--world-size", "1", "--strategy", "ddp"], "from 2 to"),
        (["--world-size", "8", "--strategy", "ddp", "--param-dtype", "bf16"], "FSDP2"),
        (["--world-size", "8", "--strategy", "fsdp", "--bucket-cap-mb", "10"], "DDP"),
        (["--shard-size", "4"], "give --world-size N and --strategy"),
        (["--world-size", "8", "--strategy", "fsdp", "--shard-module", "Nope"], "its classes"),
        (["--backend", "gloo"], "give --world-size N and --strategy"),
    ],
)
def test_bad_combinations_are_one_line_and_exit_2(capsys, args, needle):
    code, _, err = run_cli(capsys, "estimate", TOWER, "-b", "2", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:") and needle in lines[0]


def test_estimate_on_the_command_line_is_per_rank(capsys, tmp_path):
    out = tmp_path / "rank.json"
    code, stdout, _ = run_cli(
        capsys,
        "estimate",
        TOWER,
        "-b",
        "4",
        "--world-size",
        "16",
        "--strategy",
        "hsdp",
        "--json",
        str(out),
    )
    assert code == 0
    header = " ".join(stdout.replace("│", " ").split())
    assert "per rank (per GPU, batch size per GPU) of hsdp over 16 ranks, shard groups of 8" in (
        header
    )
    assert (
        stdout.strip()
        .splitlines()[-1]
        .endswith("(per rank: rank 0 of hsdp over 16 ranks, shard groups of 8, 2 replicas)")
    )
    assert out.exists()
