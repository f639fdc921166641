"""Per-rank estimates of a data-parallel job (DDP, FSDP2, HSDP, ZeRO) without its GPUs.

One rank is traced, not N: torch's fake process group (``FakeProcessGroup``: collectives
that move nothing) stands in for the job, so the world can be 8 or 1024 ranks on a laptop.
The strategy is applied to the built workload with torch's own objects
(:mod:`vramscope.distributed.sharding`): ``fully_shard`` inside the build (the model is
materialized as shards, as a job that initializes on the meta device, or calls
``torch.cuda.empty_cache()`` after sharding, holds it), ``DistributedDataParallel`` while the
trace records (its set-up broadcast and buckets are on the device like the model). What
torch's code does on a rank is then traced as on one GPU: FSDP's all-gather outputs and
reduce-scatter inputs, the groups it prefetches and when it frees them, on the streams it
uses; DDP's buckets, rebuilt after the first step.

Ranks differ only where the model does not split evenly: FSDP pads every shard alike but
the optimizer state follows the unpadded shard, which is largest on rank 0;
``ZeroRedundancyOptimizer`` gives whole parameters to ranks, greedily. The heaviest rank is
found from the objects and traced when it is not rank 0.

NCCL's own buffers are outside the caching allocator: device used adds a constant per
communicator (:data:`NCCL_BYTES`), not calibrated.

Over gloo (``ParallelPlan(backend="gloo")``) there is no NCCL communicator; gloo moves CUDA
tensors through pinned host copies, and two of its collectives allocate on the device
through the caching allocator (torch's ``ProcessGroupGloo.cpp``), both traced:

* a reduce-scatter (``_reduce_scatter_base``, which FSDP's ``reduce_scatter_tensor`` calls)
  is ``reduce_scatter_tensor_coalesced``: it clones the input on the device, all-reduces the
  clone and copies this rank's chunk of it to the output when the work is waited on. FSDP
  waits at once: one copy of each group's reduce-scatter input, on the reduce-scatter
  stream, from the collective to its end;
* an all-gather (``_allgather_base``) enqueues its work with the flight recorder's record of
  ``work->getOutputTensors()``, which for an all-gather is ``newLikeFlat(outputs)``: a new,
  empty tensor the size of the whole output, on the device, dropped at once.

All-reduce (DDP's buckets, HSDP's replicate group) and broadcast go through pinned host
copies and write back in place: nothing on the device.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vramscope.distributed.sharding import NO_DATA_PARALLEL, Applied, ParallelPlan, apply_plan
from vramscope.errors import VramscopeError
from vramscope.estimate.cuda_device import CUDA
from vramscope.estimate.recorder import Recorder, Trace, TraceError
from vramscope.report.model import Finding, Report
from vramscope.units import format_bytes
from vramscope.workload import Builder, Workload, WorkloadSpec

MiB = 2**20
# NCCL's device memory per communicator, outside the caching allocator (its buffers per
# channel and peer). Measured by a user on 4 A100s with NVLink, one 4 MB all-reduce per
# group (NVIDIA/nccl issue 964): 544 MB for a group of 2 ranks, 688 MB for more. It depends
# on the GPUs, the links, the NCCL version and its settings (NCCL_BUFFSIZE, channels).
NCCL_BYTES = {2: 544 * MiB, 3: 688 * MiB}
NCCL_SOURCE = (
    "NCCL's buffers are outside the caching allocator: a constant per communicator (544 MiB "
    "for 2 ranks, 688 MiB for more, as measured on 4 A100s with NVLink in NVIDIA/nccl issue "
    "964), not calibrated"
)


def nccl_bytes(ranks: int) -> int:
    """NCCL's device memory for one communicator of ``ranks`` ranks (none for 1)."""
    if ranks < 2:
        return 0
    return NCCL_BYTES[2] if ranks == 2 else NCCL_BYTES[3]


GLOO_SOURCE = (
    "over gloo: no NCCL buffers; gloo moves CUDA tensors through pinned host memory, copies "
    "each reduce-scatter input on the device (alive for the collective) and makes an empty "
    "tensor the size of each all-gather's output (dropped at once), both traced"
)
# torch's functional all-gather (``_c10d_functional.all_gather_into_tensor``, what DTensor
# calls to make a Shard placement Replicate) is the group's
# ``allgather_into_tensor_coalesced``; ProcessGroupGloo runs that as ``allgather_coalesced``,
# which has no CUDA path (no copy through host memory, as its ``allgather`` and
# ``_allgather_base`` have): gloo's transport is handed device pointers. Seen with torch
# 2.11 on an H200: the rank dies of SIGSEGV. Reduce-scatters (an all-reduce of a clone) and
# all-reduces run.
GLOO_CUDA_ALL_GATHER = (
    "over gloo this job cannot run on CUDA tensors: the tensor-parallel plan all-gathers "
    "with torch's functional collectives (DTensor's Shard to Replicate: a gathered output "
    "such as the head's logits, sequence parallel's gathered inputs), which gloo runs as its "
    "coalesced all-gather, with no CUDA path (torch 2.11: the rank dies of SIGSEGV); its "
    "memory is estimated as gloo would hold it. Over nccl it runs; over gloo, a plan of "
    "ColwiseParallel/RowwiseParallel layers whose outputs are plain tensors all-reduces only"
)


def communicators(plan: ParallelPlan) -> list[dict[str, Any]]:
    """The communicators a rank of ``plan`` creates: one over the world; HSDP's shard group
    and replicate group instead; with tensor parallel, its group and the data-parallel
    group(s) of the mesh. NCCL's hold device memory outside the caching allocator (a
    constant each); gloo's none."""
    groups = []
    if plan.pipeline:
        # the stages' sends and receives (batch_isend_irecv) over the pipeline's group
        groups.append(("pipeline", plan.pp))
    if plan.cp > 1 or plan.ep > 1:
        groups.append(
            ("context parallel", plan.cp) if plan.cp > 1 else ("expert parallel", plan.ep)
        )
        if plan.strategy != NO_DATA_PARALLEL:
            # the strategy's group: dp × cp flattened, or the data-parallel world
            groups.append(("data parallel", plan.data_ranks))
            if plan.ep > 1 and plan.sharded:  # the experts' FSDP group (dp_mod_ep)
                groups.append(("experts' data parallel", plan.expert_shard_size))
    elif plan.strategy == "hsdp":
        groups += [("shard", plan.shard_group_size), ("replicate", plan.replicate_size)]
    elif plan.tensor_parallel or plan.pipeline:
        groups.append(("data parallel", plan.dp_size))
    else:
        groups.append(("world", plan.world_size))
    if plan.tensor_parallel:
        groups.append(("tensor parallel", plan.tp))
    nccl = plan.backend == "nccl"
    return [
        {
            "group": name,
            "ranks": size,
            "backend": plan.backend,
            "bytes": nccl_bytes(size) if nccl else 0,
            "calibrated": not nccl,
        }
        for name, size in groups
        if size > 1
    ]


# ---- the fake process group ---------------------------------------------------------------------


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int) -> Iterator[None]:
    """torch's fake process group as the default group of ``world_size`` ranks, this process
    being ``rank``; destroyed afterwards."""
    import torch.distributed as dist

    if not dist.is_available():
        raise VramscopeError(
            "this build of torch has no torch.distributed: per-rank estimates need it"
        )
    if dist.is_initialized():
        raise VramscopeError(
            "this process already has a process group; a per-rank estimate sets up its own "
            "(fake) one: estimate in a process without one"
        )
    try:  # registers the "fake" backend
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as exc:
        raise VramscopeError(
            f"torch {torch.__version__} has no fake process group ({exc}); per-rank estimates "
            "need torch 2.11 or newer"
        ) from None
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---- DDP under fake tensors --------------------------------------------------------------------


def _in_place_hook(state: Any, bucket: Any) -> torch.futures.Future:
    """DDP's all-reduce, as it touches memory: in place on the bucket (the fake group's own
    work has no value for the reducer to read)."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


class _QuietLogger:
    """DDP's logger without its runtime statistics, which need a CUDA timer this process
    does not have; everything else goes to DDP's own logger."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def set_runtime_stats_and_log(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class _HostTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Host tensors made for real: the reducer writes the rebuilt bucket order into a CPU
    tensor through its pointer (to broadcast it from rank 0)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.empty.memory_format:
            device = kwargs.get("device")
            if device is None or torch.device(device).type == "cpu":
                from torch.utils._mode_utils import no_dispatch

                with no_dispatch():
                    return func(*args, **kwargs)
        return func(*args, **kwargs)


class _Reducer:
    """DDP's reducer, its bucket rebuild run with real host tensors, and no count of the
    forwards: the count starts DDP's runtime statistics, timed with CUDA events for CUDA
    parameters (a CUDA build of torch on a machine without a GPU driver fails there; with no
    count none are taken, the buckets as before)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def prepare_for_forward(self) -> None:
        return None

    def _rebuild_buckets(self) -> bool:
        with _HostTensors():
            return self._reducer._rebuild_buckets()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


@contextlib.contextmanager
def _replaced(owner: Any, **values: Any) -> Iterator[None]:
    """``owner``'s attributes set to ``values`` inside, put back afterwards."""
    originals = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def _no_shape_check() -> Iterator[None]:
    """DDP checks that every rank's parameters have the same shapes by reading them; under a
    fake group every rank is this one."""
    import torch.nn.parallel.distributed as ddp_module

    with _replaced(ddp_module, _verify_param_shape_across_processes=lambda *a, **k: None):
        yield


# ---- FSDP's buffers, tagged -------------------------------------------------------------------


@contextlib.contextmanager
def _fsdp_tags(tracer: RankTracer) -> Iterator[None]:
    """Tag the blocks FSDP2 makes to communicate while the trace runs: each group's
    all-gather output (``foreach_all_gather``), its unsharded parameters (the copy-out's
    targets) and its reduce-scatter input (``foreach_reduce``)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    gather, copy_out, reduce = (
        module.foreach_all_gather,
        module.foreach_all_gather_copy_out,
        module.foreach_reduce,
    )

    def foreach_all_gather(fsdp_params: Any, *args: Any, **kwargs: Any) -> Any:
        result = gather(fsdp_params, *args, **kwargs)
        if result is not None:
            tracer.tag(result.all_gather_output, "all_gather", fsdp_params)
        return result

    def foreach_all_gather_copy_out(
        result: Any, fsdp_params: Any, *args: Any, **kwargs: Any
    ) -> Any:
        out = copy_out(result, fsdp_params, *args, **kwargs)
        for fsdp_param in fsdp_params:
            for tensor in fsdp_param.all_gather_outputs:
                tracer.tag(tensor, "unsharded", fsdp_params)
        return out

    def foreach_reduce(fsdp_params: Any, *args: Any, **kwargs: Any) -> Any:
        tracer.reducing = fsdp_params
        try:
            result = reduce(fsdp_params, *args, **kwargs)
        finally:
            tracer.reducing = None
        tracer.tag(result[0], "reduce_scatter", fsdp_params)
        return result

    with _replaced(
        module,
        foreach_all_gather=foreach_all_gather,
        foreach_all_gather_copy_out=foreach_all_gather_copy_out,
        foreach_reduce=foreach_reduce,
    ):
        yield


# ---- gloo's buffers on the device ----------------------------------------------------------------

_REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base")
_ALL_GATHERS = ("all_gather_into_tensor", "all_gather_single", "_all_gather_base")


@contextlib.contextmanager
def _gloo_buffers(tracer: RankTracer) -> Iterator[None]:
    """What ProcessGroupGloo allocates on the device for CUDA tensors, recorded where the
    fake group moves nothing (see the module's docstring): a copy of each reduce-scatter's
    input from the collective to its end, and an empty tensor the size of each all-gather's
    output, dropped at once. The names torch.distributed has are wrapped (one collective
    may call another: it is counted once)."""
    import torch.distributed as dist

    inside = [0]

    def recorder() -> Recorder | None:
        found = tracer.recorder
        return found if found is not None and not inside[0] else None

    def on_device(tensor: Any) -> bool:
        return isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda"

    def nbytes(tensor: torch.Tensor) -> int:
        return tensor.numel() * tensor.element_size()

    def argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
        """A collective's output (0) or input (1), given by position or by name."""
        if len(args) > index:
            return args[index]
        return kwargs.get(name, kwargs.get(f"{name}_tensor"))

    def reduce_scatter(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            found = recorder()
            copy = None
            input = argument(args, kwargs, 1, "input")
            if found is not None and on_device(input):
                copy = found.persistent(nbytes(input), "temporary", "gloo reduce_scatter copy")
                if copy is not None:
                    group = tracer.group_of(tracer.reducing)
                    tracer.tags[copy] = ("gloo_reduce_scatter_copy", group)
            inside[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] -= 1
                if found is not None and copy is not None:
                    found.release(copy)

        return call

    def all_gather(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            found = recorder()
            output = argument(args, kwargs, 0, "output")
            if found is not None and on_device(output):
                found.transient(nbytes(output), "temporary", "gloo all_gather output record")
            inside[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] -= 1

        return call

    wrapped = {
        name: wrap(getattr(dist, name))
        for names, wrap in ((_REDUCE_SCATTERS, reduce_scatter), (_ALL_GATHERS, all_gather))
        for name in names
        if hasattr(dist, name)
    }
    # DTensor's redistributions (tensor parallel) call the functional collectives, which
    # allocate their output and call the group: gloo's reduce-scatter copies the input
    # (reduce_scatter_tensor_coalesced), its coalesced all-gather gathers into a flat
    # tensor of the output's size, each alive until the output is waited on
    pending: dict[int, int] = {}  # the output's storage -> gloo's block

    def functional(mode: Any, name: str, tensor: Any, out: Any) -> None:
        found = recorder()
        if found is None or not on_device(out) or not on_device(tensor):
            return
        found.see(out, name)  # the output first, as the functional op makes it
        if not name.startswith("reduce_scatter"):
            tracer.functional_all_gathers += 1
        if name.startswith("reduce_scatter"):
            block = found.persistent(nbytes(tensor), "temporary", "gloo reduce_scatter copy")
            what = "gloo_reduce_scatter_copy"
        else:
            found.transient(nbytes(tensor), "temporary", "gloo all_gather output record")
            block = found.persistent(nbytes(out), "temporary", "gloo all_gather flat output")
            what = "gloo_all_gather_flat"
        if block is not None:
            tracer.tags[block] = (what, "tensor parallel")
            pending[out.untyped_storage()._cdata] = block

    def waited(tensor: Any) -> None:
        found = tracer.recorder
        if found is None or not isinstance(tensor, torch.Tensor):
            return
        block = pending.pop(tensor.untyped_storage()._cdata, None)
        if block is not None:
            found.release(block)

    from vramscope.estimate import cuda_rules

    cuda_rules.COLLECTIVE_HOOKS.append(functional)
    cuda_rules.WAIT_HOOKS.append(waited)
    try:
        with _replaced(dist, **wrapped):
            yield
    finally:
        cuda_rules.COLLECTIVE_HOOKS.remove(functional)
        cuda_rules.WAIT_HOOKS.remove(waited)


# ---- one rank, traced -------------------------------------------------------------------------


@dataclass
class RankTracer:
    """The strategy applied to one traced rank, and what is known of its memory."""

    plan: ParallelPlan
    applied: Applied | None = None
    recorder: Recorder | None = None
    tags: dict[int, tuple[str, str]] = field(default_factory=dict)  # block -> (what, group)
    group_names: dict[int, str] = field(default_factory=dict)  # id(FSDPParam) -> group
    buckets: set[int] = field(default_factory=set)  # blocks of DDP's buckets
    bucket_sizes: dict[tuple[int, int], int] = field(default_factory=dict)  # (step, index)
    reducing: Any = None  # the FSDPParams of the group being reduce-scattered, meanwhile
    # over gloo: the functional all-gathers traced (DTensor's Shard -> Replicate), which
    # gloo does not run for CUDA tensors (GLOO_CUDA_ALL_GATHER)
    functional_all_gathers: int = 0
    pipeline: Any = None  # the PipelineApplied of this rank's stages, with pp
    context: Any = None  # the ContextApplied of this rank, with cp
    experts: Any = None  # the ExpertsApplied of this rank, with ep
    _inside: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def builder(self, builder: Builder) -> Builder:
        """``builder`` with FSDP2 applied to what it builds (the model materialized as
        shards: what the build made whole is not on the device). DDP is applied later,
        while the trace records (:meth:`setup`). Tensor parallel is applied inside the
        build too, before FSDP: the model is held as its shards from the start."""
        plan = self.plan
        if not (
            plan.sharded or plan.tensor_parallel or plan.pipeline or plan.cp > 1 or plan.ep > 1
        ):
            return builder

        def build(batch_size: int, device: torch.device, precision: str | None = None) -> Workload:
            from vramscope.zoo import call_builder

            workload = call_builder(builder, batch_size, device, precision)
            if not isinstance(workload, Workload):
                return workload  # build_workload reports the wrong type
            if self.plan.pipeline:
                return self._stage(workload, device)
            if self.plan.cp > 1 or self.plan.ep > 1:
                return self._context_or_experts(workload, device)
            self.applied = apply_plan(workload, self.plan, device, pin_memory=False)
            self._name_groups(self.applied.workload.model)
            return self.applied.workload

        build.__qualname__ = getattr(builder, "__qualname__", "build")
        return build

    def _context_or_experts(self, workload: Workload, device: torch.device) -> Workload:
        """Context or expert parallel on the job's mesh (:func:`device_mesh`: ``dp × cp``, or
        ``dp_mod_ep × ep``), then FSDP2 over the data-parallel ranks (the rank's experts
        over ``dp_mod_ep`` first); DDP later, while the trace records (:meth:`setup`)."""
        from vramscope.distributed.sharding import device_mesh

        plan = self.plan
        mesh = device_mesh(plan, device.type)
        experts = None
        if plan.cp > 1:
            from vramscope.distributed.context_parallel import apply_context_parallel

            self.context = apply_context_parallel(
                workload, plan.cp, plan.coordinates()["cp"], device, mesh=mesh["cp"]
            )
            workload = self.context.workload
        else:
            from vramscope.distributed.expert_parallel import apply_expert_parallel

            workload, self.experts = apply_expert_parallel(
                workload,
                plan.ep,
                plan.ep_rank,
                plan.imbalance,
                device,
                group=mesh["ep"].get_group(),
            )
            experts = self.experts.local_modules()
        if not plan.sharded:
            return workload
        self.applied = apply_plan(
            workload, plan, device, pin_memory=False, mesh=mesh, experts=experts
        )
        self._name_groups(self.applied.workload.model)
        if self.context is not None:
            self.context.workload = self.applied.workload
        return self.applied.workload

    def _stage(self, workload: Workload, device: torch.device) -> Workload:
        """This rank's pipeline stages cut from the built workload, then tensor parallel
        (the plan worked out on the whole model, kept to the stage's modules) and FSDP2
        (each of the stage's blocks a group, then the stage's root) applied to them; DDP
        later, while the trace records (:meth:`setup`)."""
        from vramscope.distributed.pipeline import apply_pipeline

        plan = self.plan
        layout = None
        if plan.tensor_parallel:
            from vramscope.distributed.tensor_parallel import plan_layout

            layout = plan_layout(
                workload.model, workload.tensor_parallel_plan, plan.sequence_parallel
            )
        self.pipeline = apply_pipeline(
            workload, plan.pp, plan.pp_rank, plan.schedule, plan.microbatch_count, plan.pp_split
        )
        stage = self.pipeline.workload
        if not plan.sharded and not plan.tensor_parallel:
            return stage
        from vramscope.distributed.tensor_parallel import kept_to

        self.applied = apply_plan(
            stage,
            plan,
            device,
            pin_memory=False,
            tensor_parallel=kept_to(layout, stage.model) if layout is not None else None,
            blocks=self.pipeline.own_blocks(),
        )
        self._name_groups(self.applied.workload.model)
        # the stage's optimizer made before sharding holds the whole parameters: dropped
        self.pipeline.workload = self.applied.workload
        step = self.pipeline.step
        step.workload = self.applied.workload
        if plan.sharded:
            step.fsdp = self.applied.workload.model
        tp = self.applied.tensor_parallel
        if tp is not None and tp.sequence_parallel:
            step.sequence_shard = (plan.tp, plan.tp_rank)
        return self.applied.workload

    def setup(self, workload: Workload, recorder: Recorder) -> Workload:
        """Wrap the model in DDP (and the optimizer in ZeroRedundancyOptimizer) while the
        trace records; the buckets DDP makes are labelled."""
        self.recorder = recorder
        if self.pipeline is not None:
            self.pipeline.step.workload = workload  # as the trace overrides it
            if self.plan.strategy not in ("ddp", "zero1"):
                return workload
        if self.context is not None:
            from vramscope.distributed.context_parallel import ring_attention

            # after the trace's own attention kernels: torch's patch goes around them
            self._inside.enter_context(ring_attention(self.context.mesh))
        if self.experts is not None:
            self.experts.recorder = recorder
        plan = self.plan
        if plan.sharded or plan.tensor_parallel or plan.strategy == NO_DATA_PARALLEL:
            return workload
        from vramscope.estimate.model_state import _force_foreach

        before = set(recorder.live)
        with _no_shape_check():
            applied = apply_plan(workload, self.plan, CUDA)
        ddp = applied.ddp
        assert ddp is not None
        ddp.register_comm_hook(None, self.all_reduce)
        ddp.logger = _QuietLogger(ddp.logger)
        ddp.reducer = _Reducer(ddp.reducer)
        params = {p.untyped_storage()._cdata for p in ddp.parameters()}
        for key in set(recorder.live) - before - params:
            self._bucket(recorder.live[key][0])
        if applied.zero is not None:
            _force_foreach(applied.zero.optim)
        self.applied = applied
        if self.pipeline is not None:  # the stage's step runs the wrapped model
            self.pipeline.workload = applied.workload
            self.pipeline.step.workload = applied.workload
            self.pipeline.step.ddp = ddp
        return applied.workload

    def all_reduce(self, state, bucket):  # type: ignore[no-untyped-def]
        """DDP's communication hook: the buckets it all-reduces are labelled, the reduction
        is in place (:func:`_in_place_hook`). Not annotated: DDP accepts a ``bucket``
        annotated with the class ``GradBucket`` or none."""
        recorder = self.recorder
        buffer = bucket.buffer()
        if recorder is not None:
            entry = recorder.live.get(buffer.untyped_storage()._cdata)
            if entry is not None:
                self._bucket(entry[0])
            self.bucket_sizes[(recorder.step, bucket.index())] = (
                buffer.numel() * buffer.element_size()
            )
        return _in_place_hook(state, bucket)

    def _bucket(self, block: int | None) -> None:
        if block is None or self.recorder is None:
            return
        self.buckets.add(block)
        meta = self.recorder.blocks.get(block)
        if meta is not None:  # the gradients themselves when they are views of the buckets
            meta.kind = "gradient" if self.plan.gradient_as_bucket_view else "other"

    def tag(self, tensor: Any, what: str, fsdp_params: Any) -> None:
        recorder = self.recorder
        if recorder is None or not isinstance(tensor, torch.Tensor):
            return
        entry = recorder.live.get(tensor.untyped_storage()._cdata)
        if entry is not None and entry[0] is not None:
            self.tags[entry[0]] = (what, self.group_of(fsdp_params))

    def group_of(self, fsdp_params: Any) -> str:
        """The name of the FSDP group these FSDPParams make ("?" for none)."""
        return self.group_names.get(id(fsdp_params[0]), "?") if fsdp_params else "?"

    def _name_groups(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        for name, module in model.named_modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                for fsdp_param in group.fsdp_params if group is not None else ():
                    self.group_names[id(fsdp_param)] = name or "the root"

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The fake process group of this rank, DTensor's shape propagation unrecorded and
        FSDP's buffers tagged."""
        _forget_other_ranks()
        with (
            fake_process_group(self.plan.world_size, self.plan.rank),
            _unrecorded_propagation(self),
            _gloo_buffers(self) if self.plan.backend == "gloo" else contextlib.nullcontext(),
            warnings.catch_warnings(),
        ):
            # FSDP2 warns when the root's output is a view (tensor parallel's gathered
            # logits are): about in-place ops the standard step does not do
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
            try:
                if self.plan.sharded:
                    with _fsdp_tags(self), _chunks_on_demand():
                        yield
                else:
                    yield
            finally:
                self._inside.close()


def _forget_other_ranks() -> None:
    """DTensor caches, for a process that is one rank of one job for good, how to
    redistribute from one layout to another (worked out from this rank's coordinates in the
    mesh: uneven shards differ by rank) and each op's output layout (on a mesh whose groups
    are this job's): another rank, or another job, traced in the same process works them
    out again."""
    try:
        from torch.distributed.tensor import DTensor, _redistribute
    except ImportError:
        return
    propagator = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    for cached in (
        getattr(_redistribute, "_gen_transform_infos", None),
        getattr(propagator, "propagate_op_sharding", None),
        getattr(propagator, "_propagate_tensor_meta_cached", None),
    ):
        if callable(getattr(cached, "cache_clear", None)):
            cached.cache_clear()
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if native is not None:  # the C++ dispatch's own copy of the propagator's cache
        native()


class _Chunks(Sequence):
    """``torch.chunk(tensor, count, dim)`` padded with empty tensors to ``count`` chunks, as
    FSDP2 splits a parameter over a shard group (``_chunk_with_empty``), each chunk made
    when it is asked for: FSDP asks for its own rank's and rank 0's (the padded size), so a
    world of 1024 makes 2 views per parameter instead of 1024."""

    def __init__(self, tensor: torch.Tensor, count: int, dim: int) -> None:
        self.tensor, self.count, self.dim = tensor, count, dim
        size = tensor.size(dim)
        self.step = -(-size // count)
        # how many chunks torch.chunk returns (all of them, empty, for an empty dimension)
        self.made = -(-size // self.step) if size else count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        if index < self.made:
            start = index * self.step
            length = min(self.step, self.tensor.size(self.dim) - start)
            return self.tensor.narrow(self.dim, start, length)
        return self[0].new_empty(0)


@contextlib.contextmanager
def _chunks_on_demand() -> Iterator[None]:
    """FSDP2's parameter chunks made on demand (:class:`_Chunks`)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    with _replaced(_fsdp_param, _chunk_with_empty=_Chunks):
        yield


@contextlib.contextmanager
def _unrecorded_propagation(tracer: RankTracer) -> Iterator[None]:
    """DTensor finds an op's output shape by running it on fake tensors of the global
    shape (the first time it meets the op and its inputs: the first optimizer step over
    sharded parameters); no GPU allocates those."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = tracer.recorder
        if recorder is None:
            return original(self, *args, **kwargs)
        recorder.paused += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            recorder.paused -= 1

    with _replaced(ShardingPropagator, _propagate_tensor_meta_non_cached=propagate):
        yield


def trace_rank(
    spec: WorkloadSpec,
    batch_size: int,
    profile: Any,
    plan: ParallelPlan,
    precision: str | None,
    accumulate: int | None,
    steps: int,
) -> tuple[Trace, RankTracer, dict[str, Any]]:
    """Trace ``plan.rank`` of the job; the trace, the tracer (its objects alive) and what
    differs between ranks (``loads``)."""
    from vramscope.estimate.scalars import HEAVY, LIGHT
    from vramscope.estimate.trace import trace_workload

    tracer = RankTracer(plan)
    wrapped = WorkloadSpec(spec.spec, tracer.builder(spec.builder))
    with tracer.running():
        try:
            trace = trace_workload(
                wrapped,
                batch_size,
                profile,
                precision=precision,
                accumulate=accumulate,
                steps=steps,
                setup=tracer.setup,
                # expert parallel: routing even (each expert an equal share of the tokens),
                # the imbalance applied where the tokens are exchanged
                variant=LIGHT if plan.ep > 1 else HEAVY,
            )
        except TraceError as exc:
            raise _explain_context_parallel(exc, tracer) from None
        loads = rank_loads(tracer)
    trace.communicator_bytes = sum(c["bytes"] for c in communicators(plan))
    return trace, tracer, loads


def _explain_context_parallel(exc: TraceError, tracer: RankTracer) -> TraceError:
    """A context-parallel trace that failed on chunks that are not a multiple of 32 tokens:
    torch's memory-efficient attention pads its log-sum-exp to 32, which the ring attention
    cannot merge (as on a GPU). Other errors pass unchanged."""
    context = tracer.context
    sequence = getattr(context, "sequence", None)
    if context is None or not sequence:
        return exc
    chunks = 2 * context.cp
    chunk = sequence // chunks
    if chunk % 32 == 0:
        return exc
    return TraceError(
        f"{exc}; with --cp {context.cp} each rank's attention runs on {chunk}-token chunks "
        f"(the {sequence}-token sequence in {chunks}), and torch's memory-efficient attention "
        f"needs multiples of 32 there: give a sequence that is a multiple of {32 * chunks}"
    )


MAX_TRACED_ROLES = 8  # roles traced for one estimate; the others are described


def rank_loads(tracer: RankTracer) -> dict[str, Any]:
    """What differs between ranks, read from the traced rank's objects: the ranks grouped
    into roles (``roles``: ranks that hold the same, traced once), and, where the
    data-parallel ranks' optimizer state differs (``ZeroRedundancyOptimizer``'s greedy
    partition; FSDP's last shards of a dimension that does not divide), the heaviest and
    lightest rank and the traced rank's optimizer state bytes per element."""
    applied, plan = tracer.applied, tracer.plan
    if tracer.pipeline is not None:
        return {"roles": _stage_roles(plan, tracer.pipeline.layout)}
    layout = applied.tensor_parallel if applied is not None else None
    # tensor-parallel coordinates that hold the same shapes
    if layout is not None:
        by_shapes: dict[Any, list[int]] = {}
        for c in range(plan.tp):
            by_shapes.setdefault(layout.local_shapes(c), []).append(c)
        tp_classes = list(by_shapes.values())
    else:
        tp_classes = [list(range(plan.tp))]
    loads_by_class = [_dp_loads(applied, plan, layout, cls[0]) for cls in tp_classes]
    found: dict[str, Any] = {
        "roles": _roles(plan, tp_classes, loads_by_class),
        "tensor_parallel_classes": len(tp_classes),
    }
    mine = next(i for i, cls in enumerate(tp_classes) if plan.tp_rank in cls)
    dp_loads, by = loads_by_class[mine]
    if applied is None or applied.workload.optimizer is None or dp_loads is None:
        return found
    from vramscope.estimate.model_state import _storage, optimizer_state
    from vramscope.tracking.categories import tensors_in

    state_bytes = 0
    for _, state in optimizer_state(applied.workload.optimizer):
        for t in tensors_in(state):
            st = _storage(t)
            if st is not None:
                state_bytes += -(-st.nbytes() // 512) * 512  # the allocator's blocks
    slot = _dp_slot(plan, plan.shard_index())
    traced = dp_loads[slot]
    heaviest = max(range(len(dp_loads)), key=lambda k: (dp_loads[k], -k))
    lightest = min(range(len(dp_loads)), key=lambda k: (dp_loads[k], k))
    per_element = state_bytes / traced if traced else 0.0
    found["per_element"] = per_element
    found.update(
        differ=dp_loads[heaviest] != dp_loads[lightest],
        by=by,
        heaviest_rank=plan.rank_at(dp=heaviest // plan.cp, cp=heaviest % plan.cp, tp=plan.tp_rank),
        lightest_rank=plan.rank_at(dp=lightest // plan.cp, cp=lightest % plan.cp, tp=plan.tp_rank),
        optimizer_elements={"heaviest": dp_loads[heaviest], "lightest": dp_loads[lightest]},
        optimizer_state_bytes={
            "traced": state_bytes,
            "heaviest": round(per_element * dp_loads[heaviest]),
            "lightest": round(per_element * dp_loads[lightest]),
        },
    )
    return found


_FSDP_BY = (
    "FSDP pads every rank's shard alike, but optimizer state follows the unpadded shard: where "
    "dimension 0 does not divide by the shard group, the last ranks hold less"
)
_ZERO_BY = "ZeroRedundancyOptimizer gives whole parameters to ranks, largest first"


def _dp_slot(plan: ParallelPlan, dp_rank: int) -> int:
    """Which share of the model state a data-parallel rank holds: its index in the shard
    group (FSDP, HSDP, ZeRO-2), its rank (ZeRO-1), or 0 (every rank alike). With context
    parallel ``dp_rank`` is the rank's index in the flattened ``dp × cp``
    (:meth:`ParallelPlan.shard_index`)."""
    if plan.sharded:
        return dp_rank % plan.shard_group_size
    if plan.strategy == "zero1":
        return dp_rank
    return 0


def _dp_loads(
    applied: Applied | None, plan: ParallelPlan, layout: Any, coordinate: int
) -> tuple[list[int] | None, str]:
    """The optimizer elements of each share of the model state (:func:`_dp_slot`) for the
    ranks at this tensor-parallel ``coordinate``; None where every rank holds the same."""
    if applied is None or applied.workload.optimizer is None:
        return None, ""
    if applied.zero is not None:
        parts = applied.zero._partition_parameters()
        return [sum(p.numel() for g in groups for p in g["params"]) for groups in parts], _ZERO_BY
    if not plan.sharded or plan.ep > 1:
        # expert parallel: the experts sharded over dp_mod_ep, the rest over dp; ranks
        # taken as alike (whole shares)
        return None, ""
    if layout is not None:
        shapes = list(layout.local_shapes(coordinate))
    else:
        shapes = [tuple(p.shape) for p in applied.workload.model.parameters()]
    size = plan.shard_group_size
    loads = [0] * size
    for shape in shapes:
        rows = shape[0] if shape else 1
        numel = 1
        for d in shape:
            numel *= d
        per_row = numel // rows if rows else 0
        chunk = -(-rows // size)
        for k in range(size):
            loads[k] += max(0, min(chunk, rows - k * chunk)) * per_row
    return loads, _FSDP_BY


def _roles(
    plan: ParallelPlan,
    tp_classes: list[list[int]],
    loads_by_class: list[tuple[list[int] | None, str]],
) -> list[dict[str, Any]]:
    """The ranks grouped by what they hold: their tensor-parallel shapes and their share of
    the data-parallel state. Each role says which ranks share it and which rank is traced
    for it (``trace_rank``: the first rank of each tensor-parallel class's first role, and
    of its heaviest; None for the others, which the report describes from the traced one)."""
    class_of = {c: i for i, cls in enumerate(tp_classes) for c in cls}
    members: dict[tuple[int, int], list[int]] = {}
    dp_of: dict[tuple[int, int], set[int]] = {}
    for rank in range(plan.world_size):
        coords = plan.coordinates(rank)
        cls = class_of[coords["tp"]]
        loads = loads_by_class[cls][0]
        load = loads[_dp_slot(plan, plan.shard_index(rank))] if loads is not None else 0
        members.setdefault((cls, load), []).append(rank)
        dp_of.setdefault((cls, load), set()).add(coords["dp"])
    roles = []
    for (cls, load), ranks in sorted(members.items(), key=lambda item: item[1][0]):
        roles.append(
            {
                "ranks": _ranges(ranks),
                "count": len(ranks),
                "first_rank": ranks[0],
                "tp_ranks": _ranges(tp_classes[cls]) if plan.tensor_parallel else None,
                "dp_ranks": _ranges(sorted(dp_of[(cls, load)])),
                "optimizer_elements": load if loads_by_class[cls][0] is not None else None,
                "tp_class": cls,
                "trace_rank": None,
            }
        )
    for cls in range(len(tp_classes)):
        mine = [r for r in roles if r["tp_class"] == cls]
        mine[0]["trace_rank"] = mine[0]["first_rank"]
        heaviest = max(mine, key=lambda r: (r["optimizer_elements"] or 0, -r["first_rank"]))
        heaviest["trace_rank"] = heaviest["first_rank"]
    traced = [r for r in roles if r["trace_rank"] is not None]
    for role in traced[MAX_TRACED_ROLES:]:
        role["trace_rank"] = None
    return roles


def _stage_roles(plan: ParallelPlan, layout: Any) -> list[dict[str, Any]]:
    """The pipeline's ranks by stage: each stage a role (its blocks, the micro-batches its
    schedule keeps in flight), stages that hold the same and run the same order of forwards
    and backwards sharing one (traced once). A stage's ranks are its data-parallel and
    tensor-parallel ranks; the first of them is traced (data-parallel index 0, which holds
    the largest FSDP shard's optimizer state; tensor-parallel index 0, the largest share of a
    dimension that does not divide)."""
    from dataclasses import replace as replaced

    from vramscope.distributed.pipeline import schedule_order, traced_microbatches

    by_key: dict[Any, list[int]] = {}
    layouts = {}
    schedule, pp, count = plan.schedule, plan.pp, plan.microbatch_count
    for stage in range(plan.pp):
        mine = replaced(
            layout,
            rank=stage,
            order=schedule_order(schedule, pp, count, stage),
            traced=schedule_order(
                schedule, pp, traced_microbatches(schedule, pp, count, stage), stage
            ),
        )
        layouts[stage] = mine
        by_key.setdefault(mine.key(), []).append(stage)
    roles = []
    for stages in by_key.values():
        ranks = sorted(r for r in range(plan.world_size) if plan.coordinates(r)["pp"] in stages)
        info = layouts[stages[0]].to_dict()
        info["stage"] = _ranges(stages)
        roles.append(
            {
                "ranks": _ranges(ranks),
                "count": len(ranks),
                "first_rank": ranks[0],
                "tp_ranks": _ranges(list(range(plan.tp))) if plan.tensor_parallel else None,
                "dp_ranks": _ranges(list(range(plan.dp_size))),
                "optimizer_elements": None,
                "tp_class": 0,
                "trace_rank": ranks[0],
                **info,
            }
        )
    roles.sort(key=lambda r: r["first_rank"])
    for role in roles[MAX_TRACED_ROLES:]:
        role["trace_rank"] = None
    return roles


def _ranges(values: list[int]) -> str:
    """``0-3, 8-11`` for [0, 1, 2, 3, 8, 9, 10, 11]."""
    parts: list[str] = []
    start = prev = None
    for v in sorted(values):
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


# ---- the per-rank report ------------------------------------------------------------------------


def estimate_ranks(
    spec: WorkloadSpec,
    batch_size: int,
    profile: Any,
    total: int,
    config: Any,
    config_text: str | None,
    plan: ParallelPlan,
    precision: str | None = None,
    accumulate: int | None = None,
    steps: int = 2,
    reserved_limit: int | None = None,
    *,
    replay_report: Callable[..., tuple[Report, Any]],
) -> Report:
    """The estimate of ``plan``'s job per rank: rank ``plan.rank`` traced, then one rank of
    each other role that needs its own trace (:func:`_roles`); the report returned is the
    most loaded traced rank's (the highest peak allocated), and its ``distributed`` section
    has a row per role (``roles``: which ranks share it, its peaks). ``replay_report`` is
    the estimator's (``estimate.estimator.replay_report``): each traced rank's allocations
    through the allocator simulator, and its report."""
    traced: list[dict[str, Any]] = []
    done: dict[int, tuple[Report, dict[str, Any], Trace, dict[str, Any], ParallelPlan]] = {}
    queue = [plan.rank]
    roles: list[dict[str, Any]] | None = None
    while queue:
        rank = queue.pop(0)
        if rank in done:
            continue
        current = plan.with_rank(rank)
        trace, tracer, loads = trace_rank(
            spec, batch_size, profile, current, precision, accumulate, steps
        )
        report, result = replay_report(
            spec.spec, batch_size, profile, total, config, config_text, trace, reserved_limit
        )
        traced.append(_traced_row(rank, report, loads))
        done[rank] = (report, _section(current, tracer, trace, result), trace, loads, current)
        if roles is None:
            roles = loads.get("roles") or []
            queue += [r["trace_rank"] for r in roles if r["trace_rank"] is not None]
        del tracer, result
    heaviest = max(done, key=lambda r: (done[r][0].peak.allocated_bytes or 0, -r))
    report, section, trace, loads, current = done[heaviest]
    section["traced_ranks"] = traced
    section["ranks_differ"] = bool(loads.get("differ")) or len(roles or []) > 1
    section["heaviest_rank"] = heaviest
    section["roles"] = _role_rows(roles or [], done, loads)
    if loads.get("differ"):
        section["differences"] = {k: v for k, v in loads.items() if k not in _NOT_DIFFERENCES}
    _attach(report, current, section, trace)
    return report


_NOT_DIFFERENCES = ("roles", "tensor_parallel_classes", "per_element")


def _role_rows(
    roles: list[dict[str, Any]], done: dict[int, Any], loads: dict[str, Any]
) -> list[dict[str, Any]]:
    """The roles with their peaks: a traced role's own; another's from the traced rank of
    its tensor-parallel class, its optimizer state scaled to its share (``like_rank``)."""
    rows = []
    per_element = loads.get("per_element")
    for role in roles:
        row = {k: v for k, v in role.items() if k not in ("trace_rank", "tp_class")}
        members = _members(role)
        rank = next((r for r in done if r in members), None)
        if rank is not None:
            report = done[rank][0]
            row.update(traced_rank=rank, peak=_peak(report))
            stage = done[rank][1].get("pipeline")
            if stage is not None:
                row.update(
                    recv_buffer_bytes=stage["recv_buffer_bytes"],
                    grad_recv_buffer_bytes=stage["grad_recv_buffer_bytes"],
                    parameters=stage["parameters"],
                    activations_at_peak_bytes=report.categories_at_peak.activations,
                )
        else:
            like = next(
                (
                    o["trace_rank"]
                    for o in roles
                    if o["tp_class"] == role["tp_class"] and o["trace_rank"] in done
                ),
                None,
            )
            row.update(traced_rank=None, like_rank=like, peak=None)
        if per_element and role.get("optimizer_elements") is not None:
            row["optimizer_state_bytes"] = round(per_element * role["optimizer_elements"])
        rows.append(row)
    return rows


def _members(role: dict[str, Any]) -> set[int]:
    """The ranks of a role, from its ranges (``0-3, 8``)."""
    found: set[int] = set()
    for part in role["ranks"].split(", "):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def _peak(report: Report) -> dict[str, Any]:
    return {
        "allocated_bytes": report.peak.allocated_bytes,
        "reserved_bytes": report.peak.reserved_bytes,
        "device_used_bytes": report.peak.device_used_bytes,
    }


def _traced_row(rank: int, report: Report, loads: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": rank,
        "peak": _peak(report),
        "optimizer_state_bytes": (loads.get("optimizer_state_bytes") or {}).get("traced"),
    }


def _section(plan: ParallelPlan, tracer: RankTracer, trace: Trace, result: Any) -> dict[str, Any]:
    """The report's ``distributed`` section for the traced rank, read from its objects."""
    from vramscope.distributed.memory import fsdp_items
    from vramscope.distributed.sharding import DESCRIPTIONS

    applied = tracer.applied
    section: dict[str, Any] = {
        "estimated": True,
        "strategy": plan.strategy,
        "world_size": plan.world_size,
        "rank": plan.rank,
        "plan": plan.to_dict(),
        "description": DESCRIPTIONS[plan.strategy],
        "summary": plan.describe(),
        "memory": [],
        "backend": plan.backend,
        "communicators": communicators(plan),
        "communicator_bytes": trace.communicator_bytes,
        "communicator_note": NCCL_SOURCE if plan.backend == "nccl" else GLOO_SOURCE,
    }
    if plan.tensor_parallel or plan.pipeline:
        section["mesh"] = _mesh_dims(plan)
    if tracer.pipeline is not None:
        section["description"] = PIPELINE_DESCRIPTION
        if plan.strategy in DESCRIPTIONS and plan.dp_size > 1:
            section["description"] += f"; in each stage, {DESCRIPTIONS[plan.strategy]}"
        section["pipeline"] = _pipeline_section(plan, tracer.pipeline)
    if tracer.context is not None:
        section["description"] = CONTEXT_DESCRIPTION
        section["context_parallel"] = tracer.context.to_dict()
        section["mesh"] = _mesh_dims(plan)
    if tracer.experts is not None:
        section["description"] = EXPERT_DESCRIPTION
        section["expert_parallel"] = tracer.experts.to_dict()
    if applied is None:
        return section
    if applied.tensor_parallel is not None:
        section["tensor_parallel"] = {
            **applied.tensor_parallel.to_dict(),
            "size": plan.tp,
            "rank": plan.tp_rank,
        }
        if plan.backend == "gloo":
            # in the traced steps; none: the plan runs over gloo on CUDA tensors
            section["tensor_parallel"]["functional_all_gathers"] = tracer.functional_all_gathers
    if applied.ddp is not None and tracer.bucket_sizes:
        section["memory"].append(_ddp_item(plan, tracer))
    if plan.sharded:
        section["groups"] = applied.groups
        section["sharded_modules"] = {
            "class": applied.unit_class,
            "count": len(applied.units),
            "names": applied.units[:8],
            "chosen_by": "--shard-module" if plan.shard_module else "the repeated blocks",
        }
        items = fsdp_items(applied.workload.model, "cuda")
        if plan.backend == "gloo":
            items.extend(_gloo_items(items))
        _at_the_peak(items, tracer, trace, result)
        section["memory"].extend(items)
        if plan.cpu_offload:
            section["host_bytes"] = _host_bytes(applied.workload)
    return section


CONTEXT_DESCRIPTION = (
    "context parallel: each rank holds its share of every sequence; attention sees the whole "
    "sequence through torch's ring attention"
)
EXPERT_DESCRIPTION = (
    "expert parallel: each rank holds its share of every MoE layer's experts; tokens travel "
    "to their experts' rank and back, all-to-all"
)
PIPELINE_DESCRIPTION = (
    "pipeline parallel: each rank one stage of the model, micro-batches in the schedule's order"
)


def _pipeline_section(plan: ParallelPlan, applied: Any) -> dict[str, Any]:
    """What this rank's stage holds: its blocks, the micro-batches in flight, its receive
    buffers."""
    step = applied.step
    return {
        **applied.layout.to_dict(),
        "schedule": plan.schedule,
        "microbatches": plan.microbatch_count,
        "stages": plan.pp,
        "virtual_stages_per_rank": len(applied.layout.stages),
        "split": [f"{s.start}-{s.stop - 1}" for s in applied.layout.blocks],
        "parameters": applied.stage_parameters,
        "model_parameters": applied.model_parameters,
        "recv_buffer_bytes": step.recv_bytes,
        "grad_recv_buffer_bytes": step.grad_recv_bytes,
        "order": " ".join(f"{a.kind}{a.microbatch}" for a in applied.layout.order),
    }


def _mesh_dims(plan: ParallelPlan) -> dict[str, Any]:
    """The mesh's dimensions and this rank's coordinates in them."""
    from vramscope.distributed.sharding import MESH_DIMS

    sizes = {"pp": plan.pp, "dp": plan.dp_size, "cp": plan.cp, "tp": plan.tp}
    return {
        "dims": [{"name": n, "size": sizes[n]} for n in MESH_DIMS if sizes[n] > 1],
        "coordinates": {n: c for n, c in plan.coordinates().items() if sizes[n] > 1},
    }


def _ddp_item(plan: ParallelPlan, tracer: RankTracer) -> dict[str, Any]:
    """DDP's gradient buckets as the last traced backward all-reduced them (DDP rebuilds
    them in the order gradients arrived, after the first step), in the measured report's
    terms."""
    from vramscope.distributed.memory import DDP_NOTE, DDP_VIEW_NOTE

    last = max(step for step, _ in tracer.bucket_sizes)
    sizes = [size for (step, _), size in sorted(tracer.bucket_sizes.items()) if step == last]
    first = [
        size
        for (step, _), size in sorted(tracer.bucket_sizes.items())
        if step == min(s for s, _ in tracer.bucket_sizes)
    ]
    view = plan.gradient_as_bucket_view
    cap = plan.bucket_cap
    return {
        "name": "ddp_gradient_buckets",
        "label": "DDP gradient buckets",
        "bytes": sum(-(-size // 512) * 512 for size in sizes),
        "category": "gradients" if view else "other",
        "exact": True,
        "buckets": len(sizes),
        "bucket_sizes": sizes,
        "first_step_bucket_sizes": first,
        "bucket_cap_bytes": int(cap * MiB),
        "first_bucket_cap_bytes": MiB if plan.bucket_cap_mb is None else int(cap * MiB),
        "gradient_as_bucket_view": view,
        "note": DDP_VIEW_NOTE if view else DDP_NOTE,
    }


_WHAT = {
    "fsdp_unsharded_parameters": ("unsharded", "all_gather"),
    "fsdp_reduce_scatter_buffers": ("reduce_scatter",),
    "gloo_reduce_scatter_copies": ("gloo_reduce_scatter_copy",),
}


def _gloo_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Over gloo: its copy of each group's reduce-scatter input, as large as the input."""
    reduce = next((i for i in items if i["name"] == "fsdp_reduce_scatter_buffers"), None)
    if reduce is None:
        return []
    return [
        {
            **reduce,
            "name": "gloo_reduce_scatter_copies",
            "label": "gloo's copies of reduce-scatter inputs",
        }
    ]


def _at_the_peak(
    items: list[dict[str, Any]], tracer: RankTracer, trace: Trace, result: Any
) -> None:
    """Add to FSDP's items how many groups' buffers were alive at the estimate's peak, and
    at most at once during the traced steps; the category they sit in at the peak."""
    for item in items:
        whats = _WHAT.get(item["name"], ())
        live = [
            (block, size)
            for block, size in result.peak_live.items()
            if tracer.tags.get(block, ("",))[0] in whats
        ]
        groups = sorted({tracer.tags[b][1] for b, _ in live})
        kinds = {result.activations.get(b) for b, _ in live}
        item.update(
            at_peak_bytes=sum(-(-size // 512) * 512 for _, size in live),
            at_peak_groups=groups,
            most_groups_at_once=_most_alive(trace, tracer.tags, whats),
            estimated=True,
        )
        if live:
            item["category"] = "activations" if "activation" in kinds else "temporaries"
        shown = ", ".join(groups[:4]) + (", …" if len(groups) > 4 else "")
        item["note"] = (
            f"alive at the peak: {_groups(len(groups))}"
            + (f" ({shown}), {format_bytes(item['at_peak_bytes'])}" if groups else "")
            + f"; at most {_groups(item['most_groups_at_once'])} at once. "
            + _NOTES[item["name"]]
        )


_GATHER_NOTE = (
    "Each group's parameters are all-gathered (world size × this rank's padded shard, in "
    "the parameter dtype) for its forward and again for its backward; the next group's are "
    "prefetched."
)
_REDUCE_NOTE = (
    "In backward each group's gradients are packed into one reduce-scatter input (in the "
    "reduce dtype), kept until the next group's reduce-scatter."
)
_GLOO_NOTE = (
    "gloo's reduce-scatter clones its input on the device and all-reduces the clone "
    "(through pinned host memory): one more reduce-scatter input, from the collective to its "
    "end."
)
_NOTES = {
    "fsdp_unsharded_parameters": _GATHER_NOTE,
    "fsdp_reduce_scatter_buffers": _REDUCE_NOTE,
    "gloo_reduce_scatter_copies": _GLOO_NOTE,
}


def _groups(count: int) -> str:
    return f"{count} group{'' if count == 1 else 's'}"


def _most_alive(trace: Trace, tags: dict[int, tuple[str, str]], whats: tuple[str, ...]) -> int:
    """The most groups whose buffers of these kinds were alive at once over the trace."""
    alive: dict[int, str] = {}
    most = 0
    for event in trace.events:
        if event[0] == "alloc" and tags.get(event[1], ("",))[0] in whats:
            alive[event[1]] = tags[event[1]][1]
            most = max(most, len(set(alive.values())))
        elif event[0] == "free":
            alive.pop(event[1], None)
    return most


def _host_bytes(workload: Workload) -> dict[str, int]:
    """What FSDP2's CPU offload keeps in host memory: the parameter and gradient shards and
    the optimizer state."""
    from vramscope.estimate.model_state import optimizer_state
    from vramscope.tracking.categories import local_tensor, tensors_in

    params = sum(
        local_tensor(p).untyped_storage().nbytes()
        for p in workload.model.parameters()
        if local_tensor(p).device.type == "cpu"
    )
    state = sum(
        local_tensor(t).untyped_storage().nbytes()
        for _, s in optimizer_state(workload.optimizer)
        for t in tensors_in(s)
        if local_tensor(t).device.type == "cpu"
    )
    return {"parameters": params, "gradients": params, "optimizer_state": state}


def _attach(report: Report, plan: ParallelPlan, section: dict[str, Any], trace: Trace) -> None:
    """The per-rank report: its ``distributed`` section, the job in its workload, findings."""
    report.workload["world_size"] = plan.world_size
    report.workload["strategy"] = plan.strategy
    if plan.tensor_parallel:
        report.workload["tp"] = plan.tp
    if plan.pipeline:
        report.workload["pp"] = plan.pp
        report.workload["microbatches"] = plan.microbatch_count
    if plan.cp > 1:
        report.workload["cp"] = plan.cp
    if plan.ep > 1:
        report.workload["ep"] = plan.ep
        report.workload["ep_imbalance"] = plan.imbalance
    report.extra["distributed"] = section
    findings = []
    rank = section["rank"]
    roles = section.get("roles") or []
    if plan.pipeline and len(roles) > 1:
        shown = "; ".join(
            f"stage {r['stage']} ({r['in_flight'][0]} in flight)"
            + (f" {format_bytes(r['peak']['allocated_bytes'])}" if r.get("peak") else "")
            for r in roles[:8]
        )
        findings.append(
            Finding(
                "ranks_differ",
                "info",
                f"pipeline stages differ in their blocks and in the micro-batches their "
                f"schedule ({plan.schedule}) keeps in flight: {shown}; this report is rank "
                f"{rank}'s (stage {section['pipeline']['stage']}), the most loaded",
            )
        )
    elif len(roles) > 1 and "differences" not in section:
        shown = "; ".join(
            f"ranks {r['ranks']}"
            + (f" {format_bytes(r['peak']['allocated_bytes'])} allocated" if r.get("peak") else "")
            for r in roles[:4]
        )
        findings.append(
            Finding(
                "ranks_differ",
                "info",
                f"ranks differ in what tensor parallel gives them (a dimension that does not "
                f"divide by --tp: torch.chunk's shares, the last ranks smaller): {shown}; this "
                f"report is rank {rank}'s, the most loaded",
            )
        )
    if section.get("differences"):
        diff = section["differences"]
        state = diff["optimizer_state_bytes"]
        findings.append(
            Finding(
                "ranks_differ",
                "info",
                f"ranks differ in optimizer state ({diff['by']}): rank {diff['heaviest_rank']} "
                f"holds {format_bytes(state['heaviest'])}, rank {diff['lightest_rank']} "
                f"{format_bytes(state['lightest'])}; this report is rank {rank}'s, the heaviest",
            )
        )
    if trace.communicator_bytes:
        count = len(section["communicators"])
        findings.append(
            Finding(
                "nccl",
                "info",
                f"device used includes {format_bytes(trace.communicator_bytes)} for NCCL "
                f"({count} communicator{'s' if count > 1 else ''}): {NCCL_SOURCE}",
            )
        )
    if section.get("backend") == "gloo":
        findings.append(Finding("gloo", "info", GLOO_SOURCE))
        if (section.get("tensor_parallel") or {}).get("functional_all_gathers"):
            findings.append(Finding("gloo_cuda_all_gather", "warning", GLOO_CUDA_ALL_GATHER))
    units = section.get("sharded_modules")
    if units is not None and not units["count"]:
        findings.append(
            Finding(
                "fsdp_one_group",
                "warning",
                "no repeated blocks found to shard one by one: the whole model is one FSDP "
                "group, gathered at once (name the blocks' class with --shard-module)",
            )
        )
    if trace.communicator_bytes and report.reconciliation:
        report.reconciliation[0].note += (
            f"; context and libraries include {format_bytes(trace.communicator_bytes)} for "
            "NCCL's communicators (a constant, uncalibrated)"
        )
    position = 1 if report.findings and report.findings[0].kind == "verdict" else 0
    report.findings[position:position] = findings
