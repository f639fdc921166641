"""Per-rank estimates with tensor parallel: torch's parallelize_module applied to a workload
written for one GPU (the default plan for Llama-like and GPT-like blocks, or the workload's
own), alone or under FSDP2 on a 2-D mesh, traced under torch's fake process group. The
numbers asserted are what torch's own objects hold: each rank's share of every split
projection, torch.chunk's sizes where a dimension does not divide."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cli_run import run_cli
from vramscope import schema
from vramscope.distributed.sharding import ParallelPlan
from vramscope.estimate.distributed import trace_rank
from vramscope.estimate.estimator import estimate
from vramscope.estimate.profiles import get_profile
from vramscope.workload import resolve

HERE = Path(__file__).resolve().parent
LLAMA = f"{HERE / 'distributed_workloads.py'}:llama"
ODD_VOCAB = f"{HERE / 'distributed_workloads.py'}:llama_odd_vocab"
OWN_PLAN = f"{HERE / 'distributed_workloads.py'}:llama_own_plan"
# the projections the default plan splits, by their names in ExampleLlama
SPLIT = ("embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")
SPLIT += ("down_proj", "lm_head")


def block(nbytes: int) -> int:
    """What the caching allocator hands out for a request of ``nbytes``."""
    return -(-nbytes // 512) * 512


def named_shapes(spec: str) -> dict[str, torch.Size]:
    model = resolve(spec).builder(2, torch.device("meta")).model
    return {n: p.shape for n, p in model.named_parameters()}


def split_bytes(spec: str, ranks: int) -> int:
    """Each parameter as a rank of ``ranks`` holds it: the split ones a 1/ranks share, the
    norms whole; float32."""
    total = 0
    for name, shape in named_shapes(spec).items():
        n = math.prod(shape) * 4
        total += block(n // ranks if any(s in name for s in SPLIT) else n)
    return total


def fsdp_shard_bytes(spec: str, tp: int, dp: int) -> int:
    """Each parameter as a rank of ``tp`` × ``dp`` holds it: its tensor-parallel share
    (ColwiseParallel and an embedding's RowwiseParallel split dimension 0, a linear layer's
    RowwiseParallel dimension 1), of which FSDP2's shard: dimension 0 in ``dp`` chunks, each
    padded to the first's."""
    total = 0
    for name, shape in named_shapes(spec).items():
        shape = list(shape)
        if any(s in name for s in SPLIT):
            dim = 1 if any(s in name for s in ("o_proj", "down_proj")) else 0
            shape[dim] //= tp
        rows = shape[0]
        total += block(math.ceil(rows / dp) * (math.prod(shape) // rows) * 4)
    return total


def tp(spec: str, world: int, strategy: str = "none", batch: int = 4, **settings):
    return estimate(
        spec,
        batch,
        parallel=ParallelPlan(strategy, world, tp=settings.pop("tp", world), **settings),
    )


# ---- the default plan -------------------------------------------------------------------


def test_tensor_parallel_holds_each_projections_share_and_the_norms_whole():
    report = tp(LLAMA, 2)
    assert report.categories_at_peak.parameters == split_bytes(LLAMA, 2)
    # AdamW's two moments follow the parameters
    assert report.categories_at_peak.optimizer_state == 2 * split_bytes(LLAMA, 2)
    job = report.extra["distributed"]
    plan = job["tensor_parallel"]
    assert plan["source"] == "the default plan for Llama-like blocks"
    assert plan["sequence_parallel"] is True
    assert plan["styles"]["layers.*.self_attn.q_proj"].startswith("ColwiseParallel")
    assert plan["styles"]["layers.*.self_attn.o_proj"] == (
        "RowwiseParallel (input S(-1); output S(1))"
    )
    assert plan["styles"]["layers.*.input_layernorm"] == "SequenceParallel"
    assert plan["styles"]["lm_head"] == "ColwiseParallel (input S(1); output R)"
    assert job["summary"] == "tensor parallel over 2 ranks"


def test_tensor_parallel_needs_less_than_one_gpu_and_more_ranks_less_still():
    one = estimate(LLAMA, 4)
    two, four = tp(LLAMA, 2), tp(LLAMA, 4)
    assert four.peak.allocated_bytes < two.peak.allocated_bytes < one.peak.allocated_bytes
    assert four.categories_at_peak.parameters == split_bytes(LLAMA, 4)


def test_the_waits_of_dtensors_collectives_allocate_nothing():
    plan = ParallelPlan("none", 2, tp=2).check()
    trace, _, _ = trace_rank(resolve(LLAMA), 4, get_profile("h200"), plan, None, None, 2)
    ops = {trace.blocks[e[1]].op for e in trace.events if e[0] == "alloc"}
    assert "wait_tensor.default" not in ops
    # sequence parallel gathers the sequence before attention and the MLP, and
    # reduce-scatters their outputs: torch's functional collectives make new tensors
    assert {"all_gather_into_tensor.default", "reduce_scatter_tensor.default"} <= ops


def test_sequence_parallel_off_all_reduces_instead():
    plan = ParallelPlan("none", 2, tp=2, sequence_parallel=False).check()
    trace, _, _ = trace_rank(resolve(LLAMA), 4, get_profile("h200"), plan, None, None, 2)
    ops = {trace.blocks[e[1]].op for e in trace.events if e[0] == "alloc"}
    assert "all_reduce.default" in ops and "reduce_scatter_tensor.default" not in ops
    report = tp(LLAMA, 2, sequence_parallel=False)
    styles = report.extra["distributed"]["tensor_parallel"]["styles"]
    assert styles["layers.*.input_layernorm"] == "Replicated"
    assert report.categories_at_peak.parameters == split_bytes(LLAMA, 2)


def test_a_fused_qkv_attention_is_left_whole_and_said_so():
    report = tp("example:gpt", 2)
    plan = report.extra["distributed"]["tensor_parallel"]
    assert plan["source"] == "the default plan for GPT-like blocks"
    assert plan["styles"]["blocks.*.mlp.0"].startswith("ColwiseParallel")
    assert plan["styles"]["blocks.*.attn.qkv"] == "Replicated"
    assert plan["sequence_parallel"] is False
    assert any("attention left whole" in n and "'attn.qkv'" in n for n in plan["notes"])
    # the tied head and embedding are split alike (dimension 0) and stay one parameter
    plan = ParallelPlan("none", 2, tp=2).check()
    _, tracer, _ = trace_rank(resolve("example:gpt"), 2, get_profile("h200"), plan, None, None, 2)
    model = tracer.applied.workload.model
    tied = model.lm_head.weight is model.tok.weight
    placements = [str(p) for p in model.tok.weight.placements]
    del model, tracer
    assert tied and placements == ["S(0)"]


def test_the_workloads_own_plan_is_applied():
    report = tp(OWN_PLAN, 2)
    plan = report.extra["distributed"]["tensor_parallel"]
    assert plan["source"] == "the workload's plan"
    assert set(plan["styles"]) == {
        "layers.*.mlp.gate_proj",
        "layers.*.mlp.up_proj",
        "layers.*.mlp.down_proj",
    }
    shapes = named_shapes(OWN_PLAN)
    expected = sum(block(math.prod(s) * 4 // (2 if "mlp" in n else 1)) for n, s in shapes.items())
    assert report.categories_at_peak.parameters == expected


# ---- with FSDP on a 2-D mesh ------------------------------------------------------------


def test_fsdp_shards_each_tensor_parallel_share_over_the_data_parallel_ranks():
    report = tp(LLAMA, 8, "fsdp", tp=2)
    job = report.extra["distributed"]
    assert job["summary"] == "fsdp over 4 × tensor parallel 2 (8 ranks)"
    assert job["mesh"] == {
        "dims": [{"name": "dp", "size": 4}, {"name": "tp", "size": 2}],
        "coordinates": {"dp": 0, "tp": 0},
    }
    # a quarter of each rank's tensor-parallel share
    assert report.categories_at_peak.parameters == fsdp_shard_bytes(LLAMA, 2, 4)
    groups = [(c["group"], c["ranks"]) for c in job["communicators"]]
    assert groups == [("data parallel", 4), ("tensor parallel", 2)]


def test_hsdp_with_tensor_parallel_shards_within_its_groups():
    report = tp(LLAMA, 8, "hsdp", tp=2, shard_size=2)
    assert report.categories_at_peak.parameters == fsdp_shard_bytes(LLAMA, 2, 2)
    groups = [(c["group"], c["ranks"]) for c in report.extra["distributed"]["communicators"]]
    assert groups == [("shard", 2), ("replicate", 2), ("tensor parallel", 2)]


# ---- ranks by role ----------------------------------------------------------------------


def test_ranks_that_hold_the_same_share_one_row_traced_once():
    report = tp(LLAMA, 8, "fsdp", tp=2)
    job = report.extra["distributed"]
    (role,) = job["roles"]
    assert role["ranks"] == "0-7" and role["count"] == 8
    assert role["tp_ranks"] == "0-1" and role["dp_ranks"] == "0-3"
    assert role["traced_rank"] == 0
    assert role["peak"]["allocated_bytes"] == report.peak.allocated_bytes
    assert [r["rank"] for r in job["traced_ranks"]] == [0]


def test_a_vocabulary_that_does_not_divide_makes_two_roles_each_traced():
    report = tp(ODD_VOCAB, 3)
    job = report.extra["distributed"]
    rows = {r["ranks"]: r for r in job["roles"]}
    assert set(rows) == {"0-1", "2"}  # 171, 171 and 169 rows of the embedding and head
    assert sorted(r["rank"] for r in job["traced_ranks"]) == [0, 2]
    assert rows["0-1"]["peak"]["allocated_bytes"] > rows["2"]["peak"]["allocated_bytes"]
    # the report is the most loaded rank's
    assert job["rank"] == job["heaviest_rank"] == 0
    assert job["ranks_differ"] is True


def test_coordinates_follow_init_device_mesh():
    plan = ParallelPlan("fsdp", 16, tp=4, rank=9)
    assert plan.coordinates() == {"pp": 0, "dp": 2, "cp": 0, "tp": 1}
    assert plan.dp_size == 4 and plan.dp_rank == 2 and plan.tp_rank == 1
    assert plan.rank_at(dp=2, tp=1) == 9


# ---- fit, compare, the command line -----------------------------------------------------


def test_fit_answers_the_micro_batch_of_a_data_parallel_rank():
    from vramscope.fit.search import fit

    # at the cap a step needs less than half the budget: the search stops there, a few
    # estimates in
    report = fit(LLAMA, budget="400MiB", max_batch_size=64, parallel=ParallelPlan("fsdp", 8, tp=2))
    section = report.extra["fit"]
    best = section["max_batch_size"]
    assert best > 1
    # the two ranks of a tensor-parallel group share one micro-batch
    assert section["per_rank"]["job_batch_size"] == best * 4
    assert section["per_rank"]["dp_size"] == 4


def test_compare_side_by_side_with_tensor_parallel_keeps_fsdp2s_strategies():
    from vramscope.fit.compare import compare

    report = compare([LLAMA], 4, parallel=ParallelPlan("fsdp", 8, tp=2), parallel_each=True)
    rows = [r["name"] for r in report.extra["fit"]["strategies"]]
    assert rows == ["zero2", "hsdp (shard 2)", "fsdp"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--world-size", "8", "--tp", "3"], "--tp 3 does not divide --world-size 8"),
        (["--world-size", "8", "--tp", "2"], "leaves 4 data-parallel ranks: give --strategy"),
        (["--world-size", "8", "--tp", "2", "--strategy", "ddp"], "not yet supported"),
        (["--world-size", "2", "--tp", "2", "--strategy", "fsdp"], "leave --strategy out"),
        (["--world-size", "8", "--tp", "2", "--pp", "3", "--strategy", "fsdp"], "pipeline"),
        (["--world-size", "8", "--tp", "2", "--cp", "2", "--strategy", "fsdp"], "context"),
        (["--world-size", "8", "--tp", "2", "--ep", "2", "--strategy", "fsdp"], "expert"),
        (["--world-size", "8", "--strategy", "fsdp", "--sequence-parallel"], "applies with --tp"),
        (["--tp", "2"], "give --world-size N and --strategy"),
        (["--world-size", "4", "--tp", "0", "--strategy", "fsdp"], "--tp must be"),
    ],
)
def test_bad_meshes_are_one_line_and_exit_2(capsys, args, needle):
    code, _, err = run_cli(capsys, "estimate", LLAMA, "-b", "2", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:") and needle in lines[0]


def test_a_model_without_a_default_plan_is_one_line_and_exit_2(capsys):
    code, _, err = run_cli(
        capsys, "estimate", "example:cnn", "-b", "2", "--world-size", "2", "--tp", "2"
    )
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "no default tensor-parallel plan for ExampleCNN" in line
    assert "tensor_parallel_plan" in line


def test_the_report_has_a_row_per_role(capsys, tmp_path):
    out = tmp_path / "rank.json"
    code, stdout, _ = run_cli(
        capsys,
        "estimate",
        ODD_VOCAB,
        "-b",
        "2",
        "--world-size",
        "3",
        "--tp",
        "3",
        "--json",
        str(out),
    )
    assert code == 0
    assert "Ranks by role (each role traced once)" in stdout
    assert "tensor parallel over 3 ranks (the default plan for Llama-like blocks" in (
        " ".join(stdout.split())
    )
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    assert [r["ranks"] for r in data["distributed"]["roles"]] == ["0-1", "2"]


# ---- over gloo ---------------------------------------------------------------------------


def test_gloo_copies_each_sequence_parallel_reduce_scatter_input_until_its_wait():
    plan = ParallelPlan("none", 2, tp=2, backend="gloo").check()
    trace, tracer, _ = trace_rank(resolve(LLAMA), 4, get_profile("h200"), plan, None, None, 2)
    copies = [b for b, (what, _) in tracer.tags.items() if what == "gloo_reduce_scatter_copy"]
    flats = [b for b, (what, _) in tracer.tags.items() if what == "gloo_all_gather_flat"]
    assert copies and flats
    freed = {e[1] for e in trace.events if e[0] == "free"}
    assert set(copies) <= freed and set(flats) <= freed
    sizes = {e[1]: e[2] for e in trace.events if e[0] == "alloc"}
    scatters = sorted(
        sizes[e[1]]
        for e in trace.events
        if e[0] == "alloc" and trace.blocks[e[1]].op == "reduce_scatter_tensor.default"
    )
    # each copy is the whole input: the group's size times the output
    assert sorted(sizes[b] for b in copies) == [2 * s for s in scatters]


def test_gloo_warns_of_a_plan_whose_functional_all_gathers_it_cannot_run_on_cuda():
    # the default plan gathers the head's logits (and, with sequence parallel, the blocks'
    # inputs) through torch's functional all-gather, which gloo has no CUDA path for; a plan
    # of ColwiseParallel/RowwiseParallel layers with plain outputs all-reduces only
    for spec, gathers in ((LLAMA, True), (OWN_PLAN, False)):
        plan = ParallelPlan("none", 2, tp=2, backend="gloo")
        report = estimate(spec, 4, gpu="h200", parallel=plan)
        counted = report.extra["distributed"]["tensor_parallel"]["functional_all_gathers"]
        kinds = {f.kind: f.severity for f in report.findings}
        assert (counted > 0) is gathers
        assert (kinds.get("gloo_cuda_all_gather") == "warning") is gathers
    over_nccl = estimate(LLAMA, 4, gpu="h200", parallel=ParallelPlan("none", 2, tp=2))
    assert "functional_all_gathers" not in over_nccl.extra["distributed"]["tensor_parallel"]
