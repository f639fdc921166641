"""Pipeline parallel: a workload written for one GPU cut into stages, each rank running its
stage's share of the micro-batches in the order its schedule gives.

The stages (:func:`split_blocks`): the model's repeated blocks (the transformer layers,
:func:`vramscope.fit.strategies.repeated_blocks`) divided evenly among the stages (the
first stages take one more where they do not divide), or at the split points given; the
modules registered before the blocks (the embeddings) on the first stage, those after
them (the final norm, the head) and the loss on the last. With ``interleaved-1f1b`` each
rank holds 2 virtual stages: rank ``r`` holds stages ``r`` and ``r + pp``.

The order (:func:`schedule_order`) is the schedule's own. GPipe and 1F1B run one stage per
rank, and the order is that of their ``_step_microbatches`` (torch's
``torch.distributed.pipelining``): GPipe forwards every micro-batch, then backwards every
one; 1F1B forwards ``min(micro-batches, stages - stage)`` micro-batches, then alternates a
backward and a forward, then backwards the rest. (Their ``_get_pipeline_order`` tables are
for drawing the schedule: in torch 2.13 1F1B's skips the last stage's first forward.)
Interleaved 1F1B is run by torch from its ``pipeline_order`` (``_PipelineScheduleRuntime``),
computed in pure Python by ``ScheduleInterleaved1F1B._calculate_single_rank_operations``:
it is read from torch.

torch's ``PipelineStage`` itself does not run under the fake process group: before its
first step it exchanges the stages' input and output shapes between ranks (an object sent
over p2p, a vote over p2p tensors), which a group that moves nothing cannot answer. So each
stage runs here as torch's ``PipelineStage`` runs it, keeping what it keeps
(:class:`PipelineStep`):

* a receive buffer per micro-batch for the activation coming in (``_setup_forward_recv_info``:
  one buffer per micro-batch, made at the first step and kept), on every stage but the
  first; and a receive buffer per micro-batch for the gradient coming back
  (``_setup_backward_recv_info``), on every stage but the last;
* each micro-batch's forward graph from its forward to its backward (``fwd_cache``): its
  activations, and its output, which is sent from where it is (a detached view: no copy);
  on the last stage the output (the logits) beside the loss computed from it, until the
  micro-batch's backward is done (``backward_one_chunk`` pops it first); GPipe's and 1F1B's
  step also hold their last forward's output in a local variable until the next forward
  returns (the end of the step for the last one);
* the gradient of each received activation, which ``torch.autograd.backward`` accumulates
  into the receive buffer's ``.grad``; ``stage_backward`` takes it from there (``.grad =
  None``) and it lives on only in what sends it back: 1F1B's step holds its send ops until
  the next backward's are made, so it goes after the stage's next backward (the last one
  at the step's end); GPipe and the interleaved runtime keep every send's work until the
  step's end and wait for them all there (torch 2.11 and 2.13 alike);
* the gradients scaled by the micro-batch count after the last backward
  (``scale_grads``, in place), then the optimizer step.

The last stage's outputs are not kept for the caller (``step(..., return_outputs=False)``,
as a training script that reads only the losses calls it).

Data and tensor parallel run inside a stage (a 3-D job): tensor parallel's plan is worked
out on the whole model and applied to the stage's modules, FSDP2 shards each of the stage's
blocks and then the stage's root, DDP wraps the stage's model, over the stage's
data-parallel group. The step then does what ``PipelineStage.backward_maybe_with_nosync``
and ``perform_reduce_grad`` do: under DDP every forward and every backward but the stage's
last run in ``no_sync`` (the buckets are all-reduced once); under FSDP2 every backward runs
with ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)`` (the
gathered parameters stay, the unsharded gradients accumulate) and after the last one every
group's ``post_backward`` reduce-scatters and reshards. With sequence parallel a stage
receives and sends its share of the sequence.

1F1B's rounds after the first are not traced: after its warm-up a stage holds the same
micro-batches in flight at each backward, and the previous micro-batch's gradient being
sent, so its warm-up and one backward-forward pair (``pp - s + 1`` micro-batches on stage
``s``, :func:`traced_microbatches`) hold what a step of more holds; the receive buffers are
made for every micro-batch, as torch makes them.

A stage runs the model's own forward (the workload's loss function, called on the model):
what comes before the stage's first block (the embedding, the masks and rotary tables of
later stages) and what comes after its last block on a stage that is not the last runs
unrecorded, as it runs on other ranks; the stage's first block takes the received
activation instead of its input, and the output of its last block is what it sends.
Masks and rotary tables a model computes before its blocks are therefore not counted on
stages after the first (each stage of a real job computes its own; they are small). Blocks
of other stages run once; a block that returns a tensor like its input hands its input on
after that (:class:`_Elsewhere`), so a deep model's other stages cost nothing each
micro-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vramscope.contract import single_optimizer
from vramscope.errors import VramscopeError
from vramscope.workload import Workload

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
DEFAULT_SCHEDULE = "1f1b"
VIRTUAL_STAGES = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2}
TORCH_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
}


def default_microbatches(pp: int) -> int:
    """Micro-batches per step when none are given: twice the stages (1F1B needs at least
    as many as stages; twice as many keeps its bubble to a third of the step)."""
    return 2 * pp


def check_schedule(schedule: str, pp: int, microbatches: int) -> None:
    """A one-line VramscopeError for a schedule torch would refuse."""
    if schedule not in SCHEDULES:
        raise VramscopeError(
            f"unknown --pp-schedule {schedule!r}; use one of {', '.join(SCHEDULES)}"
        )
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise VramscopeError(
            f"--microbatches must be a whole number of 1 or more, not {microbatches!r}"
        )
    if schedule == "1f1b" and microbatches < pp:
        raise VramscopeError(
            f"--microbatches {microbatches} is fewer than the {pp} stages: 1F1B needs at least "
            "one micro-batch per stage (torch's Schedule1F1B refuses fewer)"
        )
    if schedule == "interleaved-1f1b":
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            raise VramscopeError(
                f"--microbatches {microbatches} with --pp {pp}: interleaved 1F1B needs a "
                f"multiple of its rounds ({rounds} = micro-batches // stages), as torch's "
                "ScheduleInterleaved1F1B does"
            )


# ---- the schedule's order ----------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One computation of a rank: ``F`` (forward) or ``B`` (backward) of micro-batch
    ``microbatch`` on stage ``stage`` (a virtual stage index, 0 to stages × virtual − 1)."""

    kind: str
    stage: int
    microbatch: int


def _torch_order(schedule: str, pp: int, microbatches: int) -> dict[int, list[Any]] | None:
    """torch's ``pipeline_order`` of a schedule that runs from it (rank -> actions, None for
    idle), or None where this torch does not compute one."""
    try:
        from torch.distributed.pipelining import schedules as module
    except ImportError:
        return None
    cls = getattr(module, TORCH_CLASSES[schedule], None)
    if cls is None:
        return None
    try:
        obj = cls.__new__(cls)
        obj.pp_group_size = pp
        obj.n_local_stages = VIRTUAL_STAGES[schedule]
        obj._n_microbatches = microbatches
        obj.number_of_rounds = max(1, microbatches // pp)
        obj.microbatches_per_round = microbatches // obj.number_of_rounds
        order = {r: obj._calculate_single_rank_operations(r) for r in range(pp)}
    except Exception:  # another torch computes it otherwise
        return None
    return order


def _single_stage_order(schedule: str, pp: int, microbatches: int, rank: int) -> list[Action]:
    """GPipe and 1F1B as their ``_step_microbatches`` run them."""
    m = microbatches
    if schedule == "gpipe":
        return [Action("F", rank, i) for i in range(m)] + [Action("B", rank, i) for i in range(m)]
    warmup = min(m, pp - rank)
    actions = [Action("F", rank, i) for i in range(warmup)]
    forward, backward = warmup, 0
    while backward < m:
        actions.append(Action("B", rank, backward))
        backward += 1
        if forward < m:
            actions.append(Action("F", rank, forward))
            forward += 1
    return actions


def schedule_order(schedule: str, pp: int, microbatches: int, rank: int) -> list[Action]:
    """The forwards and backwards pipeline rank ``rank`` runs in one step, in order."""
    if VIRTUAL_STAGES[schedule] == 1:
        return _single_stage_order(schedule, pp, microbatches, rank)
    order = _torch_order(schedule, pp, microbatches)
    if order is None:
        raise VramscopeError(
            f"torch {torch.__version__} does not compute the order of "
            f"{TORCH_CLASSES[schedule]} as vramscope reads it; use --pp-schedule 1f1b or gpipe"
        )
    actions = []
    for action in order.get(rank, []):
        if action is None:
            continue
        kind = getattr(action.computation_type, "value", str(action.computation_type))
        kind = {"F": "F", "B": "B", "I": "B"}.get(str(kind))
        if kind is None:
            continue  # the reduce-grad marker, a weight-only backward, sends and receives
        actions.append(Action(kind, action.stage_index, action.microbatch_index))
    return actions


def traced_microbatches(schedule: str, pp: int, microbatches: int, rank: int) -> int:
    """How many of a step's micro-batches the trace of pipeline rank ``rank`` runs. 1F1B's
    steady phase repeats: after its warm-up a stage holds the same micro-batches in flight
    at each backward, its gradients accumulate in the same tensors and its receive buffers
    are made at once for every micro-batch, so its warm-up (``pp - rank`` forwards) and one
    backward-forward pair hold what every later round holds. GPipe holds every micro-batch,
    and the interleaved order is torch's own: all are run."""
    if schedule == "1f1b":
        return min(microbatches, pp - rank + 1)
    return microbatches


def most_in_flight(actions: list[Action]) -> dict[int, int]:
    """Per stage: the most micro-batches forwarded and not yet backwarded at once."""
    alive: dict[int, int] = {}
    most: dict[int, int] = {}
    for a in actions:
        alive[a.stage] = alive.get(a.stage, 0) + (1 if a.kind == "F" else -1)
        most[a.stage] = max(most.get(a.stage, 0), alive[a.stage])
    return most


# ---- the stages ---------------------------------------------------------------------------


def split_blocks(blocks: int, stages: int, points: tuple[int, ...] | None = None) -> list[range]:
    """The blocks of each stage: at the split points (block indices where the stages after
    the first begin), else evenly, the first stages one more where they do not divide."""
    if blocks < stages:
        raise VramscopeError(
            f"--pp: {stages} stages but the model has {blocks} repeated blocks to divide among "
            "them: use fewer stages"
        )
    if points is not None:
        if len(points) != stages - 1:
            raise VramscopeError(
                f"--pp-split gives {len(points)} split points; {stages} stages need "
                f"{stages - 1} (the block where each stage after the first begins)"
            )
        bounds = [0, *points, blocks]
        if any(not 0 < bounds[i] < bounds[i + 1] for i in range(1, len(bounds) - 1)) or (
            bounds[-2] >= blocks
        ):
            raise VramscopeError(
                f"--pp-split {','.join(map(str, points))}: split points must increase, from 1 "
                f"to {blocks - 1} (the model has {blocks} repeated blocks)"
            )
        return [range(bounds[i], bounds[i + 1]) for i in range(stages)]
    base, extra = divmod(blocks, stages)
    out, start = [], 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


@dataclass
class StageLayout:
    """Which stages a pipeline rank holds, and what each holds."""

    pp: int
    rank: int  # the index in the pipeline (the mesh's pp coordinate)
    schedule: str
    microbatches: int
    blocks: list[range]  # every (virtual) stage's blocks
    block_names: list[str]
    container: str  # the ModuleList's name
    before: list[str]  # modules with parameters before the blocks: the first stage's
    after: list[str]  # after them: the last stage's
    order: list[Action] = field(default_factory=list)
    # the order the trace runs: the first micro-batches of ``order`` (traced_microbatches)
    traced: list[Action] = field(default_factory=list)

    @property
    def stages(self) -> list[int]:
        """This rank's (virtual) stages."""
        return [self.rank + v * self.pp for v in range(VIRTUAL_STAGES[self.schedule])]

    @property
    def count(self) -> int:
        return len(self.blocks)

    def first(self, stage: int) -> bool:
        return stage == 0

    def last(self, stage: int) -> bool:
        return stage == self.count - 1

    def key(self) -> tuple[Any, ...]:
        """What makes two pipeline ranks hold the same: their stages' blocks, the embeddings
        and the head, and their order of forwards and backwards (stage indices relative)."""
        local = {s: i for i, s in enumerate(self.stages)}
        return (
            tuple(len(self.blocks[s]) for s in self.stages),
            0 in self.stages,
            self.count - 1 in self.stages,
            tuple((a.kind, local.get(a.stage), a.microbatch) for a in self.order),
        )

    def describe(self, stage: int) -> str:
        span = self.blocks[stage]
        words = [
            f"{self.container}.{span.start}-{span.stop - 1}"
            if len(span) > 1
            else f"{self.container}.{span.start}"
        ]
        if self.first(stage) and self.before:
            words.insert(0, ", ".join(self.before))
        if self.last(stage):
            words.append(", ".join([*self.after, "the loss"]))
        return ", ".join(words)

    def to_dict(self) -> dict[str, Any]:
        flight = most_in_flight(self.order)
        return {
            "stage": self.rank,
            "virtual_stages": self.stages,
            "blocks": [f"{self.blocks[s].start}-{self.blocks[s].stop - 1}" for s in self.stages],
            "block_count": sum(len(self.blocks[s]) for s in self.stages),
            "holds": [self.describe(s) for s in self.stages],
            "first": 0 in self.stages,
            "last": self.count - 1 in self.stages,
            "in_flight": [flight.get(s, 0) for s in self.stages],
            "traced_microbatches": len({a.microbatch for a in self.traced}) or None,
        }


def _parts(model: torch.nn.Module) -> tuple[str, list[torch.nn.Module], list[str], list[str]]:
    """The blocks' container's name and blocks, and the parameter-holding modules outside
    them registered before and after them (outermost, by name)."""
    from vramscope.fit.strategies import repeated_blocks

    blocks = repeated_blocks(model)
    if len(blocks) < 2:
        raise VramscopeError(
            f"--pp: {type(model).__name__} has no repeated blocks (a ModuleList of alike "
            "layers) to divide into pipeline stages"
        )
    ids = {id(b) for b in blocks}
    names = {id(m): n for n, m in model.named_modules()}
    first_name = names[id(blocks[0])]
    container = first_name.rpartition(".")[0]
    before: list[str] = []
    after: list[str] = []
    seen_blocks = False
    inside = container + "."
    for name, module in model.named_modules():
        if not name or id(module) in ids or name.startswith(inside) or name == container:
            seen_blocks = seen_blocks or id(module) in ids
            continue
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        (after if seen_blocks else before).append(name)
    return container, blocks, _outermost(before), _outermost(after)


def _outermost(names: list[str]) -> list[str]:
    """Module names without those inside another of the list... keeping order."""
    return [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]


def plan_layout(
    model: torch.nn.Module,
    pp: int,
    rank: int,
    schedule: str,
    microbatches: int,
    points: tuple[int, ...] | None = None,
) -> StageLayout:
    """The stages of ``model`` and those pipeline rank ``rank`` holds."""
    container, blocks, before, after = _parts(model)
    stages = pp * VIRTUAL_STAGES[schedule]
    spans = split_blocks(len(blocks), stages, points)
    names = {id(m): n for n, m in model.named_modules()}
    return StageLayout(
        pp=pp,
        rank=rank,
        schedule=schedule,
        microbatches=microbatches,
        blocks=spans,
        block_names=[names[id(b)] for b in blocks],
        container=container,
        before=before,
        after=after,
        order=schedule_order(schedule, pp, microbatches, rank),
        traced=schedule_order(
            schedule, pp, traced_microbatches(schedule, pp, microbatches, rank), rank
        ),
    )


# ---- the stage model -----------------------------------------------------------------------


class _Elsewhere(torch.nn.Module):
    """A module of another stage: it runs (unrecorded, for the shapes that follow) but its
    parameters are not this rank's (not among the stage's parameters, on no block of this
    GPU).

    Another stage's block (``block=True``) runs once; when it returned a tensor of its first
    argument's shape and dtype, as a transformer layer does, it hands its first argument on
    from then on: the blocks before the stage only give the shape of what the stage
    receives (the receive buffer replaces it), those after it are another rank's work, and
    a deep model's other stages cost nothing each micro-batch."""

    other_stage = True

    def __init__(self, inner: torch.nn.Module, block: bool = False) -> None:
        super().__init__()
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_passes_on", None if block else False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else kwargs.get("hidden_states")
        if self._passes_on and isinstance(first, torch.Tensor):
            return first
        out = self._inner(*args, **kwargs)
        if self._passes_on is None:
            same = (
                isinstance(first, torch.Tensor)
                and isinstance(out, torch.Tensor)
                and type(out) is type(first)
                and out.shape == first.shape
                and out.dtype == first.dtype
            )
            object.__setattr__(self, "_passes_on", same)
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_inner"), name)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:  # type: ignore[override]
        with _paused_for(self._inner):
            self._inner._apply(fn, recurse)
        return self


def _recorder_of(tensor: Any) -> Any:
    """The recorder of the trace a (fake) tensor belongs to; of a DTensor's local shard."""
    tensor = getattr(tensor, "_local_tensor", tensor)
    mode = getattr(tensor, "fake_mode", None)
    return getattr(mode, "recorder", None)


@contextlib.contextmanager
def _paused(recorder: Any) -> Iterator[None]:
    """Nothing made inside is an allocation of this GPU (another rank's work)."""
    if recorder is None:
        yield
        return
    recorder.paused += 1
    try:
        yield
    finally:
        recorder.paused -= 1


@contextlib.contextmanager
def _paused_for(module: torch.nn.Module) -> Iterator[None]:
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    with _paused(_recorder_of(tensor)):
        yield


def _set_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, (torch.nn.ModuleList, torch.nn.Sequential)):
        parent[int(attr)] = module
    else:
        setattr(parent, attr, module)


@dataclass
class PipelineApplied:
    """What cutting a workload into a rank's stages made."""

    workload: Workload
    layout: StageLayout
    step: PipelineStep
    stage_parameters: int  # parameters this rank holds
    model_parameters: int  # of the whole model

    def own_blocks(self) -> list[torch.nn.Module]:
        """The blocks of this rank's stages, in order."""
        layout, model = self.layout, self.workload.model
        return [
            model.get_submodule(layout.block_names[i])
            for stage in layout.stages
            for i in layout.blocks[stage]
        ]


def apply_pipeline(
    workload: Workload,
    pp: int,
    rank: int,
    schedule: str,
    microbatches: int,
    points: tuple[int, ...] | None = None,
) -> PipelineApplied:
    """Cut a built workload into pipeline rank ``rank``'s stages: the other stages' modules
    stay (to run unrecorded) but hold no memory of this GPU; the optimizer is made again
    over this rank's parameters; the workload's step is the schedule's (:class:`PipelineStep`)."""
    if workload.step is not None:
        raise VramscopeError(
            "--pp: the workload has its own step function; pipeline parallel runs the standard "
            "step (its loss function) split into stages"
        )
    if workload.optimizer is None or not workload.training:
        raise VramscopeError("--pp estimates a training step: the workload has no optimizer")
    model = workload.model
    layout = plan_layout(model, pp, rank, schedule, microbatches, points)
    mine = set(layout.stages)
    owned: set[str] = set()
    for s in mine:
        owned.update(layout.block_names[i] for i in layout.blocks[s])
        if layout.first(s):
            owned.update(layout.before)
        if layout.last(s):
            owned.update(layout.after)
    others = [n for n in (*layout.block_names, *layout.before, *layout.after) if n not in owned]
    kept: set[int] = set()
    for name in owned:
        kept.update(id(p) for p in model.get_submodule(name).parameters())
    if 0 in mine:  # the model's own parameters (outside any module) go with the embeddings
        kept.update(id(p) for p in model.parameters(recurse=False))
    model_parameters = sum(p.numel() for p in model.parameters())
    blocks = set(layout.block_names)
    recorder = _recorder_of(next(model.parameters()))
    for name in ["", *others]:
        module = model.get_submodule(name)
        with _paused(recorder):
            for sub in module.modules() if name else [model]:
                for p in list(sub._parameters.values()):
                    if p is None or id(p) in kept:
                        continue  # a weight tied to one of this rank's modules
                    p.data = torch.empty_like(p)  # another rank's: no block of this GPU
                    p.requires_grad_(False)
                for key, t in list(sub._buffers.items()) if name else []:
                    if t is not None:
                        sub._buffers[key] = torch.empty_like(t)
        if name:
            _set_module(model, name, _Elsewhere(module, block=name in blocks))
    from vramscope.distributed.optim import constructor_defaults

    optimizer = single_optimizer(workload, "pipeline parallelism")
    groups = []
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if id(p) in kept]
        if params:
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    optimizer = type(optimizer)(groups, **constructor_defaults(optimizer))
    done = replace(workload, model=model, optimizer=optimizer)
    step = PipelineStep(done, layout)
    done = replace(done, step=step)
    step.workload = done
    stage_parameters = sum(p.numel() for p in model.parameters())
    return PipelineApplied(done, layout, step, stage_parameters, model_parameters)


# ---- the step ------------------------------------------------------------------------------


def metadata_inference() -> str | None:
    """How this torch's ``PipelineStage`` learns its shapes at the first step: ``"no_grad"``
    (torch 2.11's ``_shape_inference``: a forward under no_grad), ``"grad"`` (the forward and
    backward metadata inference of newer torch), or None (neither is there)."""
    from torch.distributed.pipelining import stage as torch_stage

    base = getattr(torch_stage, "PipelineStage", None)
    if hasattr(base, "_forward_metadata_inference"):
        return "grad"
    return "no_grad" if hasattr(base, "_shape_inference") else None


class PipelineStep:
    """One training step of a pipeline rank, as torch's ``PipelineStage`` and schedule run
    it (see the module's docstring): the rank's forwards and backwards in the schedule's
    order, its receive buffers, the optimizer step."""

    # it runs the standard step's micro-batches itself: --precision and --accumulate apply
    # to it as to the standard step (Workload.with_overrides)
    applies_overrides = True

    def __init__(self, workload: Workload, layout: StageLayout) -> None:
        self.workload = workload
        self.layout = layout
        self.active: int | None = None  # the stage whose forward runs
        self.microbatch = 0
        self.output: Any = None
        # the last stage's output of each micro-batch, kept from its forward until its
        # backward is done (torch's ``fwd_cache``: ``backward_one_chunk`` pops it first)
        self.last_outputs: dict[tuple[int, int], Any] = {}
        self.recv: dict[int, list[torch.Tensor]] = {}  # stage -> activations received
        self.grad_recv: dict[int, list[torch.Tensor]] = {}  # stage -> gradients received
        self.recorder: Any = None
        self.recv_bytes = 0  # the receive buffers this rank keeps
        self.grad_recv_bytes = 0
        self._runner: Any = None
        # the stage's data parallel, as torch's PipelineStage meets it: the FSDP2 root
        # (fully_shard on the stage's model) or the DistributedDataParallel wrapper
        self.fsdp: Any = None
        self.ddp: Any = None
        # with sequence parallel: (tensor-parallel ranks, this rank's index); a stage
        # receives its share of the sequence, as its blocks hold the activations
        self.sequence_shard: tuple[int, int] | None = None
        self._sequence_length: int | None = None  # the whole sequence, with sequence_shard
        # torch's metadata inference before the first micro-batch (_infer_metadata):
        # None outside it, else "no_grad" (torch 2.11's shape inference) or "grad"
        self._inferring: str | None = None
        self._inferred = False
        self._inference_inputs: dict[int, torch.Tensor] = {}
        model = workload.model
        for stage in layout.stages:
            span = layout.blocks[stage]
            first = model.get_submodule(layout.block_names[span.start])
            last = model.get_submodule(layout.block_names[span.stop - 1])
            first.register_forward_pre_hook(self._entering(stage), with_kwargs=True)
            last.register_forward_hook(self._leaving(stage))

    # the stage's edges ---------------------------------------------------------------------

    def _entering(self, stage: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if self.active != stage or self.layout.first(stage):
                return None
            if self.recorder is not None:
                self.recorder.paused -= 1  # this stage's work: recorded from here
            incoming = args[0] if args else kwargs.get("hidden_states")
            if not isinstance(incoming, torch.Tensor):
                raise VramscopeError(
                    f"--pp: {type(module).__name__}'s first argument is not a tensor: the "
                    "activation a stage receives replaces a block's first argument"
                )
            if self.sequence_shard is not None and incoming.dim() > 1:
                ranks, index = self.sequence_shard
                size = self._sequence_length = incoming.size(1)
                chunk = -(-size // ranks)  # torch.chunk's share, the last ranks smaller
                start = min(size, index * chunk)
                incoming = incoming.narrow(1, start, max(0, min(chunk, size - start)))
            if self._inferring is not None:
                # the metadata inference's input: zeros of the received shape (torch 2.11),
                # or an empty tensor that requires grad (``TensorMeta.to_tensor``)
                if self._inferring == "no_grad":
                    buffer = torch.zeros_like(incoming, memory_format=torch.contiguous_format)
                else:
                    buffer = torch.empty_like(incoming, memory_format=torch.contiguous_format)
                    buffer.requires_grad_(buffer.is_floating_point())
                self._inference_inputs[stage] = buffer
            else:
                buffer = self._receive_buffers(stage, incoming)[self.microbatch]
                buffer.requires_grad_(True)
            if args:
                return (buffer, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": buffer}

        return hook

    def _leaving(self, stage: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            if self.active != stage or self.layout.last(stage):
                return None
            self.output = output
            if self.recorder is not None:
                self.recorder.paused += 1  # the later stages' work
            if self.sequence_shard is None or not isinstance(output, torch.Tensor):
                return None
            # the stage sends its share of the sequence; the later stages' modules, run
            # here for the shapes only, take the whole sequence
            whole = self._sequence_length or output.size(1) * self.sequence_shard[0]
            return output.new_empty((output.size(0), whole, *output.shape[2:]))

        return hook

    def _sent(self, action: Action, sending: dict[int, list[torch.Tensor]]) -> None:
        """After a micro-batch's backward, the gradient of the activation it received, as
        torch's ``stage_backward`` leaves it: taken from the receive buffer's ``.grad``
        (which it sets to None) and held only by what sends it back. 1F1B holds its send
        ops until the next backward's are made (``bwd_sends``), so the previous micro-batch's
        gradient goes after this backward; GPipe and the interleaved runtime keep every
        send's work until they wait for them all at the step's end."""
        buffers = self.recv.get(action.stage)
        if buffers is None:
            return
        buffer = buffers[action.microbatch]
        grad, buffer.grad = buffer.grad, None
        held = sending.setdefault(action.stage, [])
        if self.layout.schedule == "1f1b":
            held.clear()
        if grad is not None:
            held.append(grad)

    def _receive_buffers(self, stage: int, like: torch.Tensor) -> list[torch.Tensor]:
        """The stage's receive buffers, one per micro-batch, made the first time."""
        buffers = self.recv.get(stage)
        if buffers is None:
            buffers = [
                torch.empty_like(like, memory_format=torch.contiguous_format)
                for _ in range(self.layout.microbatches)
            ]
            self.recv[stage] = buffers
            self.recv_bytes += sum(_bytes(b) for b in buffers)
            self._label(buffers)
        return buffers

    def _gradient_buffers(self, stage: int, like: torch.Tensor) -> list[torch.Tensor]:
        """The stage's buffers for the gradients coming back, one per micro-batch."""
        grads = self.grad_recv.get(stage)
        if grads is None:
            grads = [torch.empty_like(like) for _ in range(self.layout.microbatches)]
            self.grad_recv[stage] = grads
            self.grad_recv_bytes += sum(_bytes(g) for g in grads)
            self._label(grads)
        return grads

    def _infer_metadata(self) -> None:
        """What torch's schedule does at its first step before any micro-batch: each stage
        learns its shapes by running itself once on real tensors of the device.

        * torch 2.11 (``PipelineStage._shape_inference``): the stage's forward under
          ``no_grad`` on zeros of the received activation's shape (the first stage: the first
          micro-batch), its output dropped; then the receive buffers.
        * newer torch (``_forward_metadata_inference`` and ``_backward_metadata_inference``):
          the forward with grad enabled on an empty input that requires grad, the receive
          buffers made while its graph lives, then, stage by stage from the last, the input's
          gradient by ``autograd.grad`` (the last stage from its loss, the others from ones
          of their output's shape) and the buffers of the gradients coming back; everything
          dropped after. With data parallel inside the stage the forward alone is run.

        The blocks it leaves behind shape the allocator's segments (reserved memory); its
        own peak is that of one micro-batch before any gradient or optimizer state exists."""
        kind = metadata_inference()
        if kind is None:
            return  # a torch whose stages are given their shapes: nothing runs
        newer = kind == "grad"
        grad = newer and self.fsdp is None and self.ddp is None
        self._inferring = "grad" if grad else "no_grad"
        outputs: dict[int, Any] = {}
        try:
            for stage in self.layout.stages:
                with torch.enable_grad() if grad else torch.no_grad():
                    outputs[stage] = self._forward(stage, 0)
                incoming = self._inference_inputs.get(stage)
                if newer and incoming is not None:
                    self._receive_buffers(stage, incoming)
            if grad:
                for stage in reversed(self.layout.stages):
                    out, incoming = outputs.pop(stage), self._inference_inputs.get(stage)
                    if not isinstance(out, torch.Tensor) or not out.requires_grad:
                        continue
                    if incoming is not None and incoming.requires_grad:
                        ones = None if self.layout.last(stage) else torch.ones_like(out)
                        torch.autograd.grad(out, [incoming], ones, allow_unused=True)
                        del ones
                    if not self.layout.last(stage):
                        self._gradient_buffers(stage, out)
                    del out, incoming
        finally:
            self._inferring = None
            self.output = None
            outputs.clear()
            self._inference_inputs.clear()
            self.last_outputs.clear()

    def _label(self, buffers: list[torch.Tensor]) -> None:
        """The receive buffers are the stage's communication buffers, kept across steps
        (category other, as DDP's buckets)."""
        if self.recorder is None:
            return
        for buffer in buffers:
            self.recorder.retag(buffer.untyped_storage(), "other", "pipeline receive buffers")

    # one step ------------------------------------------------------------------------------

    def _micro_batch(self, stage: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from vramscope.workload import _as_args, _cast_floating

        w = self.workload
        # the first stage reads the inputs, the last the targets; the others neither
        recorded = self.layout.first(stage) or self.layout.last(stage)
        with contextlib.nullcontext() if recorded else _paused(self.recorder):
            batch = w.batch()
            if self._runner._input_dtype is not None:
                batch = _cast_floating(batch, self._runner._input_dtype)
        return _as_args(batch)

    def _forward(self, stage: int, microbatch: int) -> Any:
        w = self.workload
        args, kwargs = self._micro_batch(stage)
        self.active, self.microbatch, self.output = stage, microbatch, None
        if self.sequence_shard is not None and self.layout.first(stage):
            # the first stage's blocks see their share only: the inputs' (batch, sequence)
            tokens = _first_tensor([*args, *kwargs.values()])
            if tokens is not None and tokens.dim() > 1:
                self._sequence_length = tokens.size(1)
        first, last = self.layout.first(stage), self.layout.last(stage)
        if not first and self.recorder is not None:
            self.recorder.paused += 1  # the earlier stages' work, until the stage's first block
        outputs: list[Any] = []
        # torch 2.11's shape inference runs the last stage's modules, not its loss
        shapes_only = last and self._inferring == "no_grad" and self.recorder is not None

        def returned(_m: Any, _a: Any, out: Any) -> None:
            outputs.append(out)
            if shapes_only:
                self.recorder.paused += 1

        handle = w.model.register_forward_hook(returned) if last else None
        try:
            with self._runner._context():
                loss = w.loss(w.model, *args, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
            if shapes_only and outputs:
                self.recorder.paused -= 1
            if not last and self.recorder is not None:
                self.recorder.paused -= 1
            self.active = None
        if self._inferring is not None:
            if last:
                del outputs
                return loss if self._inferring == "grad" else None
            return _first_tensor(self.output)
        if last:
            # the stage's output (the logits) stays in torch's fwd_cache beside the loss
            # computed from it, until the micro-batch's backward has run
            self.last_outputs[(stage, microbatch)] = outputs[-1] if outputs else None
            if self._runner.scaler is not None:
                loss = self._runner.scaler.scale(loss)
            return loss
        output = _first_tensor(self.output)
        if output is None:
            raise VramscopeError(
                f"--pp: block {self.layout.blocks[stage].stop - 1} returned no tensor to send "
                "to the next stage"
            )
        self._gradient_buffers(stage, output)  # torch makes them at the first step
        return output

    def __call__(self) -> None:
        from vramscope.estimate.cuda_device import CUDA
        from vramscope.workload import StepRunner

        w = self.workload
        if self._runner is None:
            self._runner = StepRunner(replace(w, step=None), CUDA)
            self.recorder = _recorder_of(next(w.model.parameters(), None))
            if self._runner.scaler is not None and not self.layout.last(self.layout.stages[-1]):
                raise VramscopeError(
                    "--pp with 16-mixed is not yet supported: a stage before the last computes "
                    "no loss for its GradScaler to scale, and GradScaler refuses to step; use "
                    "bf16-mixed"
                )
        if not self._inferred:
            self._inferred = True
            self._infer_metadata()
        cache: dict[tuple[int, int], Any] = {}
        order = self.layout.traced or self.layout.order
        last_backward = {a.stage: i for i, a in enumerate(order) if a.kind == "B"}
        # GPipe's and 1F1B's step keep the output of their last forward in a local variable
        # until the next forward returns (the interleaved runtime runs each action in a
        # function of its own): the last stage's logits outlive their backward until then
        held_locally = VIRTUAL_STAGES[self.layout.schedule] == 1
        output: Any = None
        # stage -> the gradients of received activations that the step still holds, sent
        sending: dict[int, list[torch.Tensor]] = {}
        for i, action in enumerate(order):
            key = (action.stage, action.microbatch)
            if action.kind == "F":
                with self._no_sync():  # forward_maybe_with_nosync
                    cache[key] = self._forward(*key)
                if held_locally:
                    output = self.last_outputs.get(key, cache[key])
                continue
            out = cache.pop(key)
            self._backward(out, action, last=last_backward[action.stage] == i)
            del out
            self.last_outputs.pop(key, None)
            self._sent(action, sending)
        cache.clear()
        self.last_outputs.clear()
        self._reduce_grads()
        for p in w.model.parameters():  # scale_grads: the losses of all micro-batches summed
            if p.grad is not None:
                p.grad.div_(self.layout.microbatches)
        # the schedule's step returns: its locals (the last output, the last sends) go
        del output
        sending.clear()
        optimizer = w.optimizer
        assert optimizer is not None
        if self._runner.scaler is not None:
            self._runner.scaler.step(optimizer)
            self._runner.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=w.meta.get("zero_grad_set_to_none", True))

    # data parallel inside the stage, as torch's PipelineStage runs it ------------------------

    def _no_sync(self) -> Any:
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()

    def _backward(self, out: Any, action: Action, last: bool) -> None:
        """One micro-batch's backward (``backward_maybe_with_nosync``): DDP all-reduces on
        the stage's last backward only; FSDP2 keeps its parameters gathered and its gradients
        whole, unreduced, from one backward to the next (``set_reshard_after_backward(False)``,
        ``set_requires_gradient_sync(False)``)."""

        def run() -> None:
            if self.layout.last(action.stage):
                out.backward()
            else:
                grads = self.grad_recv[action.stage][action.microbatch]
                torch.autograd.backward(out, grad_tensors=grads)

        if self.ddp is not None:
            if not last:
                with self.ddp.no_sync():
                    run()
                return
            from torch.nn.parallel.distributed import _find_tensors

            self.ddp.reducer.prepare_for_backward(list(_find_tensors(out)))
            run()
            return
        if self.fsdp is not None:
            self.fsdp.set_is_last_backward(False)
            self.fsdp.set_reshard_after_backward(False)
            self.fsdp.set_requires_gradient_sync(False)
        run()

    def _reduce_grads(self) -> None:
        """FSDP2's post-backward after the stage's last backward (``perform_reduce_grad``):
        every group reduce-scatters the gradients it accumulated and reshards."""
        if self.fsdp is None:
            return
        from torch.distributed.fsdp import fully_shard

        root = self.fsdp
        root.set_is_last_backward(True)
        root.set_reshard_after_backward(True)
        root.set_requires_gradient_sync(True)
        state = fully_shard.state(root)
        for each in state._state_ctx.all_states:
            for group in _param_groups_of(each):
                group.post_backward()
        state._root_post_backward_final_callback()


def _param_groups_of(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups (one, or a list in newer torch)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [group] if group is not None else []


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _bytes(tensor: torch.Tensor) -> int:
    return -(-tensor.numel() * tensor.element_size() // 512) * 512
