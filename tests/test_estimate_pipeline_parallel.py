"""Per-rank estimates with pipeline parallel: the small Llama of distributed_workloads cut
into stages (its repeated blocks divided evenly, the embedding on the first stage, the norm,
head and loss on the last), each stage run in its schedule's order of forwards and
backwards under torch's fake process group. The numbers asserted follow from what a stage
keeps: the activations of the micro-batches its schedule has in flight, a receive buffer
per micro-batch for each activation and each gradient crossing its boundaries."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from cli_run import run_cli
from vramscope import schema
from vramscope.distributed import pipeline
from vramscope.distributed.pipeline import most_in_flight, schedule_order, split_blocks
from vramscope.distributed.sharding import ParallelPlan
from vramscope.estimate.estimator import estimate
from vramscope.workload import resolve

HERE = Path(__file__).resolve().parent
LLAMA = f"{HERE / 'distributed_workloads.py'}:llama"  # 2 layers, width 64, 32 tokens
LLAMA4 = f"{HERE / 'distributed_workloads.py'}:llama4"  # the same, 4 layers
BATCH = 16
# one micro-batch's hidden state between two blocks: batch × tokens × width, float32
BOUNDARY = BATCH * 32 * 64 * 4


def pp(spec: str, stages: int, schedule: str = "1f1b", microbatches: int | None = None, **kw):
    plan = ParallelPlan(
        "none", stages, pp=stages, pp_schedule=schedule, microbatches=microbatches, **kw
    )
    return estimate(spec, BATCH, parallel=plan.check())


def stages(report) -> dict[str, dict]:
    return {r["stage"]: r for r in report.extra["distributed"]["roles"]}


def allocated(row: dict) -> int:
    return row["peak"]["allocated_bytes"]


# ---- the order of each schedule ----------------------------------------------------------


def test_1f1b_keeps_as_many_micro_batches_in_flight_as_stages_after_it():
    # stage s of N forwards N - s micro-batches before its first backward
    flight = [most_in_flight(schedule_order("1f1b", 4, 8, s)) for s in range(4)]
    assert flight == [{0: 4}, {1: 3}, {2: 2}, {3: 1}]
    # GPipe forwards all M first
    assert [most_in_flight(schedule_order("gpipe", 4, 8, s)) for s in range(4)] == [
        {s: 8} for s in range(4)
    ]


def test_interleaved_order_is_torchs_two_virtual_stages_per_rank():
    order = schedule_order("interleaved-1f1b", 2, 4, 0)
    # rank 0 holds stages 0 and 2; every micro-batch forwarded and backwarded on each
    assert {a.stage for a in order} == {0, 2}
    assert sorted((a.kind, a.stage, a.microbatch) for a in order) == sorted(
        (k, s, m) for k in "FB" for s in (0, 2) for m in range(4)
    )
    assert most_in_flight(order) == {0: 4, 2: 2}


def test_blocks_divide_evenly_the_first_stages_taking_the_rest():
    assert split_blocks(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert split_blocks(10, 2, (7,)) == [range(0, 7), range(7, 10)]


# ---- what each stage holds ---------------------------------------------------------------


def test_each_stage_holds_its_own_parameters_and_receive_buffers():
    report = pp(LLAMA, 2, microbatches=4)
    rows = stages(report)
    first, last = rows["0"], rows["1"]
    assert first["holds"] == ["embed_tokens, layers.0"]
    assert last["holds"] == ["layers.1, norm, lm_head, the loss"]
    model = resolve(LLAMA).builder(2, torch.device("meta")).model

    def params(*names: str) -> tuple[int, int]:
        """The modules' parameters: how many, and their blocks (each float32, rounded to
        the allocator's 512 bytes)."""
        ps = [p for n in names for p in model.get_submodule(n).parameters()]
        return sum(p.numel() for p in ps), sum(math.ceil(p.numel() * 4 / 512) * 512 for p in ps)

    held = {"0": params("embed_tokens", "layers.0"), "1": params("layers.1", "norm", "lm_head")}
    assert first["parameters"] == held["0"][0] and last["parameters"] == held["1"][0]
    # torch's PipelineStage: a buffer per micro-batch for the activation coming in (not on
    # the first stage) and for the gradient coming back (not on the last)
    assert first["recv_buffer_bytes"] == 0 and last["grad_recv_buffer_bytes"] == 0
    assert last["recv_buffer_bytes"] == first["grad_recv_buffer_bytes"] == 4 * BOUNDARY
    # the report is the most loaded stage's, and its parameters are that stage's
    job = report.extra["distributed"]
    heaviest = max(rows.values(), key=allocated)
    assert job["rank"] == heaviest["traced_rank"]
    assert report.categories_at_peak.parameters == held[heaviest["stage"]][1]
    assert report.categories_at_peak.optimizer_state == 2 * held[heaviest["stage"]][1]
    assert [r["rank"] for r in job["traced_ranks"]] == [0, 1]


def test_gpipe_holds_every_micro_batch_each_one_more_costs_its_activations_and_buffer():
    two, four = (stages(pp(LLAMA, 2, "gpipe", m)) for m in (2, 4))
    assert two["0"]["in_flight"] == [2] and four["0"]["in_flight"] == [4]
    # one micro-batch's activations of the first stage (its embedding and block)
    one = (four["0"]["activations_at_peak_bytes"] - two["0"]["activations_at_peak_bytes"]) // 2
    assert one > 10 * BOUNDARY  # a Llama block saves many times its input
    # each micro-batch more: its activations and one more gradient receive buffer
    assert allocated(four["0"]) - allocated(two["0"]) == 2 * (one + BOUNDARY)
    # the last stage: its activations, and one more activation receive buffer
    last = (four["1"]["activations_at_peak_bytes"] - two["1"]["activations_at_peak_bytes"]) // 2
    assert allocated(four["1"]) - allocated(two["1"]) == 2 * (last + BOUNDARY)
    # 1F1B with 4 micro-batches: stage 0 keeps 2 in flight (N - 0), the last stage 1
    onef = stages(pp(LLAMA, 2, "1f1b", 4))
    assert onef["0"]["in_flight"] == [2] and onef["1"]["in_flight"] == [1]
    # ... so its first stage holds 2 micro-batches' activations where GPipe holds 4
    saved = four["0"]["activations_at_peak_bytes"] - onef["0"]["activations_at_peak_bytes"]
    assert saved == pytest.approx(2 * one, rel=0.01)
    assert allocated(onef["0"]) < allocated(four["0"])
    # and the last stage one micro-batch's, where GPipe's holds 4
    assert onef["1"]["activations_at_peak_bytes"] == pytest.approx(last, rel=0.01)


def test_stages_alike_are_traced_once():
    # GPipe over 4 stages of one block: the middle two hold the same and run the same order
    report = pp(LLAMA4, 4, "gpipe", 4)
    job = report.extra["distributed"]
    assert [r["stage"] for r in job["roles"]] == ["0", "1-2", "3"]
    assert [r["rank"] for r in job["traced_ranks"]] == [0, 1, 3]
    middle = stages(report)["1-2"]
    assert middle["ranks"] == "1-2" and middle["count"] == 2
    assert middle["holds"] == ["layers.1"] and middle["in_flight"] == [4]
    assert middle["recv_buffer_bytes"] == middle["grad_recv_buffer_bytes"] == 4 * BOUNDARY


def test_interleaved_ranks_hold_two_virtual_stages():
    report = pp(LLAMA4, 2, "interleaved-1f1b", 2)
    rows = stages(report)
    assert rows["0"]["virtual_stages"] == [0, 2] and rows["1"]["virtual_stages"] == [1, 3]
    assert rows["0"]["holds"] == ["embed_tokens, layers.0", "layers.2"]
    assert rows["1"]["holds"] == ["layers.1", "layers.3, norm, lm_head, the loss"]
    flight = most_in_flight(schedule_order("interleaved-1f1b", 2, 2, 0))
    assert rows["0"]["in_flight"] == [flight[0], flight[2]]
    # rank 0 receives into stage 2 and gets gradients back for stages 0 and 2
    assert rows["0"]["recv_buffer_bytes"] == 2 * BOUNDARY
    assert rows["0"]["grad_recv_buffer_bytes"] == 2 * 2 * BOUNDARY


def test_split_points_move_blocks_between_stages(capsys, tmp_path):
    out = tmp_path / "stages.json"
    code, stdout, _ = run_cli(
        capsys, "estimate", LLAMA4, "-b", "4", "--pp", "2", "--pp-split", "3", "--json", str(out)
    )
    assert code == 0
    assert "Pipeline stages (each traced once)" in stdout
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    rows = data["distributed"]["roles"]
    assert [(r["stage"], r["ranks"], r["in_flight"]) for r in rows] == [
        ("0", "0", [2]),
        ("1", "1", [1]),
    ]
    assert [r["holds"] for r in rows] == [
        ["embed_tokens, layers.0-2"],
        ["layers.3, norm, lm_head, the loss"],
    ]
    job = data["distributed"]
    assert job["plan"]["pp_split"] == [3]
    assert job["pipeline"]["schedule"] == "1f1b"
    assert job["pipeline"]["microbatches"] == 4  # twice the stages
    assert data["workload"]["pp"] == 2


# ---- fit and the command line --------------------------------------------------------------


def test_fit_answers_the_micro_batch_of_the_most_loaded_stage():
    from vramscope.fit.search import fit

    plan = ParallelPlan("none", 2, pp=2, microbatches=4)
    report = fit(LLAMA, budget="200MiB", max_batch_size=2, parallel=plan)
    section = report.extra["fit"]
    best = section["max_batch_size"]
    assert best == 2  # the cap: a small model
    per_rank = section["per_rank"]
    assert per_rank["pp"] == 2 and per_rank["microbatches"] == 4
    assert per_rank["job_batch_size"] == best * 4  # 4 micro-batches a step
    assert per_rank["most_loaded_stage"] in (0, 1)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--world-size", "3", "--pp", "2"], "--pp 2 does not divide --world-size 3"),
        (["--pp", "3"], "3 stages but the model has 2 repeated blocks"),
        (["--pp", "2", "--pp-schedule", "zb"], "unknown --pp-schedule 'zb'"),
        (["--pp", "2", "--microbatches", "1"], "1F1B needs at least one micro-batch per stage"),
        (["--pp", "2", "--pp-schedule", "interleaved-1f1b"], "4 stages but the model has 2"),
        (["--world-size", "4", "--pp", "2"], "leaves 2 data-parallel ranks: give --strategy"),
        (["--world-size", "6", "--pp", "2", "--tp", "2", "--strategy", "fsdp"], "does not divide"),
        (["--world-size", "8", "--pp", "2", "--tp", "2"], "--pp 2 × --tp 2 leaves 2 data-parallel"),
        (
            ["--world-size", "4", "--pp", "2", "--tp", "2", "--strategy", "fsdp"],
            "takes all 4 ranks",
        ),
        (["--world-size", "8", "--pp", "2", "--tp", "2", "--strategy", "ddp"], "with --tp is not"),
        (
            [
                "--world-size",
                "4",
                "--pp",
                "2",
                "--strategy",
                "ddp",
                "--pp-schedule",
                "interleaved-1f1b",
            ],
            "interleaved-1f1b is not yet supported",
        ),
        (["--microbatches", "4"], "--microbatches applies with --pp"),
        (["--pp", "2", "--pp-split", "1,2"], "2 stages need 1"),
        (["--pp", "2", "--pp-split", "a"], "block indices separated by commas"),
        (["--pp", "2", "--accumulate", "2"], "give --microbatches"),
        (["--pp", "2", "--precision", "16-mixed"], "--pp with 16-mixed is not yet supported"),
    ],
)
def test_bad_pipelines_are_one_line_and_exit_2(capsys, args, needle):
    code, _, err = run_cli(capsys, "estimate", LLAMA, "-b", "2", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:") and needle in lines[0]


# ---- pipeline stages with data and tensor parallel -------------------------------------------

# the projections the default tensor-parallel plan splits, by their names in ExampleLlama
SPLIT = ("embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")
SPLIT += ("down_proj", "lm_head")
# LLAMA4's two stages (--pp 2): their modules
STAGE_MODULES = {0: ("embed_tokens", "layers.0.", "layers.1."), 1: ("layers.2.", "layers.3.")}
STAGE_MODULES[1] += ("norm", "lm_head")


def stage_shapes(stage: int) -> dict[str, tuple[int, ...]]:
    model = resolve(LLAMA4).builder(2, torch.device("meta")).model
    return {
        n: tuple(p.shape) for n, p in model.named_parameters() if n.startswith(STAGE_MODULES[stage])
    }


def shard_bytes(stage: int, tp: int, dp: int) -> int:
    """The stage's parameters as one rank holds them: a tensor-parallel share of the split
    projections (dimension 0; dimension 1 for the row-wise o_proj and down_proj), the norms
    whole, then FSDP2's shard of that over ``dp`` ranks (dimension 0 in ``dp`` chunks, each
    padded to the first's); float32, in the allocator's 512-byte blocks."""
    total = 0
    for name, shape in stage_shapes(stage).items():
        shape = list(shape)
        if tp > 1 and any(s in name for s in SPLIT):
            shape[1 if any(s in name for s in ("o_proj", "down_proj")) else 0] //= tp
        rows = shape[0]
        total += math.ceil(math.ceil(rows / dp) * (math.prod(shape) // rows) * 4 / 512) * 512
    return total


def mesh(world: int, strategy: str, **kw):
    plan = ParallelPlan(strategy, world, pp=2, microbatches=4, **kw).check()
    return estimate(LLAMA4, BATCH, parallel=plan)


def traced_elements(world: int, strategy: str, rank: int, **kw) -> tuple[int, int, int]:
    """The traced rank's parameters, as its objects hold them: the stage's, the elements of
    its local shards, and of those the tensor-parallel plan leaves whole (the norms)."""
    from torch.distributed.tensor import DTensor, Shard

    from vramscope.estimate.distributed import trace_rank
    from vramscope.estimate.profiles import get_profile

    plan = ParallelPlan(strategy, world, rank=rank, pp=2, microbatches=4, **kw).check()
    _, tracer, _ = trace_rank(resolve(LLAMA4), BATCH, get_profile("h200"), plan, None, None, 2)
    local = whole = 0
    for p in tracer.applied.workload.model.parameters():
        local += p._local_tensor.numel() if isinstance(p, DTensor) else p.numel()
        tp_split = isinstance(p, DTensor) and any(
            isinstance(x, Shard)
            for x, dim in zip(p.placements, p.device_mesh.mesh_dim_names, strict=True)
            if dim == "tp"
        )
        if not tp_split:
            whole += p.numel()
    return tracer.pipeline.stage_parameters, local, whole


def test_fsdp_inside_each_stage_shards_the_stages_parameters_over_its_data_parallel_ranks():
    # 4 ranks: 2 stages × FSDP over 2; every dimension of the stage's parameters divides by 2
    stage, local, _ = traced_elements(4, "fsdp", rank=2)
    assert local * 2 == stage  # the stage's parameters / dp, exactly
    report = mesh(4, "fsdp")
    rows = stages(report)
    assert [(r["stage"], r["ranks"], r["dp_ranks"]) for r in rows.values()] == [
        ("0", "0-1", "0-1"),
        ("1", "2-3", "0-1"),
    ]
    assert [r["rank"] for r in report.extra["distributed"]["traced_ranks"]] == [0, 2]
    # what the build leaves on the device: the stage's shards, no whole parameter kept
    traced = report.extra["distributed"]["rank"]
    stage_of = {0: 0, 2: 1}[traced]
    assert report.steps[0].start_allocated_bytes == shard_bytes(stage_of, tp=1, dp=2)
    # the optimizer state: AdamW's two moments of the shards
    assert report.categories_at_peak.optimizer_state == 2 * shard_bytes(stage_of, tp=1, dp=2)
    job = report.extra["distributed"]
    assert [c["group"] for c in job["communicators"]] == ["pipeline", "data parallel"]
    assert job["summary"].startswith("pipeline of 2 stages") and "fsdp over 2" in job["summary"]


def test_tensor_parallel_inside_each_stage_splits_its_projections_and_its_boundary():
    stage, local, whole = traced_elements(4, "none", rank=0, tp=2)
    assert (local - whole) * 2 == stage - whole  # the split projections / tp, exactly
    report = mesh(4, "none", tp=2)
    rows = stages(report)
    assert [(r["stage"], r["ranks"], r["tp_ranks"]) for r in rows.values()] == [
        ("0", "0-1", "0-1"),
        ("1", "2-3", "0-1"),
    ]
    traced = report.extra["distributed"]["rank"]
    assert report.steps[0].start_allocated_bytes == shard_bytes(traced // 2, tp=2, dp=1)
    # sequence parallel (the default plan for ExampleLlama): a stage sends and receives its
    # share of the sequence, a buffer per micro-batch
    assert report.extra["distributed"]["tensor_parallel"]["sequence_parallel"] is True
    assert (
        rows["1"]["recv_buffer_bytes"] == rows["0"]["grad_recv_buffer_bytes"] == 4 * BOUNDARY // 2
    )


def test_a_3d_mesh_shards_each_stages_tensor_parallel_share_over_data_parallel():
    # 8 ranks: 2 stages × FSDP over 2 × tensor parallel 2 (tp innermost, pp outermost)
    stage, local, whole = traced_elements(8, "fsdp", rank=4, tp=2)
    assert (local - whole // 2) * 4 == stage - whole  # split ones / (tp · dp), norms / dp
    report = mesh(8, "fsdp", tp=2)
    rows = stages(report)
    assert [(r["stage"], r["ranks"], r["tp_ranks"], r["dp_ranks"]) for r in rows.values()] == [
        ("0", "0-3", "0-1", "0-1"),
        ("1", "4-7", "0-1", "0-1"),
    ]
    assert [r["rank"] for r in report.extra["distributed"]["traced_ranks"]] == [0, 4]
    traced = report.extra["distributed"]["rank"]
    assert report.steps[0].start_allocated_bytes == shard_bytes(traced // 4, tp=2, dp=2)
    job = report.extra["distributed"]
    assert [c["group"] for c in job["communicators"]] == [
        "pipeline",
        "data parallel",
        "tensor parallel",
    ]
    assert job["mesh"]["dims"] == [
        {"name": "pp", "size": 2},
        {"name": "dp", "size": 2},
        {"name": "tp", "size": 2},
    ]


def test_stages_alike_share_one_row_with_all_their_data_parallel_ranks():
    plan = ParallelPlan("fsdp", 8, pp=4, pp_schedule="gpipe", microbatches=4).check()
    report = estimate(LLAMA4, BATCH, parallel=plan)
    job = report.extra["distributed"]
    assert [(r["stage"], r["ranks"], r["count"]) for r in job["roles"]] == [
        ("0", "0-1", 2),
        ("1-2", "2-5", 4),
        ("3", "6-7", 2),
    ]
    assert [r["rank"] for r in job["traced_ranks"]] == [0, 2, 6]


def test_ddp_and_zero1_inside_stages_hold_whole_and_partitioned_optimizer_state():
    ddp, zero1 = mesh(4, "ddp"), mesh(4, "zero1")
    whole = shard_bytes(ddp.extra["distributed"]["rank"] // 2, tp=1, dp=1)
    assert ddp.categories_at_peak.parameters == whole
    assert ddp.categories_at_peak.optimizer_state == 2 * whole
    # ZeroRedundancyOptimizer over the stage's 2 data-parallel ranks, not the world's 4
    assert zero1.extra["distributed"]["rank"] == ddp.extra["distributed"]["rank"]
    assert zero1.categories_at_peak.optimizer_state == pytest.approx(whole, rel=0.1)


def test_fit_answers_the_micro_batch_of_the_most_loaded_stage_of_a_3d_mesh():
    from vramscope.fit.search import fit

    plan = ParallelPlan("fsdp", 8, pp=2, tp=2, microbatches=2).check()
    section = fit(LLAMA, budget="200MiB", max_batch_size=2, parallel=plan).extra["fit"]
    per_rank = section["per_rank"]
    assert section["max_batch_size"] == 2  # the cap: a small model
    # each step: micro-batches × pipeline micro-batches × data-parallel ranks
    assert per_rank["job_batch_size"] == 2 * 2 * 2
    assert per_rank["most_loaded_stage"] in (0, 1)


def test_compare_puts_the_data_parallel_strategies_of_a_pipeline_side_by_side():
    from vramscope.fit.compare import compare

    plan = ParallelPlan("fsdp", 4, pp=2, microbatches=2)
    report = compare([LLAMA], 2, parallel=plan, parallel_each=True)
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    assert list(rows)[:3] == ["ddp", "zero1", "zero2"]
    # ZeRO-1 partitions the optimizer state over the stage's data-parallel ranks: less
    assert rows["zero1"]["peak"]["allocated_bytes"] < rows["ddp"]["peak"]["allocated_bytes"]
    assert rows["fsdp"]["peak"]["allocated_bytes"] < rows["ddp"]["peak"]["allocated_bytes"]


def test_1f1b_traces_one_steady_round_and_holds_what_the_whole_step_holds(monkeypatch):
    import vramscope.distributed.pipeline as pipeline

    plan = ParallelPlan("fsdp", 4, pp=2, microbatches=6).check()
    short = stages(estimate(LLAMA, BATCH, parallel=plan))
    # stage s: its warm-up (2 - s forwards) and one backward-forward pair
    assert [r["traced_microbatches"] for r in short.values()] == [3, 2]
    monkeypatch.setattr(pipeline, "traced_microbatches", lambda schedule, pp, m, rank: m)
    whole = stages(estimate(LLAMA, BATCH, parallel=plan))
    assert [r["traced_microbatches"] for r in whole.values()] == [6, 6]
    for stage, row in short.items():
        assert row["peak"] == whole[stage]["peak"]
        assert row["activations_at_peak_bytes"] == whole[stage]["activations_at_peak_bytes"]
        # the receive buffers are made for every micro-batch, the untraced ones too
        assert row["recv_buffer_bytes"] == whole[stage]["recv_buffer_bytes"]


def test_data_parallel_inside_stages_leaves_what_each_micro_batch_saves_alone():
    # the other stages' work (run for the shapes) is not this GPU's under FSDP's and DDP's
    # parameters either: each stage saves what it saves without data parallel
    alone = stages(pp(LLAMA, 2, microbatches=4))
    for strategy in ("fsdp", "ddp"):
        plan = ParallelPlan(strategy, 4, pp=2, microbatches=4).check()
        rows = stages(estimate(LLAMA, BATCH, parallel=plan))
        for stage, row in rows.items():
            saved = row["activations_at_peak_bytes"]
            assert saved == alone[stage]["activations_at_peak_bytes"], (strategy, stage)


def test_a_3d_mesh_on_the_command_line_reports_a_row_per_stage(capsys, tmp_path):
    out = tmp_path / "3d.json"
    code, stdout, _ = run_cli(
        capsys,
        *("estimate", LLAMA, "-b", "2", "--world-size", "8", "--strategy", "fsdp"),
        *("--tp", "2", "--pp", "2", "--json", str(out)),
    )
    assert code == 0
    assert "Pipeline stages (each traced once)" in stdout
    data = json.loads(out.read_text())
    assert schema.errors(data) == []
    rows = data["distributed"]["roles"]
    assert [(r["stage"], r["ranks"], r["count"]) for r in rows] == [
        ("0", "0-3", 4),
        ("1", "4-7", 4),
    ]
    assert data["workload"]["pp"] == 2 and data["workload"]["tp"] == 2
    assert data["distributed"]["plan"]["dp_size"] == 2


def test_the_last_stage_keeps_each_micro_batchs_output_until_its_backward(monkeypatch):
    """torch's ``PipelineStage`` keeps the last stage's output (the logits) in ``fwd_cache``
    beside the loss computed from it, and ``backward_one_chunk`` holds it until the
    micro-batch's backward is done: on an H200 (torch 2.11, example:llama, 2 stages, 1F1B)
    the last stage's peak, in the loss's backward, held the logits, and the estimate that
    let them go at the loss was 64 MiB short (-8.6 %). Here the logits of one micro-batch
    (16 × 32 tokens × 512 words, float32: 1 MiB) are the difference at the peak."""
    import vramscope.distributed.pipeline as pipeline

    kept = stages(pp(LLAMA, 2, microbatches=4))

    class Forgotten(dict):
        def __setitem__(self, key, value):  # the output let go at the loss
            pass

    init = pipeline.PipelineStep.__init__

    def forgetting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.last_outputs = Forgotten()

    monkeypatch.setattr(pipeline.PipelineStep, "__init__", forgetting)
    let_go = stages(pp(LLAMA, 2, microbatches=4))
    logits = BATCH * 32 * 512 * 4
    assert allocated(kept["1"]) - allocated(let_go["1"]) == logits
    assert allocated(kept["0"]) == allocated(let_go["0"])  # not the last stage


def test_the_gradient_of_a_received_activation_goes_once_the_next_backward_has_sent_it(
    monkeypatch,
):
    """torch's ``stage_backward`` takes the gradient of each received activation from its
    receive buffer (``.grad = None``), and 1F1B's step holds it in its send ops only until
    the next backward's are made: on an H200 (torch 2.11, example:llama, 2 stages, 1F1B, 4
    micro-batches) the last stage's peak, in its last backward, held one of them, the
    previous micro-batch's, and the estimate that kept each until the next step was over
    by the two before it (+1.04 %). Here every micro-batch is traced: keeping them all
    until the step's end costs the last stage two hidden states more at its peak (the
    first stage receives none)."""
    import vramscope.distributed.pipeline as pipeline

    monkeypatch.setattr(pipeline, "traced_microbatches", lambda schedule, pp, m, rank: m)
    sent = stages(pp(LLAMA, 2, microbatches=4))

    def kept(self, action, sending):  # each gradient held until the schedule's step ends
        buffers = self.recv.get(action.stage)
        if buffers is not None:
            buffer = buffers[action.microbatch]
            sending.setdefault(action.stage, []).append(buffer.grad)
            buffer.grad = None

    monkeypatch.setattr(pipeline.PipelineStep, "_sent", kept)
    held = stages(pp(LLAMA, 2, microbatches=4))
    assert allocated(held["1"]) - allocated(sent["1"]) == 2 * BOUNDARY
    assert allocated(held["0"]) == allocated(sent["0"])


@pytest.mark.parametrize("kind", ["no_grad", "grad", None])
def test_the_first_step_runs_torchs_metadata_inference_before_the_micro_batches(monkeypatch, kind):
    """torch's stage learns its shapes on real tensors before its first micro-batch: torch
    2.11 a forward under no_grad on zeros of the received shape, dropped before the receive
    buffers are made; newer torch a forward with grad on an empty input, the receive buffers
    made while its graph lives, then the input's gradient. Its blocks shape the allocator's
    segments: on the H200 (torch 2.11) example:llama's last stage at batch 8, 4 micro-batches,
    reserved 790,626,304 bytes, as the estimate now does (786,432,000 without it)."""
    monkeypatch.setattr(pipeline, "metadata_inference", lambda: kind)
    forwards: list[str | None] = []  # each forward of the last stage: inferring or not
    buffers: list[bool] = []  # receive buffers made: while the inference's input lives
    forward, receive = pipeline.PipelineStep._forward, pipeline.PipelineStep._receive_buffers

    def spy_forward(self, stage, microbatch):
        forwards.append(self._inferring)
        return forward(self, stage, microbatch)

    def spy_receive(self, stage, like):
        if stage not in self.recv:
            buffers.append(bool(self._inference_inputs))
        return receive(self, stage, like)

    monkeypatch.setattr(pipeline.PipelineStep, "_forward", spy_forward)
    monkeypatch.setattr(pipeline.PipelineStep, "_receive_buffers", spy_receive)
    plan = ParallelPlan("none", 2, rank=1, pp=2, microbatches=4).check()
    report = estimate(LLAMA, BATCH, parallel=plan)
    # each traced step object infers once, at its first step, then runs the micro-batches
    assert forwards[0] == kind and forwards[1] is None
    assert all(a is None or b is None for a, b in itertools.pairwise(forwards))
    assert buffers and buffers[0] == (kind == "grad")
    row = stages(report)["1"]
    assert row["recv_buffer_bytes"] == 4 * BOUNDARY  # made once, whatever ran first
