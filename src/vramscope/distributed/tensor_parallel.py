"""Tensor and sequence parallel, applied with torch's ``parallelize_module``: the workload's
own plan, or a default plan for Llama-like and GPT-like transformer blocks.

A plan maps module names (or ``fnmatch`` patterns, as ``parallelize_module`` takes them) to
torch's parallel styles. The default plan is the Megatron layout, in torch's objects:

* in each repeated block (the transformer layers), the attention's query, key and value
  projections ``ColwiseParallel`` (each rank computes its share of the heads), its output
  projection ``RowwiseParallel`` (a partial sum, all-reduced); the MLP's input projections
  (``gate_proj`` and ``up_proj``, or ``fc1``/``c_fc``/``fc_in``) ``ColwiseParallel``, its
  output projection ``RowwiseParallel``;
* the token embedding ``RowwiseParallel`` (the vocabulary split over the ranks), the output
  head ``ColwiseParallel`` with its logits gathered (``output_layouts=Replicate()``: any
  loss function takes them), re-tied to the embedding when the model ties them;
* with sequence parallel, the norms ``SequenceParallel`` (the activations between the
  attention and the MLP split along the sequence), the attention and MLP inputs gathered
  (``PrepareModuleInput``), their outputs reduce-scattered (``output_layouts=Shard(1)``);
* every other module that holds parameters :class:`Replicated`: whole on every rank, its
  parameters replicated DTensors, so that the optimizer's foreach step and FSDP2 see
  DTensors only (torch's foreach ops refuse a mix of tensors and DTensors, and FSDP2 a mix
  of meshes).

An attention that projects query, key and value with one fused linear layer (``qkv``,
``c_attn``) is left replicated: ``ColwiseParallel`` splits its output rows in order, which
gives a rank some query rows and some key rows, not whole heads. Layers that are not
``nn.Linear`` (GPT-2's ``Conv1D``) have no torch style; a model with none of the known
layouts has no default plan and the workload gives its own (``Workload.tensor_parallel_plan``).

Sequence parallel needs the hidden states to pass from the embedding through the blocks as
one tensor, split along the sequence. transformers' models compute the attention mask and
the rotary positions from the embedding's output at the model level, which would then be
the local part: for them the default plan has sequence parallel off (the report says so),
and ``--sequence-parallel`` asks for it anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vramscope.errors import VramscopeError

# the projections of an attention and an MLP, by the names models give them
QUERY = ("q_proj", "query", "wq", "q_lin", "q")
KEY = ("k_proj", "key", "wk", "k_lin", "k")
VALUE = ("v_proj", "value", "wv", "v_lin", "v")
ATTENTION_OUT = ("o_proj", "out_proj", "wo", "out_lin", "dense", "c_proj", "proj", "o")
FUSED_QKV = ("qkv", "qkv_proj", "c_attn", "query_key_value", "Wqkv", "in_proj", "W_pack")
GATE = ("gate_proj", "w1", "wi_0", "gate")
UP = ("up_proj", "w3", "wi_1", "fc1", "c_fc", "fc_in", "dense_h_to_4h", "lin1", "wi", "up")
DOWN = ("down_proj", "w2", "wo", "fc2", "c_proj", "fc_out", "dense_4h_to_h", "lin2", "down")
NORMS = (nn.LayerNorm, nn.RMSNorm)


@dataclass
class TensorParallelLayout:
    """A tensor-parallel plan and what it says about the model."""

    styles: dict[str, Any]  # module name or pattern -> torch ParallelStyle
    source: str  # "the workload's plan" or "the default plan for Llama-like blocks"
    family: str | None  # llama, gpt, or None for the workload's own plan
    sequence_parallel: bool
    sharded: list[str] = field(default_factory=list)  # modules split over the group
    replicated: list[str] = field(default_factory=list)  # modules whole on every rank
    notes: list[str] = field(default_factory=list)
    # each parameter after the plan: its global shape and the dimension the group splits
    # (None: whole on every rank), to know what each rank of the group holds
    parameters: dict[str, tuple[tuple[int, ...], int | None]] = field(default_factory=dict)
    group_size: int = 1

    def local_shapes(self, coordinate: int) -> tuple[tuple[int, ...], ...]:
        """The shapes of the parameters the rank at ``coordinate`` of the group holds (as
        DTensor splits a dimension: ``torch.chunk``'s sizes, the last ranks smaller)."""
        shapes = []
        for shape, dim in self.parameters.values():
            if dim is None:
                shapes.append(shape)
                continue
            size = shape[dim]
            chunk = -(-size // self.group_size)
            local = max(0, min(chunk, size - coordinate * chunk))
            shapes.append((*shape[:dim], local, *shape[dim + 1 :]))
        return tuple(shapes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "family": self.family,
            "sequence_parallel": self.sequence_parallel,
            "styles": _collapsed(self.styles),
            "sharded_modules": len(self.sharded),
            "replicated_modules": len(self.replicated),
            "notes": list(self.notes),
        }


def _collapsed(styles: dict[str, Any]) -> dict[str, str]:
    """Each style once per position in a block: ``layers.*.mlp.up_proj`` for all layers
    (the first index in a name is the block's)."""
    import re

    shown: dict[str, str] = {}
    for name, style in styles.items():
        key = re.sub(r"(?<=\.)\d+(?=\.)", "*", name, count=1)
        shown.setdefault(key, _style_name(style))
    return shown


def _style_name(style: Any) -> str:
    name = type(style).__name__
    layouts = []
    for key in ("input_layouts", "output_layouts"):
        value = getattr(style, key, None)
        if value is not None:
            shown = value if isinstance(value, tuple) else (value,)
            layouts.append(f"{key.split('_')[0]} {', '.join(str(v) for v in shown)}")
    return f"{name} ({'; '.join(layouts)})" if layouts else name


# ---- a module kept whole --------------------------------------------------------------------


def replicated_style() -> Any:
    """:class:`Replicated`, made when torch.distributed.tensor is importable."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor import distribute_tensor as distribute
    from torch.distributed.tensor.parallel import ParallelStyle

    class Replicated(ParallelStyle):
        """A module whole on every rank of the group: its parameters replicated DTensors,
        its inputs made DTensors (replicated, no communication) and its outputs plain
        tensors again."""

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            def partition(name: str, sub: nn.Module, mesh: Any) -> None:
                for key, param in list(sub.named_parameters(recurse=False)):
                    if isinstance(param, DTensor):
                        continue
                    whole = nn.Parameter(
                        distribute(param, mesh, [Replicate()]), requires_grad=param.requires_grad
                    )
                    sub.register_parameter(key, whole)

            def inputs(sub: nn.Module, args: Any, mesh: Any) -> Any:
                return tuple(
                    DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                    if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
                    else a
                    for a in args
                )

            def outputs(sub: nn.Module, out: Any, mesh: Any) -> Any:
                if isinstance(out, DTensor):
                    return out.to_local()
                if isinstance(out, tuple):
                    return tuple(o.to_local() if isinstance(o, DTensor) else o for o in out)
                return out

            return distribute_module(module, device_mesh, partition, inputs, outputs)

    return Replicated()


# ---- the default plan -----------------------------------------------------------------------


def _child(module: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, nn.Module) and name in module._modules:
            return name, found
    return None


def _linear(module: nn.Module, names: tuple[str, ...]) -> str | None:
    found = _child(module, names)
    return found[0] if found is not None and isinstance(found[1], nn.Linear) else None


def _block_layout(block: nn.Module) -> tuple[dict[str, str], list[str], str | None, list[str]]:
    """Within one block: {relative name: colwise|rowwise}, the attention and MLP modules (to
    gather their input under sequence parallel), the family, and notes."""
    styles: dict[str, str] = {}
    regions: list[str] = []
    notes: list[str] = []
    family = None
    attention = mlp = None
    for name, module in block.named_modules():
        prefix = f"{name}." if name else ""
        if attention is None:
            q, k, v = _linear(module, QUERY), _linear(module, KEY), _linear(module, VALUE)
            out = _linear(module, ATTENTION_OUT)
            if q and k and v and out:
                attention = name
                styles.update({prefix + q: "colwise", prefix + k: "colwise"})
                styles.update({prefix + v: "colwise", prefix + out: "rowwise"})
                continue
            fused = _child(module, FUSED_QKV)
            if fused is not None:
                attention = name
                notes.append(
                    f"attention left whole on every rank: its fused query/key/value "
                    f"projection '{prefix}{fused[0]}' cannot be split by heads with "
                    "ColwiseParallel (its rows are the queries, then the keys, then the "
                    "values); give the workload a tensor_parallel_plan to split it"
                )
                continue
        if mlp is None and name != attention and not name.startswith(f"{attention}."):
            gate, up, down = _linear(module, GATE), _linear(module, UP), _linear(module, DOWN)
            if gate and up and down and len({gate, up, down}) == 3:
                mlp, family = name, "llama"
                styles.update({prefix + gate: "colwise", prefix + up: "colwise"})
                styles[prefix + down] = "rowwise"
                continue
            if up and down and up != down:
                mlp, family = name, family or "gpt"
                styles.update({prefix + up: "colwise", prefix + down: "rowwise"})
                continue
            linears = [(n, m) for n, m in module.named_children() if isinstance(m, nn.Linear)]
            if isinstance(module, nn.Sequential) and len(linears) == 2 and module is not block:
                mlp, family = name, family or "gpt"
                styles.update({prefix + linears[0][0]: "colwise"})
                styles[prefix + linears[1][0]] = "rowwise"
    # the attention and the MLP whose inputs sequence parallel gathers: both split, or none
    split = [
        r
        for r in (attention, mlp)
        if r and any(k.startswith(f"{r}.") and v == "colwise" for k, v in styles.items())
    ]
    regions = split if len(split) == 2 else []
    return styles, regions, family or "gpt", notes


def default_plan(model: nn.Module, sequence_parallel: bool | None = None) -> TensorParallelLayout:
    """The default tensor-parallel plan for ``model`` (see the module's docstring);
    ``sequence_parallel`` None: on where the model allows it. Raise VramscopeError when the
    model has no layout the default plan knows."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    from vramscope.fit.strategies import repeated_blocks

    blocks = repeated_blocks(model)
    names = {id(m): n for n, m in model.named_modules()}
    if not blocks:
        raise VramscopeError(
            f"no default tensor-parallel plan for {type(model).__name__}: it has no repeated "
            "blocks (transformer layers); give the workload a tensor_parallel_plan "
            "(module names to torch ParallelStyles)"
        )
    layout, regions, family, notes = _block_layout(blocks[0])
    if not any(v == "colwise" for v in layout.values()):
        raise VramscopeError(
            f"no default tensor-parallel plan for {type(model).__name__}: its blocks "
            f"({type(blocks[0]).__name__}) have no attention with nn.Linear query, key and "
            "value projections and no MLP of two or three nn.Linear layers that the default "
            "plan knows; give the workload a tensor_parallel_plan"
        )
    block_names = [names[id(b)] for b in blocks]
    embedding, head, final_norm, others = _outside_blocks(model, blocks, names)
    from_transformers = type(model).__module__.startswith("transformers.")
    sp_possible = not from_transformers and embedding is not None and not others and bool(regions)
    sp_notes = []
    if sequence_parallel is None:
        sequence_parallel = sp_possible
        if not sp_possible:
            why = (
                "transformers computes the attention mask and rotary positions from the "
                "embedding's output, which sequence parallel would split"
                if from_transformers
                else "the default plan splits the sequence only between a token embedding "
                "and blocks whose attention and MLP are both split"
            )
            sp_notes.append(f"sequence parallel off: {why} (--sequence-parallel asks for it)")
    seq = bool(sequence_parallel)
    if seq and not regions:
        raise VramscopeError(
            f"sequence parallel needs blocks whose attention and MLP are both split; the "
            f"default plan splits only part of {type(blocks[0]).__name__}: use "
            "--no-sequence-parallel or give the workload a tensor_parallel_plan"
        )
    styles: dict[str, Any] = {}
    replicated: list[str] = []
    if embedding is not None:
        styles[embedding] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if seq else Replicate()
        )
    for block in block_names:
        for rel, kind in layout.items():
            full = f"{block}.{rel}"
            if kind == "colwise":
                styles[full] = ColwiseParallel()
            else:
                styles[full] = RowwiseParallel(output_layouts=Shard(1) if seq else Replicate())
        if seq:
            for region in regions:
                styles[f"{block}.{region}"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
    if final_norm is not None and seq:
        styles[final_norm] = SequenceParallel()
    if head is not None:
        styles[head] = ColwiseParallel(
            input_layouts=Shard(1) if seq else Replicate(), output_layouts=Replicate()
        )
    # every other module with parameters of its own: the block norms (sequence parallel, or
    # whole), and what the default plan does not split
    covered = set(styles)
    for name, module in model.named_modules():
        if name in covered or not any(True for _ in module.parameters(recurse=False)):
            continue
        if any(name.startswith(f"{c}.") for c in covered):
            continue
        in_block = any(name.startswith(f"{b}.") for b in block_names)
        if seq and in_block and isinstance(module, NORMS):
            styles[name] = SequenceParallel()
        else:
            styles[name] = replicated_style()
            replicated.append(name)
    sharded = [n for n, s in styles.items() if isinstance(s, (ColwiseParallel, RowwiseParallel))]
    label = "Llama-like" if family == "llama" else "GPT-like"
    return TensorParallelLayout(
        styles=styles,
        source=f"the default plan for {label} blocks",
        family=family,
        sequence_parallel=seq,
        sharded=sharded,
        replicated=replicated,
        notes=notes + sp_notes,
    )


def _outside_blocks(
    model: nn.Module, blocks: list[nn.Module], names: dict[int, str]
) -> tuple[str | None, str | None, str | None, list[str]]:
    """The token embedding, the output head, the final norm, and any other module with
    parameters outside the blocks (a position embedding), by name."""
    inside = {id(m) for b in blocks for m in b.modules()}
    embeddings, linears, norms, others = [], [], [], []
    for name, module in model.named_modules():
        if id(module) in inside or not any(True for _ in module.parameters(recurse=False)):
            continue
        if isinstance(module, nn.Embedding):
            embeddings.append((name, module))
        elif isinstance(module, nn.Linear):
            linears.append((name, module))
        elif isinstance(module, NORMS):
            norms.append(name)
        else:
            others.append(name)
    embedding = head = None
    if embeddings:  # the largest: the tokens (a position embedding is smaller)
        embedding_name, module = max(embeddings, key=lambda e: e[1].weight.numel())
        embedding = embedding_name
        others += [n for n, _ in embeddings if n != embedding_name]
        vocab = module.num_embeddings
        heads = [(n, m) for n, m in linears if m.out_features == vocab]
        if heads:
            head = heads[-1][0]
    others += [n for n, _ in linears if n != head]
    final_norm = norms[-1] if norms else None
    others += [n for n in norms if n != final_norm]
    return embedding, head, final_norm, others


# ---- applying a plan ------------------------------------------------------------------------


def plan_layout(
    model: nn.Module, plan: dict[str, Any] | None, sequence_parallel: bool | None = None
) -> TensorParallelLayout:
    """The layout of the workload's ``plan``, or of the default plan for ``model``."""
    if plan is not None:
        if not isinstance(plan, dict) or not plan:
            raise VramscopeError(
                "Workload.tensor_parallel_plan must be a dict of module names to torch "
                f"ParallelStyles, not {type(plan).__name__}"
            )
        layout = TensorParallelLayout(
            styles=dict(plan),
            source="the workload's plan",
            family=None,
            sequence_parallel=any(type(s).__name__ == "SequenceParallel" for s in plan.values()),
            sharded=[n for n, s in plan.items() if "wiseParallel" in type(s).__name__],
        )
    else:
        layout = default_plan(model, sequence_parallel)
    return layout


def kept_to(layout: TensorParallelLayout, model: nn.Module) -> TensorParallelLayout:
    """``layout`` (worked out on a whole model) kept to the modules ``model`` still holds:
    a pipeline stage's. Patterns (``layers.*.mlp``) stay; ``parallelize_module`` applies
    them to what they match."""
    from dataclasses import replace

    # another stage's module stands in the stage's model as a placeholder (``other_stage``)
    present = {n for n, m in model.named_modules() if not getattr(m, "other_stage", False)}

    def here(name: str) -> bool:
        return name in present or any(c in name for c in "*?[")

    return replace(
        layout,
        styles={n: style for n, style in layout.styles.items() if here(n)},
        sharded=[n for n in layout.sharded if here(n)],
        replicated=[n for n in layout.replicated if here(n)],
    )


def apply_tensor_parallel(
    model: nn.Module,
    mesh: Any,
    plan: dict[str, Any] | None,
    sequence_parallel: bool | None = None,
    layout: TensorParallelLayout | None = None,
) -> TensorParallelLayout:
    """Apply the workload's ``plan`` (or the default plan; or ``layout``, worked out
    already) to ``model`` on the tensor-parallel ``mesh`` with ``parallelize_module``; tied
    parameters that the plan splits alike are tied again. Return the layout applied."""
    from torch.distributed.tensor.parallel import parallelize_module

    if layout is None:
        layout = plan_layout(model, plan, sequence_parallel)
    tied = _tied(model)
    try:
        parallelize_module(model, mesh, layout.styles)
    except (ValueError, NotImplementedError, RuntimeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VramscopeError(f"parallelize_module refused {layout.source}: {first}") from None
    _tie_again(model, tied, layout)
    layout.group_size = mesh.size()
    layout.parameters = _split_dimensions(model)
    return layout


def _split_dimensions(model: nn.Module) -> dict[str, tuple[tuple[int, ...], int | None]]:
    from torch.distributed.tensor import DTensor, Shard

    found: dict[str, tuple[tuple[int, ...], int | None]] = {}
    for name, param in model.named_parameters():
        dim = None
        if isinstance(param, DTensor):
            for placement in param.placements:
                if isinstance(placement, Shard):
                    dim = placement.dim % max(param.dim(), 1)
        found[name] = (tuple(param.shape), dim)
    return found


def _tied(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Parameters shared by more than one module: for each, the (module, name) holding it."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, name))
    return [h for h in holders.values() if len(h) > 1]


def _tie_again(
    model: nn.Module, tied: list[list[tuple[nn.Module, str]]], layout: TensorParallelLayout
) -> None:
    """``parallelize_module`` makes a new parameter for each module it splits: a tied
    parameter (an output head that shares the token embedding) becomes two. Where both are
    split alike, the first is given to the others again, as the model ties them."""
    from torch.distributed.tensor import DTensor

    for holders in tied:
        first_module, first_name = holders[0]
        first = getattr(first_module, first_name)
        for module, name in holders[1:]:
            other = getattr(module, name)
            if other is first:
                continue
            same = (
                isinstance(first, DTensor)
                and isinstance(other, DTensor)
                and first.placements == other.placements
                and first.shape == other.shape
            )
            if not same:
                raise VramscopeError(
                    f"{layout.source} splits a tied parameter in two ways ("
                    f"{type(first_module).__name__}.{first_name} and "
                    f"{type(module).__name__}.{name}); give a plan that splits both alike"
                )
            setattr(module, name, first)
