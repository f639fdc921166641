"""Per-rank estimates against a measured job: two (or four) ranks sharing one GPU over gloo.

Usage (on a machine with a CUDA GPU):
    python benchmarks/distributed_accuracy.py [--gpu h200] [--cases NAME,...] [--steps 3]
        [--out benchmarks/results/distributed_accuracy_h200.json]

Without a GPU, the estimates made again against a recorded run's measurements:
    python benchmarks/distributed_accuracy.py --measured benchmarks/results/distributed_accuracy_h200.json

For each case (a workload, a batch size per GPU, a precision, a strategy) it

* measures the job: ``vramscope run --nproc 2 --json job.json`` runs this file with
  ``--rank-job``: each rank joins a gloo process group, builds the workload on cuda:0 (both
  ranks share the one GPU), applies the strategy with vramscope's own
  ``distributed.sharding.apply_plan`` (what the estimate applies, so both sides run the same
  DDP or ``fully_shard`` calls), drops the workload as built (its optimizer holds the
  parameters before sharding), calls ``torch.cuda.empty_cache()`` after sharding (the
  estimate holds a sharded model as shards from the start), runs the standard step and
  writes its own ``max_memory_allocated()`` / ``max_memory_reserved()``;
* estimates the same job on the CPU: ``vramscope.estimate(..., parallel=ParallelPlan(
  strategy, 2, rank=r, backend="gloo"))`` for each rank, the per-rank peaks from the report
  (over gloo: no NCCL buffers, gloo's copy of each reduce-scatter input on the device);
* prints and writes, per rank, estimated against measured peak allocated, reserved and
  device used.

Tensor parallel (``tp`` in a case's settings): the job is ``tp`` ranks, or ``tp`` × 2 with a
data-parallel strategy (TP × FSDP 2 × 2: four ranks on the one GPU); each rank applies the
same plan with ``apply_plan`` (``parallelize_module``, then ``fully_shard`` on the 2-D
mesh). The estimate traces one rank per role (``distributed.roles``) and each rank is
compared with its role's row. The ``*-own-plan`` cases use ``benchmarks/tp_workloads.py``'s
plan, whose collectives are all-reduces alone (gloo runs those for CUDA tensors through
host copies; FSDP2's all-gathers and reduce-scatters on the 2-D mesh are torch.distributed's
own ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, which gloo runs for CUDA
tensors too). The default plan (the ``example-llama-*`` cases) gathers the head's logits,
and with sequence parallel the blocks' inputs, with torch's functional all-gather
(DTensor's Shard to Replicate), which is the group's ``allgather_into_tensor_coalesced``:
ProcessGroupGloo has no CUDA path for it (torch 2.11 on an H200: the rank dies of SIGSEGV).
On CUDA those cases are estimated and not measured: a case whose estimate counts functional
all-gathers (``distributed.tensor_parallel.functional_all_gathers``, the estimate's
``gloo_cuda_all_gather`` warning) is recorded as skipped, with the reason. On the CPU
(``--allow-cpu``) gloo runs them. The tensor-parallel cases alone:
    python benchmarks/distributed_accuracy.py --cases tp --out benchmarks/results/distributed_accuracy_tp_h200.json

Staged cases (``STAGED``; ``--cases staged``): the default plan's tensor-parallel cases,
pipeline (``example-llama-pp2-1f1b``), context parallel (``example-llama-cp2``: torch's
``context_parallel`` on the estimate's 1-D mesh) and expert parallel (``moe-ep2``:
``apply_expert_parallel`` on ``moe_workloads.py:moe_grouped`` over the real group). Their
ranks load ``staged_gloo.py``: the ops gloo has no CUDA path for (point to point, the
functional collectives) and FSDP2's tensor collectives run on CPU copies, the results
copied into the device tensors, which are so those of the job over NCCL (see that module's
docstring): they are estimated for nccl, device used less the estimate's NCCL buffers.
Each rank records the ops it staged (``staged_calls``). On the CPU, ``--allow-cpu
--stage-cpu`` stages CPU tensors too (``VRAMSCOPE_STAGE_CPU=1``), and the context-parallel
rank gets CPU attention kernels torch's ring can call (``cpu_attention.py``):
    python benchmarks/distributed_accuracy.py --allow-cpu --stage-cpu --cases staged --steps 1 --out /tmp/staged.json

Targets (issue 15, issue 33): per rank, allocated within 3 %, reserved within 5 %.
``--cases`` picks cases by name (see CASES); ``hf:`` cases need transformers. The results
are written after every case (``"complete": false`` until the last), so a run cut short
keeps what it measured. ``--measured FILE`` keeps FILE's measured fields and its meta, and
writes the new estimates beside them (``meta.estimated`` says where and when). A run
recorded before the rank job dropped the workload as built (``meta.built_workload_dropped``
false or missing) kept the parameters as built on the device in its FSDP and ZeRO-2 jobs;
``alloc err+`` (``error_pct.allocated_without_held``) compares with measured allocated less
those bytes (``held_built_parameter_bytes``).

A job that fails is recorded with the failing rank's exception (its last line, and where
the innermost frame raised it) or the signal that killed it, without this machine's paths;
its whole stderr is kept as ``WORKDIR/CASE/stderr.txt`` (``--workdir``), and ``--verbose``
prints it. The ranks run with this checkout's ``src`` ahead of the caller's ``PYTHONPATH``
(vramscope's dependencies installed there, such as orjson, stay importable).

``--allow-cpu`` runs the jobs on the CPU, for the plumbing alone (nothing is measured
there): ``python benchmarks/distributed_accuracy.py --allow-cpu --cases
example-gpt-ddp,example-gpt-fsdp --out /tmp/plumbing.json`` (about 45 s on 2 cores;
``--cases tp``, the five tensor-parallel cases, about 5 minutes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET_ALLOCATED_PCT, TARGET_RESERVED_PCT = 3.0, 5.0
WORLD = 2  # ranks of a data-parallel case (a tensor-parallel one: tp, or tp × 2)
TP_WORKLOADS = f"{HERE / 'tp_workloads.py'}"
MOE_WORKLOADS = f"{HERE / 'moe_workloads.py'}"
BACKEND = "gloo"  # the measured job's, and so the estimate's
SHARDED = ("fsdp", "hsdp", "zero2")

# name: (workload, batch size per GPU, precision, strategy, plan settings)
CASES: dict[str, tuple[str, int, str, str, dict]] = {
    "example-gpt-ddp": ("example:gpt", 16, "32-true", "ddp", {}),
    "example-gpt-fsdp": ("example:gpt", 16, "32-true", "fsdp", {}),
    "gpt2-ddp": ("hf:gpt2/seq=1024", 8, "bf16-mixed", "ddp", {}),
    "gpt2-fsdp": ("hf:gpt2/seq=1024", 8, "bf16-mixed", "fsdp", {}),
    "gpt2-fsdp-bf16-params": (
        "hf:gpt2/seq=1024",
        8,
        "32-true",
        "fsdp",
        {"param_dtype": "bf16", "reduce_dtype": "fp32"},
    ),
    "gpt2-zero1": ("hf:gpt2/seq=1024", 8, "bf16-mixed", "zero1", {}),
    "gpt2-zero2": ("hf:gpt2/seq=1024", 8, "bf16-mixed", "zero2", {}),
    # tensor parallel ("none": no data parallel, every rank in the tensor-parallel group)
    "llama-tp2-own-plan": (f"{TP_WORKLOADS}:llama_blocks", 16, "32-true", "none", {"tp": 2}),
    "llama-tp2-fsdp2-own-plan": (
        f"{TP_WORKLOADS}:llama_blocks",
        16,
        "32-true",
        "fsdp",
        {"tp": 2},
    ),
    "example-llama-tp2": ("example:llama", 16, "32-true", "none", {"tp": 2}),
    "example-llama-tp2-no-sp": (
        "example:llama",
        16,
        "32-true",
        "none",
        {"tp": 2, "sequence_parallel": False},
    ),
    "example-llama-tp2-fsdp2": ("example:llama", 16, "32-true", "fsdp", {"tp": 2}),
    # pipeline parallel: 2 stages, 1F1B, 4 micro-batches of the batch size each
    "example-llama-pp2-1f1b": ("example:llama", 8, "32-true", "none", {"pp": 2, "microbatches": 4}),
    # context parallel: each of 2 ranks 128 of the 256 tokens (torch's head-tail halves)
    "example-llama-cp2": ("example:llama", 16, "32-true", "none", {"cp": 2}),
    # expert parallel: each of 2 ranks 4 of every layer's 8 experts, routing even
    "moe-ep2": (
        f"{MOE_WORKLOADS}:moe_grouped",
        8,
        "32-true",
        "none",
        {"ep": 2, "ep_imbalance": 1.0},
    ),
    # context parallel 2 under FSDP2 over dp 2 × cp 2 (torchtitan's dp_shard_cp): 4 ranks
    "example-llama-cp2-fsdp2": ("example:llama", 16, "32-true", "fsdp", {"cp": 2}),
    # expert parallel 2 carved from 4 FSDP2 ranks (torchtitan's layout): the experts sharded
    # over the 2 ranks that hold the same ones (dp_mod_ep), the rest over all 4
    "moe-ep2-fsdp2": (
        f"{MOE_WORKLOADS}:moe_grouped",
        8,
        "32-true",
        "fsdp",
        {"ep": 2, "ep_imbalance": 1.0},
    ),
}
# measured through benchmarks/staged_gloo.py (the job's collectives and point-to-point ops on
# device tensors carried over gloo through CPU copies: what gloo has no CUDA path for), and
# so estimated for nccl, device used less the estimate's NCCL buffers
STAGED = (
    "example-llama-tp2",
    "example-llama-tp2-no-sp",
    "example-llama-tp2-fsdp2",
    "example-llama-pp2-1f1b",
    "example-llama-cp2",
    "moe-ep2",
    "example-llama-cp2-fsdp2",
    "moe-ep2-fsdp2",
)
TARGET_CASES = (
    "example-gpt-ddp",
    "example-gpt-fsdp",
    "gpt2-ddp",
    "gpt2-fsdp",
    "llama-tp2-own-plan",
    "llama-tp2-fsdp2-own-plan",
)
# --cases tp: the tensor-parallel cases; --cases staged: those measured through the staging
GROUPS = {
    "tp": tuple(name for name, case in CASES.items() if case[4].get("tp", 1) > 1),
    "staged": STAGED,
}


def world_of(case: tuple) -> int:
    """The case's ranks: 2 for data parallel; tp, or tp × 2 with a data-parallel strategy;
    pp × tp; cp or ep, or cp × 2 or ep × 2 with a data-parallel strategy."""
    tp = case[4].get("tp", 1)
    for inner in ("cp", "ep"):  # alone, every rank in the one group
        if case[4].get(inner, 1) > 1:
            return case[4][inner] * (1 if case[3] == "none" else WORLD)
    if case[4].get("pp", 1) > 1:
        return case[4]["pp"] * tp  # one rank per stage
    if tp == 1:
        return WORLD
    return tp if case[3] == "none" else tp * WORLD


# ---- one rank of the measured job (run by torchrun through `vramscope run --nproc`) ----------


def rank_job(args: argparse.Namespace) -> int:
    """Build, apply the plan, run the standard step; write this rank's own peaks."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "src"))
    from vramscope.distributed.sharding import ParallelPlan, apply_plan
    from vramscope.workload import StepRunner, resolve

    dist.init_process_group(BACKEND)
    if args.staged:  # before the parallel code makes its ops
        sys.path.insert(0, str(HERE))
        import staged_gloo

        staged_gloo.install()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)  # every rank on the one GPU
    else:
        device = torch.device("cpu")  # the plumbing alone, on a machine without a GPU
    torch.manual_seed(rank)
    settings = json.loads(args.settings)
    plan = ParallelPlan(args.strategy, world, rank=rank, **settings).check()
    # a pipeline job builds the model off the GPU and moves only its stage there, as a real
    # one does (torchtitan builds on the meta device): the stage's parameters lie in the
    # allocator's segments as its own, not in those of a whole model whose rest was dropped
    build_on = torch.device("cpu") if plan.pipeline else device
    workload = resolve(args.workload).build(args.batch_size, build_on)
    workload = workload.with_overrides(precision=args.precision)
    if plan.pipeline:
        # handed over in a holder, so that no frame of this function keeps the whole model
        # alive while the stage runs (a stage holds only its own modules, as in a real job)
        holder = [workload]
        del workload
        return pipeline_rank_job(args, plan, holder, device)
    after_step = None
    if plan.cp > 1 or plan.ep > 1:
        from vramscope.distributed.sharding import device_mesh

        # the estimate's mesh: (dp, cp), or (dp_mod_ep, ep) (torchtitan's layout)
        mesh = device_mesh(plan, device.type)
        experts = None
        if plan.cp > 1:
            workload, after_step = context_parallel_workload(workload, plan.cp, device, mesh["cp"])
        else:
            from vramscope.distributed.expert_parallel import apply_expert_parallel

            # the estimate's own expert-parallel layers, exchanging over the real group
            workload, applied = apply_expert_parallel(
                workload,
                plan.ep,
                plan.ep_rank,
                plan.imbalance,
                device,
                group=mesh["ep"].get_group(),
            )
            experts = applied.local_modules()
            del applied
        if plan.strategy != "none":
            # then the strategy over the ranks that remain, as the estimate applies it:
            # FSDP2 over dp × cp (experts over dp_mod_ep first), or DDP over the world
            workload = apply_plan(workload, plan, device, mesh=mesh, experts=experts).workload
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the other ranks' experts, or the whole model: dropped
    else:
        applied = apply_plan(workload, plan, device)
        # the workload as built keeps its optimizer, over the parameters before sharding:
        # kept, a sharded job holds the whole model on the device besides its shards
        workload = applied.workload
        if (plan.sharded or plan.tensor_parallel) and device.type == "cuda":
            torch.cuda.empty_cache()  # the whole model built before sharding: released
    runner = StepRunner(workload, device)
    for _ in range(args.steps):
        runner()
        if after_step is not None:
            after_step()
    write_own_peaks(args, rank, world, device)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def write_own_peaks(args: argparse.Namespace, rank: int, world: int, device) -> None:
    """This rank's own peaks (and the ops the staging carried) for the parent; with
    VRAMSCOPE_BENCH_SEGMENTS=1 also the allocator's segments at the end (pool, size: the job
    frees none, so they are those of its highest reserved), to see where reserved differs."""
    import torch

    own: dict = {"rank": rank, "world_size": world}
    if args.staged:
        own["staged_calls"] = dict(sys.modules["staged_gloo"].COUNTS)
    if device.type == "cuda":
        torch.cuda.synchronize()
        own["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        own["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        if os.environ.get("VRAMSCOPE_BENCH_SEGMENTS") == "1":
            own["segments"] = sorted(
                (seg["segment_type"], seg["total_size"], seg["allocated_size"])
                for seg in torch.cuda.memory_snapshot()
            )
    Path(args.own_peaks, f"rank-{rank}.json").write_text(json.dumps(own))


def context_parallel_workload(workload, cp: int, device, mesh=None):
    """``workload`` as a context-parallel training script runs it with torch's own
    ``context_parallel`` on ``mesh``, the job's 1-D mesh of the ``cp`` ranks (the
    estimate's; left out, one over the world): each
    micro-batch's token ids and targets are its ``buffers``, cut in place along the sequence
    (torch's head-tail load balancing), and scaled-dot-product attention is ring attention
    while the step runs (forward, backward and optimizer step inside the context; left after
    it, by the returned ``after_step``). The batch's two tensors are views of one: each is
    cloned first, as the in-place cut needs tensors of their own (a few KiB)."""
    import contextlib
    from dataclasses import replace

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    if device.type == "cpu":  # the plumbing alone: ring attention on the CPU
        sys.path.insert(0, str(HERE))
        import cpu_attention

        cpu_attention.install()
    if mesh is None:
        mesh = init_device_mesh(device.type, (cp,), mesh_dim_names=("cp",))
    inside = contextlib.ExitStack()
    make = workload.batch

    def batch():
        idx, target = (t.clone() for t in make())
        buffers = [idx, target]
        inside.enter_context(
            context_parallel(
                mesh, buffers=buffers, buffer_seq_dims=[1, 1], no_restore_buffers=set(buffers)
            )
        )
        return idx, target

    return replace(workload, batch=batch), inside.close


def pipeline_rank_job(args: argparse.Namespace, plan, holder: list, device) -> int:
    """One stage of a pipeline job, as a training script writes it with torch's own
    ``PipelineStage`` and schedule: the model cut where the estimate cuts it (the modules
    before the blocks, the stage's blocks, the modules after them, called in that order:
    a model whose forward is that chain, as example:llama's), the rest dropped."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from vramscope.distributed.pipeline import plan_layout

    rank = plan.rank
    workload = holder.pop()
    model = workload.model
    layout = plan_layout(model, plan.pp, rank, plan.schedule, plan.microbatch_count)
    span = layout.blocks[rank]
    first, last = rank == 0, rank == plan.pp - 1
    chain = [model.get_submodule(n) for n in layout.before] if first else []
    chain += [model.get_submodule(layout.block_names[i]) for i in span]
    chain += [model.get_submodule(n) for n in layout.after] if last else []
    stage_module = torch.nn.Sequential(*chain).to(device)  # built on the CPU: only the stage
    seq, vocab = model.seq, model.embed_tokens.num_embeddings  # example:llama's
    del model, chain
    optimizer = type(workload.optimizer)(stage_module.parameters(), lr=1e-3)
    workload = None  # the whole model's optimizer
    micro, m = args.batch_size, plan.microbatch_count
    stage = PipelineStage(stage_module, rank, plan.pp, device)
    classes = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    schedule = classes[plan.schedule](stage, m, loss_fn=loss_fn)
    for _ in range(args.steps):
        if first:
            tokens = torch.randint(0, vocab, (micro * m, seq), device=device)
            schedule.step(tokens)
        elif last:
            target = torch.randint(0, vocab, (micro * m, seq), device=device)
            schedule.step(target=target, losses=[], return_outputs=False)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    write_own_peaks(args, rank, plan.world_size, device)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---- both sides, compared -------------------------------------------------------------------


def measure(name: str, case: tuple, steps: int, workdir: Path, device: str) -> dict:
    spec, batch, precision, strategy, settings = case
    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "vramscope",
        "run",
        "--nproc",
        str(world_of(case)),
        "-q",
        "--json",
        str(out / "job.json"),
        str(Path(__file__).resolve()),
        "--rank-job",
        "--workload",
        spec,
        "--batch-size",
        str(batch),
        "--precision",
        precision,
        "--strategy",
        strategy,
        "--settings",
        json.dumps(settings),
        "--steps",
        str(steps),
        "--own-peaks",
        str(out),
        "--device",
        device,
    ]
    if name in STAGED:
        cmd.append("--staged")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    # this checkout's vramscope first, and whatever else the caller's path holds after it
    # (packages installed beside the interpreter's, vramscope's own dependencies among them)
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=visible, PYTHONPATH=path)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=1800)
    (out / "stderr.txt").write_text(proc.stderr)  # the whole of it, beside the job's report
    if proc.returncode != 0:
        # no paths of this machine in the results
        error = unpathed(job_error(proc.stderr), workdir)
        return {"error": error[:ERROR_CHARS], "stderr": str(out / "stderr.txt")}
    job = json.loads((out / "job.json").read_text())
    ranks = {}
    for row in job.get("ranks", []):
        r = row["rank"]
        own = json.loads((out / f"rank-{r}.json").read_text())
        ranks[r] = {
            "allocated_bytes": row["peak"]["allocated_bytes"],
            "reserved_bytes": row["peak"]["reserved_bytes"],
            "device_used_bytes": row["peak"].get("device_used_bytes"),
            "own_max_memory_allocated": own.get("max_memory_allocated"),
            "own_max_memory_reserved": own.get("max_memory_reserved"),
        }
        for key in ("staged_calls", "segments"):  # the ops the staging carried, by name
            if key in own:
                ranks[r][key] = own[key]
    return {"ranks": ranks, "seconds": round(time.perf_counter() - started, 1)}


ERROR_CHARS = 400  # a failed job's error, as the results keep it
# a case not staged whose plan all-gathers with torch's functional collectives
GLOO_CUDA_SKIP = (
    "not measured on CUDA over gloo: its plan all-gathers with torch's functional "
    "collectives (DTensor Shard to Replicate), for which gloo has no CUDA path (the rank "
    "dies of SIGSEGV); the estimate warns of it (gloo_cuda_all_gather); add it to STAGED"
)
# a rank's exception that only says another rank went away first
_SECONDARY = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "ECONNRESET",
    "EPIPE",
)


def job_error(stderr: str) -> str:
    """What a failed job's stderr says went wrong, in a line: the failing rank's Python
    exception (its last line, and where the innermost frame raised it), not torchrun's
    summary. A rank killed by a signal (no traceback) is said so, from torchrun's root
    cause. A rank's exception that only reports its peer gone (gloo's ``Connection closed
    by peer``) gives way to the one that ended the peer."""
    chains = _tracebacks(stderr)
    ranks = [c for c in chains if "ChildFailedError" not in c[0]]
    root = _root_cause(stderr)
    if root and root.get("signal"):
        killed = f"rank {root['rank']} killed by {root['signal']}"
        fatal = [ln.strip() for ln in stderr.splitlines() if ln.startswith("Fatal Python error")]
        if fatal:
            killed += f" ({fatal[0]})"
        first = [c for c in ranks if not _secondary(c[0])]
        return f"{killed}; {_one_line(first[0])}" if first else killed
    if ranks:
        first = [c for c in ranks if not _secondary(c[0])] or ranks
        where = f"rank {root['rank']}: " if root and len(ranks) == 1 else ""
        return where + _one_line(first[0])
    lines = [
        ln.strip()
        for ln in stderr.splitlines()
        if ln.strip() and set(ln.strip()) - set("=-") and not ln.startswith(("E", "W", "I"))
    ]
    return lines[-1] if lines else "no output"


def _tracebacks(stderr: str) -> list[tuple[str, str]]:
    """Each traceback's exception line and its innermost frame (``file:line in func``), in
    the order printed; of a chain of exceptions (``During handling of the above ...``), the
    one raised last."""
    found: list[tuple[str, str]] = []
    lines = stderr.splitlines()
    i = 0
    chained = False
    while i < len(lines):
        if lines[i].startswith("Traceback (most recent call last):"):
            frame = ""
            i += 1
            while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
                text = lines[i].strip()
                if text.startswith('File "'):
                    name, _, rest = text[6:].partition('", line ')
                    number, _, func = rest.partition(", in ")
                    frame = f"{name}:{number} in {func}" if func else f"{name}:{number}"
                i += 1
            exception = lines[i].strip() if i < len(lines) else "?"
            if chained and found:
                found[-1] = (exception, frame)
            else:
                found.append((exception, frame))
            chained = False
            continue
        text = lines[i].strip()
        if text.startswith(("During handling of the above exception", "The above exception")):
            chained = True
        elif text:
            chained = False
        i += 1
    return found


def _root_cause(stderr: str) -> dict | None:
    """torchrun's ``Root Cause (first observed failure)``: the rank, and the signal that
    ended it (None for an exit code)."""
    part = stderr.partition("Root Cause (first observed failure)")[2]
    if not part:
        return None
    found: dict = {"rank": "?", "signal": None}
    for line in part.splitlines():
        key, _, value = line.strip().partition(":")
        key, value = key.strip(), value.strip()
        if key == "rank":
            found["rank"] = value.split()[0]
        elif key == "traceback" and value.startswith("Signal"):
            found["signal"] = value.split(" received")[0]
        elif key == "exitcode" and value.startswith("-") and not found["signal"]:
            found["signal"] = f"signal {value.split()[0][1:]}"
    return found


def _secondary(exception: str) -> bool:
    return any(word in exception for word in _SECONDARY)


def _one_line(chain: tuple[str, str]) -> str:
    exception, frame = chain
    return f"{exception} (at {frame})" if frame else exception


def unpathed(text: str, workdir: Path) -> str:
    """``text`` without this machine's paths: the workdir, the repository, and where
    Python's packages are installed."""
    import re

    text = text.replace(str(workdir), "WORKDIR").replace(str(ROOT), ".")
    text = re.sub(r"(?<![\w.])/[^\s\":]*?/(site|dist)-packages/", "", text)
    return re.sub(r"(?<![\w.])/[^\s\":]*/lib/python3[.\d]*/", "", text)


def estimate_ranks(case: tuple, gpu: str, backend: str = BACKEND) -> dict:
    """Each rank's estimate of the case's job, over gloo as it is measured (over nccl for a
    staged case, whose device tensors are those of a job over NCCL): the estimate traces a
    rank of each role and each rank takes its role's peaks (a rank whose role was not
    traced is estimated as itself)."""
    from vramscope.distributed.sharding import ParallelPlan
    from vramscope.estimate.estimator import estimate

    spec, batch, precision, strategy, settings = case
    world = world_of(case)
    ranks: dict[int, dict] = {}
    seconds = []
    gathers = 0
    for rank in range(world):
        if rank in ranks:
            continue
        plan = ParallelPlan(strategy, world, rank=rank, backend=backend, **settings)
        report = estimate(spec, batch, gpu=gpu, precision=precision, parallel=plan)
        job = report.extra["distributed"]
        seconds.append(report.extra["estimate"]["seconds"])
        gathers = max(gathers, (job.get("tensor_parallel") or {}).get("functional_all_gathers", 0))
        for row in job["traced_ranks"]:
            ranks[row["rank"]] = {**row["peak"], "nccl_bytes": job["communicator_bytes"]}
        for role in job.get("roles") or []:
            if role.get("peak") is None:
                continue
            for member in _members(role["ranks"]):
                ranks.setdefault(member, {**role["peak"], "nccl_bytes": job["communicator_bytes"]})
    return {"ranks": ranks, "seconds": seconds, "functional_all_gathers": gathers}


def _members(ranges: str) -> list[int]:
    """The ranks of ``0-3, 8``."""
    found = []
    for part in ranges.split(", "):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


def built_parameter_bytes(spec: str) -> int:
    """The workload's parameters as built, in the caching allocator's blocks (a tied
    parameter once): what a sharded job keeps besides its shards while the workload as
    built, and so its optimizer, is alive."""
    import torch

    from vramscope.workload import resolve

    # on the CPU, as the job builds it (a meta build need not tie what the model ties)
    model = resolve(spec).build(1, torch.device("cpu")).model
    storages = {
        p.untyped_storage()._cdata: p.untyped_storage().nbytes() for p in model.parameters()
    }
    return sum(-(-size // 512) * 512 for size in storages.values())


def error_pct(estimated: int | None, measured: int | None) -> float | None:
    if not estimated or not measured:
        return None
    return round(100.0 * (estimated - measured) / measured, 2)


_LINES: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    _LINES.append(text)


def case_names(args: argparse.Namespace) -> list[str] | None:
    names = [n.strip() for n in args.cases.split(",")] if args.cases else list(CASES)
    names = [m for n in names for m in GROUPS.get(n, (n,))]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case {unknown[0]!r}; cases: {', '.join(CASES)}", file=sys.stderr)
        return None
    return names


def header(device_name: str, steps: int, gpu: str) -> None:
    say(
        f"per-rank estimate vs a measured job: {WORLD} ranks (tensor parallel: tp, or tp × "
        f"{WORLD}) on one {device_name} over {BACKEND}, {steps} steps; estimates for --gpu "
        f"{gpu}, over {BACKEND}"
    )
    say(
        f"{'case':24s} {'rank':>4s} {'measured alloc':>15s} {'alloc err':>9s} "
        f"{'alloc err+':>10s} {'measured resv':>14s} {'resv err':>9s} {'used err':>9s}"
    )


def compare_case(
    name: str, measured: dict, estimated: dict, held: int, measure_seconds: float | None
) -> dict:
    """One case's rows, estimated against measured per rank, printed as they come.
    ``held``: bytes the measured ranks kept besides what the job holds (the parameters as
    built, in a run that kept them), taken out of measured allocated for ``alloc err+``."""
    spec, batch, precision, strategy, settings = CASES[name]
    rows = []
    for rank in range(world_of(CASES[name])):
        m = measured["ranks"].get(rank) or measured["ranks"].get(str(rank))
        e = estimated["ranks"][rank]
        used = e["device_used_bytes"]
        if name in STAGED and used is not None:
            used -= e.get("nccl_bytes") or 0  # estimated over nccl; the job has no NCCL
        errs = {
            "allocated": error_pct(e["allocated_bytes"], m["allocated_bytes"]),
            "reserved": error_pct(e["reserved_bytes"], m["reserved_bytes"]),
            "device_used": error_pct(used, m.get("device_used_bytes")),
        }
        if held:
            errs["allocated_without_held"] = error_pct(
                e["allocated_bytes"], m["allocated_bytes"] - held
            )
        row = {"rank": rank, "measured": m, "estimated": e, "error_pct": errs}
        row["met"] = (
            errs["allocated"] is not None
            and abs(errs["allocated"]) <= TARGET_ALLOCATED_PCT
            and errs["reserved"] is not None
            and abs(errs["reserved"]) <= TARGET_RESERVED_PCT
        )
        rows.append(row)
        say(
            f"{name:24s} {rank:4d} {_gib(m['allocated_bytes']):>15s} "
            f"{_pct(errs['allocated'])} {_pct(errs.get('allocated_without_held')):>10s} "
            f"{_gib(m['reserved_bytes']):>14s} {_pct(errs['reserved'])} "
            f"{_pct(errs['device_used'])}"
        )
    done = {
        "case": name,
        "workload": spec.replace(f"{ROOT}/", ""),  # no paths of this machine in the results
        "batch_size": batch,
        "precision": precision,
        "strategy": strategy,
        "settings": settings,
        "backend": BACKEND,
        "staged": name in STAGED,
        "estimate_backend": estimate_backend(name),
        "world_size": world_of(CASES[name]),
        "target_case": name in TARGET_CASES,
        "ranks": rows,
        "measure_seconds": measure_seconds,
        "estimate_seconds": estimated["seconds"],
    }
    if held:
        done["held_built_parameter_bytes"] = held
    return done


def estimate_backend(name: str) -> str:
    """The backend a case is estimated for: nccl for a staged case (its device tensors are
    those of the job over NCCL), gloo otherwise (gloo's own CUDA paths, as measured)."""
    return "nccl" if name in STAGED else BACKEND


def _pct(value: float | None) -> str:
    return f"{value:+8.2f}%" if value is not None else "     n/a"


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.3f} GiB" if value is not None else "n/a"


def footer(cases: list[dict], held: bool) -> None:
    say(
        "used err: device used; both ranks' CUDA contexts share the GPU, and a job over gloo "
        "has no NCCL buffers"
    )
    if any(c.get("staged") for c in cases):
        say(
            f"staged ({', '.join(c['case'] for c in cases if c.get('staged'))}): collectives "
            "and point-to-point ops on device tensors carried over gloo through CPU copies "
            "(benchmarks/staged_gloo.py), estimated for nccl; used err less the estimate's "
            "NCCL buffers"
        )
    if held:
        say(
            "alloc err+: against measured allocated less the parameters as built, which these "
            "measured FSDP/ZeRO-2 ranks kept alive (the workload as built held them through "
            "its optimizer; the rank job drops it now)"
        )
    say(
        f"targets (per rank, {', '.join(TARGET_CASES)}): allocated within "
        f"{TARGET_ALLOCATED_PCT:.0f} %, reserved within {TARGET_RESERVED_PCT:.0f} %: "
        + ("MET" if targets_met(cases) else "MISSED")
    )


def compare_main(args: argparse.Namespace) -> int:
    import torch

    names = case_names(args)
    if names is None:
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.allow_cpu:
        print("this benchmark measures on a CUDA GPU; none here", file=sys.stderr)
        return 2
    if args.stage_cpu:
        os.environ["VRAMSCOPE_STAGE_CPU"] = "1"  # the jobs' ranks inherit it
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vramscope-dist-accuracy-"))
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    header(device_name, args.steps, args.gpu)
    cases: list[dict] = []
    meta = run_meta(args, device)
    for name in names:
        if cases:  # what is done so far, should the run be cut short
            write(args, cases, meta, complete=False)
        case = CASES[name]
        if case[0].startswith("hf:") and not _has_transformers():
            cases.append({"case": name, "skipped": "needs transformers"})
            say(f"{name:24s} skipped (needs transformers)")
            continue
        estimated = estimate_ranks(case, args.gpu, estimate_backend(name))
        if device == "cuda" and name not in STAGED and estimated["functional_all_gathers"]:
            # the job would die of SIGSEGV (the estimate's gloo_cuda_all_gather warning)
            cases.append({"case": name, "skipped": GLOO_CUDA_SKIP})
            say(f"{name:24s} skipped: {GLOO_CUDA_SKIP}")
            continue
        measured = measure(name, case, args.steps, workdir, device)
        if "error" in measured:
            cases.append({"case": name, "error": measured["error"]})
            say(f"{name:24s} measuring FAILED: {measured['error']}")
            if args.verbose:  # the whole stderr, printed but not kept in the table
                print(f"---- {name}: the job's stderr ({measured['stderr']}) ----")
                print(Path(measured["stderr"]).read_text().rstrip(), flush=True)
                print(f"---- end of {name}'s stderr ----", flush=True)
            continue
        cases.append(compare_case(name, measured, estimated, 0, measured["seconds"]))
    footer(cases, held=False)
    write(args, cases, meta, complete=True)
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.txt').name}")
    return 0


def recompute_main(args: argparse.Namespace) -> int:
    """The estimates made again, here on the CPU, against a recorded run's measurements
    (``--measured``): the measured fields as they were, the run's meta kept, and what
    estimated them (``meta.estimated``)."""
    import torch

    names = case_names(args)
    if names is None:
        return 2
    recorded = json.loads(Path(args.measured).read_text())
    meta = recorded["meta"]
    # a run before the rank job dropped the workload as built kept its parameters
    held_any = not meta.get("built_workload_dropped", False)
    by_name = {c["case"]: c for c in recorded["cases"]}
    header(meta["device"], meta["steps"], args.gpu)
    cases: list[dict] = []
    for name in names:
        old = by_name.get(name)
        if old is None:
            continue
        if "ranks" not in old:
            cases.append(old)
            say(f"{name:24s} {old.get('error') or old.get('skipped')}")
            continue
        case = CASES[name]
        if case[0].startswith("hf:") and not _has_transformers():
            print(f"{name}: needs transformers to estimate", file=sys.stderr)
            return 2
        measured = {"ranks": {r["rank"]: r["measured"] for r in old["ranks"]}}
        held = built_parameter_bytes(case[0]) if held_any and case[3] in SHARDED else 0
        estimated = estimate_ranks(case, args.gpu, estimate_backend(name))
        cases.append(compare_case(name, measured, estimated, held, old.get("measure_seconds")))
    footer(cases, held=held_any and any(c.get("held_built_parameter_bytes") for c in cases))
    meta = {
        **meta,
        "estimate_gpu": args.gpu,
        "estimate_backend": BACKEND,
        "estimated": {
            "recomputed_from_measurements": True,
            "on": "cpu",
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    if held_any:
        meta["built_workload_dropped"] = False
    write(args, cases, meta, complete=recorded.get("complete", True))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.txt').name}")
    return 0


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def targets_met(cases: list[dict]) -> bool:
    targeted = [r for c in cases if c.get("target_case") for r in c.get("ranks", [])]
    return bool(targeted) and all(r["met"] for r in targeted)


def run_meta(args: argparse.Namespace, device: str) -> dict:
    import torch

    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "driver": _driver(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "world_size": WORLD,
        "backend": BACKEND,
        "estimate_gpu": args.gpu,
        "estimate_backend": BACKEND,
        "steps": args.steps,
        "built_workload_dropped": True,
        "staged_cases": list(STAGED),
        "staged_cpu": bool(args.stage_cpu),
    }


def write(args: argparse.Namespace, cases: list[dict], meta: dict, complete: bool) -> None:
    """The results so far as JSON, and the printed table beside it (``.txt``)."""
    result = {
        "cases": cases,
        "complete": complete,
        "targets": {
            "allocated_pct": TARGET_ALLOCATED_PCT,
            "reserved_pct": TARGET_RESERVED_PCT,
            "cases": list(TARGET_CASES),
            "met": targets_met(cases),
        },
        "meta": meta,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out).with_suffix(".txt").write_text("\n".join(_LINES) + "\n")


def _driver() -> str | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--own-peaks", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpu", default="h200", help="the GPU profile to estimate for")
    parser.add_argument("--cases", help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--workdir", help="keep the jobs' reports here (default: a temp dir)")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print a failed job's whole stderr (always kept as WORKDIR/CASE/stderr.txt)",
    )
    parser.add_argument(
        "--allow-cpu", action="store_true", help="run the jobs on the CPU (plumbing only)"
    )
    parser.add_argument(
        "--measured",
        metavar="FILE",
        help="estimate again, without a GPU, against the measurements recorded in FILE",
    )
    parser.add_argument("--staged", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--stage-cpu",
        action="store_true",
        help="with --allow-cpu: the staged cases' CPU tensors go through the staging too "
        "(VRAMSCOPE_STAGE_CPU=1), each through a clone, so its whole path runs",
    )
    parser.add_argument("--out", default=str(HERE / "results" / "distributed_accuracy_h200.json"))
    args = parser.parse_args()
    if args.rank_job:
        return rank_job(args)
    sys.path.insert(0, str(ROOT / "src"))
    if args.measured:
        return recompute_main(args)
    return compare_main(args)


if __name__ == "__main__":
    sys.exit(main())
