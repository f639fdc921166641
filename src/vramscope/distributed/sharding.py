"""Data-parallel strategies applied to a built workload, as a training script applies them:
DDP, FSDP2 (``fully_shard``), HSDP, ZeRO-1 and ZeRO-2, each with torch's own objects.

A :class:`ParallelPlan` names the strategy, the world size and the strategy's settings;
:func:`apply_plan` wraps the workload's model (``DistributedDataParallel``, or
``fully_shard`` on each transformer block and then the root) and rebuilds its optimizer
over the new parameters, so a ``build(batch_size, device)`` function written for one GPU
is used unchanged. The estimator applies a plan under torch's fake process group
(:mod:`vramscope.estimate.distributed`); a measured job applies the same plan under a real
one (``benchmarks/distributed_accuracy.py``).

What each strategy is, in torch's terms:

* ``ddp``: ``DistributedDataParallel``: every rank holds the whole model, its gradients and
  the optimizer state, plus DDP's flat gradient buckets (``bucket_cap_mb``, 25 MiB by
  default, the first one 1 MiB; none extra with ``gradient_as_bucket_view``).
* ``fsdp``: ``fully_shard`` on each repeated block, then on the root: parameters, gradients
  and optimizer state are sharded over the world; a block's parameters are all-gathered for
  its forward and backward (ZeRO-3).
* ``hsdp``: the same on a 2-D mesh: sharded within groups of ``shard_size`` ranks (a node),
  replicated across the groups.
* ``zero1``: DDP with ``ZeroRedundancyOptimizer``: the optimizer state is partitioned, each
  rank updating whole parameters of its share.
* ``zero2``: ``fully_shard(reshard_after_forward=False)`` (what FSDP calls SHARD_GRAD_OP):
  gradients and optimizer state sharded; parameters kept gathered from forward to the end
  of backward.

The collectives run over ``backend``: ``nccl`` (the default) or ``gloo``, which moves CUDA
tensors through host memory and copies each reduce-scatter input on the device
(:mod:`vramscope.estimate.distributed` says what each costs).

A plan is a device mesh: ``tp`` ranks of tensor parallel (innermost: the ranks of one
group are consecutive, as on one node), the data-parallel strategy over what remains
(``dp_size`` = world size / tp). Tensor parallel (and sequence parallel) is applied first,
with torch's ``parallelize_module`` (:mod:`vramscope.distributed.tensor_parallel`), then
FSDP2 over the data-parallel dimension of the same mesh: a 2-D job. Pipeline parallel
(``pp`` stages, the outermost dimension) cuts the model into stages
(:mod:`vramscope.distributed.pipeline`) first; tensor parallel and the data-parallel strategy
are then applied to the stage's own modules as they are to a whole model (a 3-D job: the
data-parallel dimension is world size / (tp · pp)). Context parallel (``cp``: each rank a
share of every sequence, torch's ring attention, :mod:`vramscope.distributed.context_parallel`)
and expert parallel (``ep``: each rank a share of every MoE layer's experts, tokens exchanged
all-to-all, :mod:`vramscope.distributed.expert_parallel`) run alone or under ``ddp``,
``fsdp`` or ``zero2`` over the ranks that remain, in torchtitan's layout:

* ``cp``: a 2-D mesh ``(dp, cp)`` (context parallel inner); the data-parallel strategy runs
  over the flattened ``dp × cp`` ranks, since a context-parallel group's ranks hold the same
  parameters and their gradients are reduced together: FSDP2 shards every parameter over
  all ``dp · cp`` ranks (torchtitan's ``dp_shard_cp``), DDP replicates over them;
* ``ep``: carved from the data-parallel ranks (torchtitan's ``dp_shard_in_ep``): a mesh
  ``(dp_mod_ep, ep)`` of the world; each rank keeps 1/ep of every MoE layer's experts and
  exchanges tokens over ``ep``; FSDP2 shards those experts over ``dp_mod_ep`` (world / ep
  ranks: torchtitan's ``dp_shard_mod_ep``) and every other parameter over the whole
  data-parallel world; DDP replicates every parameter the rank holds over the world.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from vramscope.contract import single_optimizer
from vramscope.distributed.optim import constructor_defaults
from vramscope.errors import VramscopeError
from vramscope.workload import Workload

STRATEGY_NAMES = ("ddp", "fsdp", "hsdp", "zero1", "zero2")
NO_DATA_PARALLEL = "none"  # every rank in the tensor-parallel group: no data parallel
DESCRIPTIONS = {
    NO_DATA_PARALLEL: "no data parallel: every rank is one of the tensor-parallel group",
    "ddp": "DistributedDataParallel: the whole model on every rank, plus gradient buckets",
    "zero1": "DDP with ZeroRedundancyOptimizer: optimizer state partitioned",
    "zero2": "fully_shard, parameters kept gathered through backward: gradients and "
    "optimizer state sharded",
    "fsdp": "fully_shard per block: parameters, gradients and optimizer state sharded",
    "hsdp": "fully_shard on a 2-D mesh: sharded within a group, replicated across",
}
SHARDED = ("fsdp", "hsdp", "zero2")  # FSDP2 underneath
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_SHARD_SIZE = 8  # HSDP: one node of 8 GPUs
DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's bucket_cap_mb
BACKENDS = ("nccl", "gloo")  # the process group's backend for CUDA tensors
MAX_WORLD_SIZE = 1 << 20
# the mesh's dimensions, outermost first: a rank's coordinates follow from its number so
# (``ParallelPlan.coordinates``); tensor parallel is innermost, within a node
MESH_DIMS = ("pp", "dp", "cp", "tp")
# expert parallel's routing, unless the user says otherwise: every rank gets its even share
DEFAULT_EP_IMBALANCE = 1.0
# strategies that run with tensor parallel on the same mesh (FSDP2 over its dp dimension)
WITH_TENSOR_PARALLEL = ("fsdp", "hsdp", "zero2", NO_DATA_PARALLEL)
# strategies that run with context or expert parallel over the ranks that remain
WITH_CONTEXT_OR_EXPERTS = ("ddp", "fsdp", "zero2", NO_DATA_PARALLEL)


@dataclass(frozen=True)
class ParallelPlan:
    """One data-parallel job, as one rank sees it."""

    strategy: str
    world_size: int
    rank: int = 0
    shard_size: int | None = None  # hsdp: ranks that shard the model
    # None: fully_shard's default for fsdp/hsdp (every group but the root), False for zero2
    reshard_after_forward: bool | None = None
    param_dtype: str | None = None  # FSDP2 MixedPrecisionPolicy: bf16, fp16, fp32
    reduce_dtype: str | None = None
    cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy
    bucket_cap_mb: float | None = None  # ddp/zero1; None: DDP's 25
    gradient_as_bucket_view: bool = False
    shard_module: str | None = None  # the class fully_shard is applied to
    backend: str = "nccl"  # the process group's backend: nccl or gloo
    tp: int = 1  # tensor-parallel ranks (the mesh's innermost dimension)
    # with tp: the activations between the blocks' attention and MLP split along the
    # sequence (SequenceParallel); None: where the model allows it (tensor_parallel)
    sequence_parallel: bool | None = None
    pp: int = 1  # pipeline stages (the mesh's outermost dimension)
    pp_schedule: str | None = None  # gpipe, 1f1b (the default), interleaved-1f1b
    microbatches: int | None = None  # per step and pipeline; None: 2 × pp
    pp_split: tuple[int, ...] | None = None  # block indices where the stages after the first begin
    cp: int = 1  # context-parallel ranks: each holds 1/cp of every sequence
    ep: int = 1  # expert-parallel ranks: each holds 1/ep of every MoE layer's experts
    # expert parallel: the tokens the most loaded rank's experts receive, as a multiple of
    # the even share (1.0: routing assumed even)
    ep_imbalance: float | None = None

    @property
    def sharded(self) -> bool:
        """Whether FSDP2 shards the parameters (fsdp, hsdp, zero2)."""
        return self.strategy in SHARDED

    @property
    def dp_size(self) -> int:
        """Ranks of the data-parallel dimension: the world over the other dimensions."""
        return max(1, self.world_size // (self.tp * self.pp * self.cp))

    @property
    def tensor_parallel(self) -> bool:
        return self.tp > 1

    @property
    def pipeline(self) -> bool:
        return self.pp > 1

    @property
    def imbalance(self) -> float:
        """The most loaded expert-parallel rank's tokens over the even share."""
        return DEFAULT_EP_IMBALANCE if self.ep_imbalance is None else float(self.ep_imbalance)

    @property
    def ep_rank(self) -> int:
        """This rank's index in its expert-parallel group (carved from the data-parallel
        dimension: consecutive data-parallel ranks share their experts)."""
        return self.coordinates()["dp"] % self.ep

    @property
    def schedule(self) -> str:
        from vramscope.distributed.pipeline import DEFAULT_SCHEDULE

        return self.pp_schedule or DEFAULT_SCHEDULE

    @property
    def microbatch_count(self) -> int:
        from vramscope.distributed.pipeline import default_microbatches

        return self.microbatches if self.microbatches is not None else default_microbatches(self.pp)

    @property
    def pp_rank(self) -> int:
        """This rank's stage: its index in the pipeline."""
        return self.coordinates()["pp"]

    @property
    def dp_rank(self) -> int:
        """This rank's index in the data-parallel dimension."""
        return self.coordinates()["dp"]

    @property
    def tp_rank(self) -> int:
        """This rank's index in its tensor-parallel group."""
        return self.coordinates()["tp"]

    def coordinates(self, rank: int | None = None) -> dict[str, int]:
        """``rank``'s (this plan's rank's) index in each dimension of the mesh
        (:data:`MESH_DIMS`, outermost first, row-major as ``init_device_mesh`` numbers)."""
        rank = self.rank if rank is None else rank
        sizes = {"pp": self.pp, "dp": self.dp_size, "cp": self.cp, "tp": self.tp}
        found: dict[str, int] = {}
        for name in reversed(MESH_DIMS):
            found[name] = rank % sizes[name]
            rank //= sizes[name]
        return {name: found[name] for name in MESH_DIMS}

    def rank_at(self, **coordinates: int) -> int:
        """The rank at these coordinates (the others 0)."""
        sizes = {"pp": self.pp, "dp": self.dp_size, "cp": self.cp, "tp": self.tp}
        rank = 0
        for name in MESH_DIMS:
            rank = rank * sizes[name] + coordinates.get(name, 0)
        return rank

    @property
    def data_ranks(self) -> int:
        """Ranks over which the data-parallel strategy runs: the data-parallel dimension,
        times the context-parallel one (its ranks hold the same parameters, their gradients
        reduced together: torchtitan's ``dp_shard_cp``)."""
        return self.dp_size * self.cp

    @property
    def shard_group_size(self) -> int:
        """Ranks that share one copy of the model state: its shards."""
        if self.strategy == "hsdp":
            return self.shard_size or DEFAULT_SHARD_SIZE
        return self.data_ranks if self.sharded else 1

    @property
    def replicate_size(self) -> int:
        return self.data_ranks // self.shard_group_size if self.sharded else self.data_ranks

    @property
    def expert_shard_size(self) -> int:
        """With expert parallel: the ranks that hold the same experts, over which FSDP2
        shards them (torchtitan's ``dp_shard_mod_ep``: world / (tp · pp · ep))."""
        return max(1, self.dp_size // self.ep)

    def shard_index(self, rank: int | None = None) -> int:
        """``rank``'s index among the ranks of the data-parallel strategy (dp × cp)."""
        coords = self.coordinates(rank)
        return coords["dp"] * self.cp + coords["cp"]

    @property
    def resharding(self) -> bool:
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.strategy != "zero2"

    @property
    def bucket_cap(self) -> float:
        return DEFAULT_BUCKET_CAP_MB if self.bucket_cap_mb is None else self.bucket_cap_mb

    def with_rank(self, rank: int) -> ParallelPlan:
        return replace(self, rank=rank)

    def with_strategy(self, strategy: str) -> ParallelPlan:
        """The same job under another strategy, keeping the settings that strategy takes."""
        sharded = strategy in SHARDED
        return replace(
            self,
            strategy=strategy,
            shard_size=self.shard_size if strategy == "hsdp" else None,
            # zero2 is fully_shard without resharding: the setting is fsdp's and hsdp's
            reshard_after_forward=(
                self.reshard_after_forward if strategy in ("fsdp", "hsdp") else None
            ),
            shard_module=self.shard_module if sharded else None,
            param_dtype=self.param_dtype if sharded else None,
            reduce_dtype=self.reduce_dtype if sharded else None,
            cpu_offload=self.cpu_offload and sharded,
            bucket_cap_mb=None if sharded else self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view and not sharded,
        )

    def check(self) -> ParallelPlan:
        """Raise a one-line VramscopeError for a plan torch would refuse or that means
        nothing; return the plan."""
        s = self.strategy
        if s not in (*STRATEGY_NAMES, NO_DATA_PARALLEL):
            raise VramscopeError(
                f"unknown --strategy {s!r}; use one of {', '.join(STRATEGY_NAMES)}"
            )
        for name in ("tp", "pp", "cp", "ep"):
            size = getattr(self, name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise VramscopeError(f"--{name} must be a whole number of 1 or more, not {size!r}")
        n = self.world_size
        if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= MAX_WORLD_SIZE:
            raise VramscopeError(
                f"--world-size must be a whole number from 2 to {MAX_WORLD_SIZE}, not {n!r} "
                "(for one GPU, estimate without --world-size)"
            )
        if not 0 <= self.rank < n:
            raise VramscopeError(f"rank {self.rank} is not in a world of {n} ranks")
        if n % self.tp:
            raise VramscopeError(
                f"--tp {self.tp} does not divide --world-size {n}: the world is tensor-parallel "
                "groups of --tp ranks times the data-parallel ranks"
            )
        if self.pipeline or self.pp_schedule or self.microbatches or self.pp_split:
            self._check_pipeline()
        if self.cp > 1 or self.ep > 1 or self.ep_imbalance is not None:
            self._check_context_and_experts()
            if s == NO_DATA_PARALLEL:
                return self
        dp = self.dp_size
        if s == NO_DATA_PARALLEL:
            if dp > 1:
                given = self._model_parallel_flags()
                choices = (
                    "fsdp, hsdp or zero2" if self.tensor_parallel else ", ".join(STRATEGY_NAMES)
                )
                raise VramscopeError(
                    f"--world-size {n} with {given} leaves {dp} data-parallel ranks: "
                    f"give --strategy ({choices})"
                )
        elif (self.tensor_parallel or self.pipeline) and dp == 1:
            raise VramscopeError(
                f"{self._model_parallel_flags()} takes all {n} ranks: no data-parallel ranks "
                f"are left for --strategy {s} (leave --strategy out)"
            )
        if s != NO_DATA_PARALLEL and self.tensor_parallel and s not in WITH_TENSOR_PARALLEL:
            raise VramscopeError(
                f"--strategy {s} with --tp is not yet supported (DDP over tensor-parallel "
                "DTensor parameters); use --strategy fsdp, hsdp or zero2 with --tp"
            )
        if self.sequence_parallel is not None and not self.tensor_parallel:
            flag = "--sequence-parallel" if self.sequence_parallel else "--no-sequence-parallel"
            raise VramscopeError(f"{flag} applies with --tp (tensor parallel)")
        if s == "hsdp":
            n = dp
            size = self.shard_group_size
            what = "world size" if not self.tensor_parallel else "data-parallel size"
            if self.shard_size is None and (n <= size or n % size):
                raise VramscopeError(
                    f"--strategy hsdp shards within groups of --shard-size ranks and "
                    f"replicates across them; the default, {DEFAULT_SHARD_SIZE} (one node), "
                    f"does not split a {what} of {n}: give --shard-size"
                )
            if not 2 <= size < n or n % size:
                raise VramscopeError(
                    f"--shard-size {size} must divide the {what} {n} and be from 2 to "
                    f"{n // 2} (a shard group of {n} ranks is --strategy fsdp)"
                )
        elif self.shard_size is not None:
            raise VramscopeError("--shard-size applies to --strategy hsdp only")
        fsdp_only = {
            "--reshard-after-forward": self.reshard_after_forward is not None,
            "--param-dtype": self.param_dtype is not None,
            "--reduce-dtype": self.reduce_dtype is not None,
            "--cpu-offload": self.cpu_offload,
            "--shard-module": self.shard_module is not None,
        }
        ddp_only = {
            "--bucket-cap-mb": self.bucket_cap_mb is not None,
            "--gradient-as-bucket-view": self.gradient_as_bucket_view,
        }
        if not self.sharded:
            for flag, given in fsdp_only.items():
                if given:
                    raise VramscopeError(
                        f"{flag} applies to FSDP2 (--strategy fsdp, hsdp or zero2), not to {s}"
                    )
        else:
            for flag, given in ddp_only.items():
                if given:
                    raise VramscopeError(f"{flag} applies to DDP (--strategy ddp or zero1)")
        if s == "zero2" and self.reshard_after_forward:
            raise VramscopeError(
                "zero2 keeps parameters gathered after forward; --reshard-after-forward "
                "makes it --strategy fsdp"
            )
        for flag, name in (
            ("--param-dtype", self.param_dtype),
            ("--reduce-dtype", self.reduce_dtype),
        ):
            if name is not None and name not in DTYPES:
                raise VramscopeError(f"{flag} must be one of {', '.join(DTYPES)}, not {name!r}")
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise VramscopeError(f"--bucket-cap-mb must be more than 0, not {self.bucket_cap_mb}")
        if self.backend not in BACKENDS:
            raise VramscopeError(
                f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}"
            )
        return self

    def _model_parallel_flags(self) -> str:
        """``--pp 4 × --tp 8``: the model-parallel dimensions given."""
        sizes = (("pp", self.pp), ("tp", self.tp))
        return " × ".join(f"--{name} {size}" for name, size in sizes if size > 1)

    def _check_pipeline(self) -> None:
        from vramscope.distributed.pipeline import check_schedule

        flags = {
            "--pp-schedule": self.pp_schedule,
            "--microbatches": self.microbatches,
            "--pp-split": self.pp_split,
        }
        if not self.pipeline:
            given = next(flag for flag, value in flags.items() if value is not None)
            raise VramscopeError(f"{given} applies with --pp (pipeline stages)")
        n = self.world_size
        if n % (self.pp * self.tp):
            raise VramscopeError(
                f"--pp {self.pp} does not divide --world-size {n}"
                + (f" with --tp {self.tp}" if self.tensor_parallel else "")
                + ": the world is the pipeline's stages times the ranks of each stage"
            )
        check_schedule(self.schedule, self.pp, self.microbatch_count)
        if self.strategy in ("ddp", "zero1") and self.schedule == "interleaved-1f1b":
            raise VramscopeError(
                f"--strategy {self.strategy} with --pp-schedule interleaved-1f1b is not yet "
                "supported by the estimator (one DDP reducer per virtual stage); use fsdp, "
                "zero2 or hsdp, or --pp-schedule 1f1b"
            )

    def _check_context_and_experts(self) -> None:
        """Context and expert parallel run alone (every rank of the world in the one group)
        or under ddp, fsdp or zero2 over the ranks that remain (the module's docstring says
        which layout); not yet with each other, tensor or pipeline parallel, hsdp or zero1."""
        n, cp, ep = self.world_size, self.cp, self.ep
        if self.ep_imbalance is not None:
            if ep == 1:
                raise VramscopeError("--ep-imbalance applies with --ep (expert parallel)")
            f = self.ep_imbalance
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 1.0 <= f <= ep:
                raise VramscopeError(
                    f"--ep-imbalance must be from 1 (routing even) to {ep} (every token to "
                    f"one rank's experts), not {f!r}"
                )
        if cp > 1 and ep > 1:
            raise VramscopeError(
                "--cp with --ep is not yet supported by the estimator; estimate each alone"
            )
        flag, size, kind = ("--cp", cp, "context") if cp > 1 else ("--ep", ep, "expert")
        for other, given in (("--tp", self.tensor_parallel), ("--pp", self.pipeline)):
            if given:
                raise VramscopeError(
                    f"{flag} with {other} is not yet supported by the estimator ({kind} "
                    f"parallel runs alone or with --strategy ddp, fsdp or zero2); estimate "
                    f"{flag} without {other}, or {other} alone"
                )
        if self.strategy == NO_DATA_PARALLEL:
            if n != size:
                raise VramscopeError(
                    f"--world-size {n} with {flag} {size}: the ranks beyond the {kind}-parallel "
                    f"group are data parallel: give --strategy (ddp, fsdp or zero2), or "
                    f"--world-size {size}"
                )
            return
        if self.strategy not in WITH_CONTEXT_OR_EXPERTS:
            raise VramscopeError(
                f"{flag} with --strategy {self.strategy} is not yet supported by the estimator; "
                f"use --strategy ddp, fsdp or zero2 with {flag}"
            )
        if n % size:
            raise VramscopeError(
                f"{flag} {size} does not divide --world-size {n}: the world is the "
                f"data-parallel ranks times the {kind}-parallel group"
            )

    def describe(self) -> str:
        """``fsdp over 64 ranks`` with its non-default settings, in a few words; with tensor
        parallel ``fsdp over 8 × tensor parallel 8 (64 ranks)``."""
        if self.cp > 1:
            words = [f"context parallel over {self.cp} ranks (each 1/{self.cp} of the sequence)"]
            if self.strategy != NO_DATA_PARALLEL:
                words[0] = (
                    f"{self.strategy} over {self.data_ranks} (dp {self.dp_size} × cp {self.cp}) "
                    f"× {words[0]} ({self.world_size} ranks)"
                )
        elif self.ep > 1:
            words = [f"expert parallel over {self.ep} ranks"]
            if self.strategy != NO_DATA_PARALLEL:
                experts = f", experts over {self.expert_shard_size}" if self.sharded else ""
                words[0] = (
                    f"{self.strategy} over {self.dp_size}{experts} × {words[0]} "
                    f"({self.world_size} ranks)"
                )
            words.append(
                "routing assumed even"
                if self.imbalance == 1.0
                else f"the most loaded rank's experts get {self.imbalance:g}× the even "
                "share of tokens"
            )
        elif self.pipeline:
            words = [
                f"pipeline of {self.pp} stages ({self.schedule}, {self.microbatch_count} "
                f"micro-batches per step)"
            ]
            if self.pp_split:
                words.append(f"split at blocks {', '.join(map(str, self.pp_split))}")
            inner = []
            if self.strategy != NO_DATA_PARALLEL:
                inner.append(f"{self.strategy} over {self.dp_size}")
            if self.tensor_parallel:
                inner.append(f"tensor parallel {self.tp}")
            if inner:
                words[0] += f" × {' × '.join(inner)} ({self.world_size} ranks)"
        elif not self.tensor_parallel:
            words = [f"{self.strategy} over {self.world_size} ranks"]
        elif self.strategy == NO_DATA_PARALLEL:
            words = [f"tensor parallel over {self.world_size} ranks"]
        else:
            words = [
                f"{self.strategy} over {self.dp_size} × tensor parallel {self.tp} "
                f"({self.world_size} ranks)"
            ]
        if self.tensor_parallel and self.sequence_parallel is not None:
            words.append(f"sequence parallel {'on' if self.sequence_parallel else 'off'}")
        if self.strategy == "hsdp":
            words.append(f"shard groups of {self.shard_group_size}, {self.replicate_size} replicas")
        if self.sharded:
            if self.reshard_after_forward is not None and self.strategy != "zero2":
                words.append(f"reshard after forward {'on' if self.resharding else 'off'}")
            if self.param_dtype or self.reduce_dtype:
                words.append(
                    f"parameters in {self.param_dtype or 'their dtype'}, gradients reduced in "
                    f"{self.reduce_dtype or self.param_dtype or 'their dtype'}"
                )
            if self.cpu_offload:
                words.append("CPU offload")
        else:
            if self.bucket_cap_mb is not None:
                words.append(f"buckets of {self.bucket_cap_mb:g} MiB")
            if self.gradient_as_bucket_view:
                words.append("gradients as bucket views")
        if self.backend != "nccl":
            words.append(f"over {self.backend}")
        return ", ".join(words)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            dp_size=self.dp_size,
            shard_group_size=self.shard_group_size,
            replicate_size=self.replicate_size,
            reshard_after_forward=self.resharding if self.sharded else None,
            bucket_cap_mb=None if self.sharded else self.bucket_cap,
            pp_schedule=self.schedule if self.pipeline else None,
            microbatches=self.microbatch_count if self.pipeline else None,
            pp_split=list(self.pp_split) if self.pp_split else None,
        )
        return data


# ---- which modules are sharded ------------------------------------------------------------------


def shard_units(model: torch.nn.Module, shard_module: str | None = None) -> list[torch.nn.Module]:
    """The modules ``fully_shard`` is applied to before the root: every module of the class
    named ``shard_module``, else the model's repeated blocks (the largest run of alike,
    parameter-holding children of a ModuleList or Sequential: the transformer blocks);
    innermost first. Empty: the root is the only group."""
    from vramscope.fit.strategies import repeated_blocks

    if shard_module is None:
        return repeated_blocks(model)
    found = [
        (name.count("."), m)
        for name, m in model.named_modules()
        if name and shard_module in (type(m).__name__, f"{type(m).__module__}.{type(m).__name__}")
    ]
    if not found:
        classes = sorted({type(m).__name__ for _, m in model.named_modules()})
        raise VramscopeError(
            f"--shard-module {shard_module}: the model has no module of that class; its "
            f"classes: {', '.join(classes[:12])}{', …' if len(classes) > 12 else ''}"
        )
    return [m for _, m in sorted(found, key=lambda item: -item[0])]


# ---- applying a plan ---------------------------------------------------------------------------


@dataclass
class Applied:
    """What applying a plan made: the workload and what the report says about it."""

    workload: Workload
    units: list[str]  # modules sharded before the root (FSDP), by name
    unit_class: str | None
    groups: int  # FSDP groups (0 for DDP)
    ddp: torch.nn.Module | None = None
    zero: Any = None  # the ZeroRedundancyOptimizer, for zero1
    tensor_parallel: Any = None  # the TensorParallelLayout applied, with tp
    mesh: Any = None  # the DeviceMesh (None for DDP and ZeRO-1)


def device_mesh(plan: ParallelPlan, device_type: str) -> Any:
    """The job's DeviceMesh, ``init_device_mesh`` over the plan's dimensions: pipeline
    (``pp``, outermost), data parallel (``dp``, HSDP's ``replicate`` and ``shard``, or with
    expert parallel ``dp_mod_ep`` and ``ep``), context parallel (``cp``) and tensor parallel
    (``tp``, innermost)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape: list[int] = []
    names: list[str] = []
    if plan.pipeline:
        shape.append(plan.pp)
        names.append("pp")
    if plan.strategy == "hsdp":
        shape += [plan.replicate_size, plan.shard_group_size]
        names += ["replicate", "shard"]
    elif plan.ep > 1:  # carved from the data-parallel ranks, innermost (dp_shard_in_ep)
        shape += [plan.expert_shard_size, plan.ep]
        names += ["dp_mod_ep", "ep"]
    elif plan.dp_size > 1:
        shape.append(plan.dp_size)
        names.append("dp")
    if plan.cp > 1:
        shape.append(plan.cp)
        names.append("cp")
    if plan.tensor_parallel:
        shape.append(plan.tp)
        names.append("tp")
    return init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))


def data_parallel_mesh(plan: ParallelPlan, mesh: Any) -> Any:
    """The mesh FSDP2 shards over: HSDP's ``(replicate, shard)``; with context parallel
    ``dp × cp`` flattened (``cp`` alone when it is the world); with expert parallel
    ``dp_mod_ep × ep`` flattened (every data-parallel rank); else ``dp``."""
    if plan.strategy == "hsdp":
        return mesh["replicate", "shard"]
    if plan.cp > 1:
        return mesh["dp", "cp"]._flatten("dp_cp") if plan.dp_size > 1 else mesh["cp"]
    if plan.ep > 1:
        return mesh["dp_mod_ep", "ep"]._flatten("dp")
    return mesh["dp"]


def apply_plan(
    workload: Workload,
    plan: ParallelPlan,
    device: torch.device,
    *,
    pin_memory: bool = True,
    ddp_kwargs: dict[str, Any] | None = None,
    tensor_parallel: Any = None,
    blocks: list[torch.nn.Module] | None = None,
    mesh: Any = None,
    experts: list[torch.nn.Module] | None = None,
) -> Applied:
    """Apply ``plan`` to a built ``workload`` on ``device`` (a process group must exist):
    tensor parallel first (``parallelize_module`` on the mesh's ``tp`` dimension), then the
    data-parallel strategy. Use the returned workload only: for FSDP2 and tensor parallel
    the optimizer is rebuilt over the new parameters, and ``workload``'s own optimizer still
    holds the whole parameters as built (on the device until it is dropped).

    For a pipeline stage (a model cut by :func:`vramscope.distributed.pipeline.apply_pipeline`)
    ``tensor_parallel`` is the layout worked out on the whole model, kept to the stage's
    modules, and ``blocks`` the stage's own blocks, each sharded by FSDP as its own group.

    With context or expert parallel ``mesh`` is the job's mesh (:func:`device_mesh`,
    already made for the ring attention's or the exchanges' group) and ``experts`` the
    rank's expert modules, which FSDP2 shards over ``dp_mod_ep`` before the rest."""
    if not plan.sharded and not plan.tensor_parallel:
        return _apply_ddp(workload, plan, device, ddp_kwargs or {})
    model = workload.model
    names = {id(p): n for n, p in model.named_parameters()}
    if mesh is None:
        mesh = device_mesh(plan, device.type)
    layout = None
    if plan.tensor_parallel:
        from vramscope.distributed.tensor_parallel import apply_tensor_parallel

        layout = apply_tensor_parallel(
            model,
            mesh["tp"],
            workload.tensor_parallel_plan,
            plan.sequence_parallel,
            layout=tensor_parallel,
        )
    units: list[str] = []
    unit_class = None
    groups = 0
    if plan.sharded:
        units, unit_class = _apply_fsdp(model, plan, mesh, pin_memory, blocks, experts)
        groups = len(units) + 1
    optimizer = single_optimizer(workload, "FSDP")
    if optimizer is not None:
        optimizer = type(optimizer)(
            _param_groups(optimizer, (names, dict(model.named_parameters()))),
            **constructor_defaults(optimizer),
        )
    done = replace(workload, model=model, optimizer=optimizer)
    return Applied(done, units, unit_class, groups, tensor_parallel=layout, mesh=mesh)


def _apply_ddp(
    workload: Workload, plan: ParallelPlan, device: torch.device, kwargs: dict[str, Any]
) -> Applied:
    from torch.nn.parallel import DistributedDataParallel

    if plan.bucket_cap_mb is not None:
        # an explicit cap applies to every bucket; left out, DDP's first bucket is 1 MiB
        kwargs = {**kwargs, "bucket_cap_mb": plan.bucket_cap_mb}
    group = None
    if plan.pipeline:  # the stage's data-parallel ranks, not the world
        group = device_mesh(plan, device.type)["dp"].get_group()
        kwargs = {**kwargs, "process_group": group}
    model = DistributedDataParallel(
        workload.model,
        device_ids=[device.index or 0] if device.type == "cuda" else None,
        gradient_as_bucket_view=plan.gradient_as_bucket_view,
        **kwargs,
    )
    optimizer = single_optimizer(workload, "DDP")
    zero = None
    if plan.strategy == "zero1" and optimizer is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        zero = ZeroRedundancyOptimizer(
            _param_groups(optimizer, None),
            optimizer_class=type(optimizer),
            process_group=group,
            **constructor_defaults(optimizer),
        )
        optimizer = zero
    done = replace(workload, model=model, optimizer=optimizer)
    return Applied(done, [], None, 0, ddp=model, zero=zero)


def _apply_fsdp(
    model: torch.nn.Module,
    plan: ParallelPlan,
    mesh: Any,
    pin_memory: bool,
    blocks: list[torch.nn.Module] | None = None,
    experts: list[torch.nn.Module] | None = None,
) -> tuple[list[str], str | None]:
    """``fully_shard`` on each unit, then on the root, over the mesh's data-parallel
    dimension(s); the units' names and class."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    options: dict[str, Any] = {"mesh": data_parallel_mesh(plan, mesh)}
    if plan.reshard_after_forward is not None or plan.strategy == "zero2":
        # left out, fully_shard reshards every group but the root (gathered again at once
        # for backward)
        options["reshard_after_forward"] = plan.resharding
    if plan.param_dtype or plan.reduce_dtype:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=DTYPES.get(plan.param_dtype or ""),
            reduce_dtype=DTYPES.get(plan.reduce_dtype or ""),
        )
    if plan.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=pin_memory)
    if blocks is not None and plan.shard_module is None:
        units = list(blocks)
    else:
        units = shard_units(model, plan.shard_module)
    unit_class = type(units[0]).__name__ if units else None  # fully_shard renames the class
    module_names = {id(m): n for n, m in model.named_modules()}
    # expert parallel: the rank's experts first, each its own group over the ranks that hold
    # the same experts (dp_mod_ep), as torchtitan shards them; the rest over the whole dp
    for expert in experts or []:
        fully_shard(expert, **{**options, "mesh": mesh["dp_mod_ep"]})
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return [module_names[id(u)] for u in units], unit_class


def _param_groups(
    optimizer: torch.optim.Optimizer,
    renamed: tuple[dict[int, str], dict[str, torch.nn.Parameter]] | None,
) -> list[dict[str, Any]]:
    """The optimizer's parameter groups, hyperparameters kept; with ``renamed`` (each old
    parameter's name, each name's new parameter), over the new parameters."""
    groups = []
    for group in optimizer.param_groups:
        params = list(group["params"])
        if renamed is not None:
            names, new = renamed
            missing = [p for p in params if names.get(id(p)) not in new]
            if missing:
                raise VramscopeError(
                    "the optimizer holds a parameter that is not the model's; sharding "
                    "rebuilds the optimizer over the model's parameters"
                )
            params = [new[names[id(p)]] for p in params]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    return groups
