"""Per-rank estimates with expert parallel (each rank a share of every MoE layer's experts,
tokens exchanged all-to-all) and context parallel (each rank a share of every sequence,
torch's ring attention), traced under torch's fake process group. The numbers asserted
follow from what a rank holds: its experts' parameters, gradients and optimizer state, the
all-to-all outputs (token copies × width × dtype bytes, the even share times the stated
imbalance), its share of the sequence's activations."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from cli_run import run_cli
from test_estimate_distributed import block, padded_shard_bytes
from vramscope import schema
from vramscope.distributed.sharding import ParallelPlan
from vramscope.estimate.distributed import trace_rank
from vramscope.estimate.estimator import estimate
from vramscope.estimate.profiles import get_profile
from vramscope.workload import resolve

HERE = Path(__file__).resolve().parent
MOE = f"{HERE / 'distributed_workloads.py'}:moe"  # 2 blocks of 8 experts, top-2, width 64
LONG = f"{HERE / 'distributed_workloads.py'}:llama_long"  # 256 tokens
BATCH = 4
TOKENS = BATCH * 16  # the MoE model's tokens per micro-batch
TOP_K, WIDTH, FLOAT32 = 2, 64, 4
# one expert MLP's weights: 64 → 256 → 64, float32, each its own allocator block
EXPERT_BYTES = 2 * 64 * 256 * 4
EXPERTS, BLOCKS = 8, 2


def moe_ep(ep: int = 2, imbalance: float | None = None, spec: str = MOE, **kw):
    plan = ParallelPlan("none", ep, ep=ep, ep_imbalance=imbalance).check()
    return estimate(spec, BATCH, parallel=plan, **kw)


def all_to_all_bytes(spec: str, plan: ParallelPlan, precision: str | None = None) -> list[int]:
    """The sizes of the all-to-all outputs of the last traced step, in order."""
    trace, _, _ = trace_rank(resolve(spec), BATCH, get_profile("h200"), plan, precision, None, 2)
    last = trace.step_starts[-1]
    return [
        trace.blocks[e[1]].size
        for e in trace.events[last:]
        if e[0] == "alloc" and str(trace.blocks[e[1]].op).startswith("all_to_all_single")
    ]


# ---- expert parallel -------------------------------------------------------------------


def test_expert_parallel_halves_the_experts_parameters_gradients_and_optimizer_state():
    one = estimate(MOE, BATCH)
    two = moe_ep(2)
    half = BLOCKS * EXPERTS // 2 * EXPERT_BYTES
    for category, times in (("parameters", 1), ("gradients", 1), ("optimizer_state", 2)):
        mine = getattr(two.categories_at_peak, category)
        assert getattr(one.categories_at_peak, category) - mine == times * half, category
    job = two.extra["distributed"]
    section = job["expert_parallel"]
    assert section["layers"] == BLOCKS and section["storage"] == ["list"]
    assert section["local_experts"] == "0-3" and section["local_expert_count"] == 4
    assert section["expert_parameters"] * 2 == section["model_expert_parameters"]
    assert section["routing"] == "assumed even" and section["imbalance"] == 1.0
    assert job["summary"] == "expert parallel over 2 ranks, routing assumed even"
    assert job["communicators"][0]["group"] == "expert parallel"


def test_the_all_to_all_buffers_are_the_token_copies_even_and_imbalanced():
    row = WIDTH * FLOAT32
    even = moe_ep(2).extra["distributed"]["expert_parallel"]["exchange_bytes_per_layer"]
    # every rank sends its tokens × top-k copies and, routing even, receives as many
    assert even == {"dispatch": TOKENS * TOP_K * row, "combine": TOKENS * TOP_K * row}
    skewed = moe_ep(2, 1.5).extra["distributed"]["expert_parallel"]
    assert skewed["routing"] == "the most loaded rank's experts get 1.5× the even share"
    # the most loaded rank's experts receive 1.5× the even share; its tokens come back whole
    assert skewed["exchange_bytes_per_layer"] == {
        "dispatch": TOKENS * TOP_K * row * 3 // 2,
        "combine": TOKENS * TOP_K * row,
    }
    # and they are the trace's own allocations: each local expert (4 of 8) receives its
    # 16 rows from each of the 2 ranks, each expert call's outputs come back (16 rows)
    plan = ParallelPlan("none", 2, ep=2).check()
    sizes = all_to_all_bytes(MOE, plan)
    per_expert = TOKENS * TOP_K // EXPERTS * row
    forward = sizes[: 2 * BLOCKS * EXPERTS // 2 + BLOCKS * EXPERTS // 2]
    assert sorted(set(forward)) == [per_expert, 2 * per_expert]
    assert forward.count(2 * per_expert) == BLOCKS * EXPERTS // 2


def test_bad_expert_parallel_input_is_one_line_and_exit_2(capsys):
    cases = [
        (["--ep", "3"], "--ep 3 does not divide the 8 experts of blocks.0.moe.experts"),
        (["--ep", "2", "--ep-imbalance", "3"], "--ep-imbalance must be from 1"),
        (["--ep-imbalance", "1.5"], "--ep-imbalance applies with --ep"),
        (["--ep", "2", "--world-size", "4", "--strategy", "hsdp"], "not yet supported"),
        (["--ep", "2", "--world-size", "4", "--strategy", "zero1"], "use --strategy ddp"),
        (["--ep", "2", "--world-size", "4"], "give --strategy (ddp, fsdp or zero2)"),
        (["--ep", "2", "--world-size", "5", "--strategy", "fsdp"], "does not divide"),
        (["--ep", "2", "--world-size", "4", "--tp", "2"], "--ep with --tp is not yet"),
        (["--ep", "2", "--world-size", "4", "--strategy", "fsdp", "--pp", "2"], "--ep with --pp"),
        (["--ep", "2", "--cp", "2"], "--cp with --ep is not yet supported"),
        (["--ep", "2", "--world-size", "4", "--strategy", "ddp", "--cp", "2"], "--cp with --ep"),
    ]
    for args, needle in cases:
        code, _, err = run_cli(capsys, "estimate", MOE, "-b", "2", *args)
        lines = err.strip().splitlines()
        assert code == 2, args
        assert len(lines) == 1 and lines[0].startswith("vramscope: error:"), err
        assert needle in lines[0], (needle, lines[0])


def test_a_model_without_moe_layers_is_refused(capsys):
    code, _, err = run_cli(capsys, "estimate", LONG, "-b", "2", "--ep", "2")
    assert code == 2
    assert "has no mixture-of-experts layer" in err.strip()


def test_transformers_grouped_experts_are_split_along_the_expert_dimension(tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HERE))
    from hf_tiny import tiny_config

    folder = tiny_config("mixtral-8x7b", tmp_path / "mixtral", num_local_experts=4)
    spec = f"hf:{folder}/seq=32"
    one = estimate(spec, 2, precision="bf16-true")
    plan = ParallelPlan("none", 2, ep=2, ep_imbalance=1.5).check()
    two = estimate(spec, 2, precision="bf16-true", parallel=plan)
    section = two.extra["distributed"]["expert_parallel"]
    assert section["storage"] == ["grouped"] and section["local_expert_count"] == 2
    # 2 layers of 4 experts, gate_up 4 × 256 × 64 and down 4 × 64 × 128, bfloat16: half kept
    experts = 2 * 4 * (256 * 64 + 64 * 128) * 2
    assert one.categories_at_peak.parameters - two.categories_at_peak.parameters == experts // 2
    tokens, row = 2 * 32 * 2, 64 * 2  # tokens × top-2, width 64 in bfloat16
    assert section["exchange_bytes_per_layer"] == {
        "dispatch": tokens * row * 3 // 2,
        "combine": tokens * row,
    }


def test_fit_answers_the_micro_batch_of_the_most_loaded_expert_rank():
    from vramscope.fit.search import fit

    plan = ParallelPlan("none", 2, ep=2, ep_imbalance=2.0)
    report = fit(MOE, budget="200MiB", max_batch_size=2, parallel=plan)
    assert report.extra["fit"]["max_batch_size"] == 2
    assert report.workload["ep"] == 2 and report.workload["ep_imbalance"] == 2.0


# ---- context parallel ------------------------------------------------------------------


def test_context_parallel_halves_the_activations_and_keeps_the_parameters(tmp_path, capsys):
    one = estimate(LONG, BATCH)
    out = tmp_path / "cp.json"
    code, stdout, _ = run_cli(
        capsys, "estimate", LONG, "-b", str(BATCH), "--cp", "2", "--json", str(out)
    )
    assert code == 0
    assert "128 of 256 tokens of each sequence on this rank" in " ".join(stdout.split())
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    cats = data["categories_at_peak"]
    assert cats["parameters"] == one.categories_at_peak.parameters
    assert cats["optimizer_state"] == one.categories_at_peak.optimizer_state
    ratio = cats["activations"] / one.categories_at_peak.activations
    assert 0.45 < ratio < 0.6  # half the tokens, plus the keys and values gathered
    section = data["distributed"]["context_parallel"]
    assert section["sequence"] == 256 and section["local_sequence"] == 128
    assert data["workload"]["cp"] == 2


def test_the_ring_gathers_every_ranks_keys_and_values():
    plan = ParallelPlan("none", 2, cp=2).check()
    trace, _, _ = trace_rank(resolve(LONG), BATCH, get_profile("h200"), plan, None, None, 2)
    gathers = [
        trace.blocks[e[1]].size
        for e in trace.events
        if e[0] == "alloc" and str(trace.blocks[e[1]].op).startswith("all_gather")
    ]
    # keys and values of the whole sequence: 2 × batch × 4 heads × 256 tokens × 16, float32
    whole = 2 * BATCH * 4 * 256 * 16 * 4
    # once per layer in forward and once in backward, each of the 2 steps
    assert gathers == [whole] * (2 * 2 * 2)


def test_context_parallel_that_does_not_divide_the_sequence_is_one_line_and_exit_2(capsys):
    code, _, err = run_cli(capsys, "estimate", LONG, "-b", "2", "--cp", "3")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert "--cp 3 does not divide the sequence of 256 tokens" in lines[0]


def test_context_parallel_chunks_too_short_for_the_attention_kernel_say_why(capsys):
    """A 32-token sequence over 2 ranks: 8-token chunks, which torch's memory-efficient
    attention pads to 32 (as on a GPU): one line that says so, exit 2."""
    code, _, err = run_cli(
        capsys, "estimate", f"{HERE / 'distributed_workloads.py'}:llama", "-b", "2", "--cp", "2"
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert "8-token chunks" in lines[0] and "a multiple of 128" in lines[0]


def test_context_parallel_with_fsdp_and_ddp_that_do_not_fit_are_one_line_and_exit_2(capsys):
    cases = [
        (["--world-size", "8"], "give --strategy (ddp, fsdp or zero2)"),
        (["--world-size", "4", "--strategy", "hsdp", "--shard-size", "2"], "not yet supported"),
        (["--world-size", "4", "--strategy", "zero1"], "use --strategy ddp, fsdp or zero2"),
        (["--world-size", "6", "--strategy", "fsdp"], "--cp 4 does not divide --world-size 6"),
        (["--world-size", "8", "--strategy", "fsdp", "--tp", "2"], "--cp with --tp is not yet"),
        (["--world-size", "8", "--strategy", "fsdp", "--pp", "2"], "--cp with --pp is not yet"),
        (["--world-size", "8", "--strategy", "ddp", "--bucket-cap-mb", "0"], "--bucket-cap-mb"),
        (["--world-size", "8", "--strategy", "ddp", "--param-dtype", "bf16"], "applies to FSDP2"),
    ]
    for args, needle in cases:
        code, _, err = run_cli(capsys, "estimate", LONG, "-b", "2", "--cp", "4", *args)
        lines = err.strip().splitlines()
        assert code == 2, args
        assert len(lines) == 1 and lines[0].startswith("vramscope: error:"), err
        assert needle in lines[0], (needle, lines[0])


# ---- with a data-parallel strategy over the ranks that remain -----------------------------


def model_params(spec: str) -> list[tuple[str, torch.Size]]:
    model = resolve(spec).builder(2, torch.device("meta")).model
    return [(n, p.shape) for n, p in model.named_parameters()]


def test_fsdp_over_dp_and_cp_shards_every_parameter_over_both(tmp_path, capsys):
    """--world-size 4 --strategy fsdp --cp 2: a (dp 2, cp 2) mesh; FSDP2 shards every
    parameter over the flattened dp × cp (torchtitan's dp_shard_cp): 4 padded shards, while
    the activations are the context-parallel rank's (half the sequence)."""
    alone = estimate(LONG, BATCH, parallel=ParallelPlan("none", 2, cp=2).check())
    out = tmp_path / "cp-fsdp.json"
    code, _, _ = run_cli(
        capsys,
        "estimate",
        LONG,
        "-b",
        str(BATCH),
        "--world-size",
        "4",
        "--strategy",
        "fsdp",
        "--cp",
        "2",
        "--json",
        str(out),
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    cats = data["categories_at_peak"]
    shards = sum(block(padded_shard_bytes(shape, 4)) for _, shape in model_params(LONG))
    assert cats["parameters"] == shards
    assert cats["optimizer_state"] == 2 * shards  # AdamW: 2 states per shard
    ratio = cats["activations"] / alone.categories_at_peak.activations
    assert 0.95 < ratio < 1.1
    job = data["distributed"]
    assert job["plan"]["shard_group_size"] == 4 and job["plan"]["dp_size"] == 2
    assert job["context_parallel"]["local_sequence"] == 128
    assert job["summary"].startswith("fsdp over 4 (dp 2 × cp 2) × context parallel over 2")
    assert job["mesh"]["dims"] == [{"name": "dp", "size": 2}, {"name": "cp", "size": 2}]
    groups = [(c["group"], c["ranks"]) for c in job["communicators"]]
    assert groups == [("context parallel", 2), ("data parallel", 4)]
    # the 4 ranks hold alike shares: one role, traced once
    assert [r["ranks"] for r in job["roles"]] == ["0-3"]
    assert [r["rank"] for r in job["traced_ranks"]] == [0]
    assert data["workload"]["cp"] == 2 and data["workload"]["strategy"] == "fsdp"


def test_ddp_over_dp_and_cp_keeps_the_whole_model_plus_its_buckets():
    alone = estimate(LONG, BATCH, parallel=ParallelPlan("none", 2, cp=2).check())
    ddp = estimate(LONG, BATCH, parallel=ParallelPlan("ddp", 4, cp=2).check())
    mine, theirs = ddp.categories_at_peak, alone.categories_at_peak
    assert mine.parameters == theirs.parameters
    assert mine.optimizer_state == theirs.optimizer_state
    job = ddp.extra["distributed"]
    # DDP's gradient buckets hold every gradient of the rank, beside its share of the sequence
    buckets = next(item for item in job["memory"] if item["name"] == "ddp_gradient_buckets")
    whole = sum(math.prod(shape) * FLOAT32 for _, shape in model_params(LONG))
    assert sum(buckets["bucket_sizes"]) == whole
    assert ddp.peak.allocated_bytes > alone.peak.allocated_bytes
    assert [r["ranks"] for r in job["roles"]] == ["0-3"]


def expert_split(spec: str, ep: int, rank: int = 0) -> tuple[list, list]:
    """The MoE model's parameter shapes: the experts ``rank`` keeps of ``ep``, the rest."""
    share = EXPERTS // ep
    local, rest = [], []
    for name, shape in model_params(spec):
        if ".experts." in name:
            index = int(name.split(".experts.")[1].split(".")[0])
            if rank * share <= index < (rank + 1) * share:
                local.append(shape)
        else:
            rest.append(shape)
    return local, rest


def test_fsdp_with_expert_parallel_shards_the_experts_over_dp_mod_ep_and_the_rest_over_dp():
    """--world-size 4 --strategy fsdp --ep 2 (torchtitan's layout): each rank keeps 4 of the
    8 experts of each layer, FSDP2 shards those over the 2 ranks that hold the same experts
    (dp_mod_ep), every other parameter over all 4 data-parallel ranks."""
    report = estimate(MOE, BATCH, parallel=ParallelPlan("fsdp", 4, ep=2).check())
    local, rest = expert_split(MOE, 2)
    experts = sum(block(padded_shard_bytes(s, 2)) for s in local)
    others = sum(block(padded_shard_bytes(s, 4)) for s in rest)
    assert experts == BLOCKS * EXPERTS // 2 * EXPERT_BYTES // 2
    cats = report.categories_at_peak
    assert cats.parameters == experts + others
    assert cats.optimizer_state == 2 * (experts + others)
    job = report.extra["distributed"]
    assert job["summary"] == (
        "fsdp over 4, experts over 2 × expert parallel over 2 ranks (4 ranks), routing assumed even"
    )
    section = job["expert_parallel"]
    assert section["local_experts"] == "0-3" and section["size"] == 2
    # the exchanges are the expert-parallel group's: as with --ep 2 alone
    even = moe_ep(2).extra["distributed"]["expert_parallel"]["exchange_bytes_per_layer"]
    assert section["exchange_bytes_per_layer"] == even
    assert [r["ranks"] for r in job["roles"]] == ["0-3"]
    assert report.workload["ep"] == 2 and report.workload["strategy"] == "fsdp"


def test_ddp_with_expert_parallel_holds_the_ranks_experts_whole():
    alone = moe_ep(2)
    ddp = estimate(MOE, BATCH, parallel=ParallelPlan("ddp", 4, ep=2).check())
    mine, theirs = ddp.categories_at_peak, alone.categories_at_peak
    assert mine.parameters == theirs.parameters
    assert mine.optimizer_state == theirs.optimizer_state
    assert ddp.peak.allocated_bytes > alone.peak.allocated_bytes  # DDP's buckets
    job = ddp.extra["distributed"]
    # its buckets hold the gradients of what the rank holds: its experts and the rest
    local, rest = expert_split(MOE, 2)
    held = sum(math.prod(shape) * FLOAT32 for shape in local + rest)
    buckets = next(item for item in job["memory"] if item["name"] == "ddp_gradient_buckets")
    assert sum(buckets["bucket_sizes"]) == held
    assert job["summary"].startswith("ddp over 4 × expert parallel over 2 ranks")
