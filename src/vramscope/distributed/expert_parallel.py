"""Expert parallel: each rank holds 1/N of every mixture-of-experts layer's experts, and the
tokens routed to an expert travel to the rank that holds it and back, all-to-all.

The MoE layers are found by their structure (:func:`find_expert_layers`), in either of the
two forms models store experts in:

* **a list**: an ``nn.ModuleList`` of alike expert modules (the same class, the same
  parameter shapes), as hand-written MoE layers hold them, the layer's own forward calling
  each expert on the tokens routed to it;
* **grouped**: one module whose own parameters all have the experts as their first
  dimension (transformers' ``MixtralExperts``, ``Qwen2MoeExperts``: ``gate_up_proj`` of
  experts × 2·intermediate × hidden), called once with the tokens, each token's chosen
  experts and their weights.

Either way the module holding them has a router beside them: a parameter whose first
dimension is the number of experts (a linear layer to one logit per expert).

Rank ``r`` of ``N`` keeps experts ``r·E/N`` to ``(r+1)·E/N − 1`` (their parameters, and so
their gradients and optimizer state); the others' parameters are not on this rank. What an
expert-parallel forward does then runs with torch's functional all-to-all
(``all_to_all_single_autograd``, whose backward is the reverse exchange) over the fake
process group, so its buffers are traced where the collective allocates them:

* grouped: the rank's token copies (tokens × top-k) gathered in expert order (the dispatch's
  send buffer), exchanged for the tokens its own experts get (the receive buffer: the even
  share times ``--ep-imbalance``), the module's own forward run on those over its local
  experts, the outputs exchanged back (the combine's receive buffer, tokens × top-k rows)
  and summed into each token, weighted;
* a list: each expert call of the layer's own forward is an exchange: a local expert gets
  the tokens every rank routes to it (N × this rank's, times the imbalance) and sends their
  outputs back; a remote expert's call sends this rank's tokens away and receives their
  outputs (no compute here).

Routing is assumed even (each expert gets an equal share of the tokens: the trace's
"spread" assumption for the router's top-k), and the most loaded rank's experts get
``--ep-imbalance`` times the even share: the rank traced is that one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vramscope.contract import single_optimizer
from vramscope.errors import VramscopeError

LIST, GROUPED = "list", "grouped"


@dataclass
class ExpertLayer:
    """One MoE layer's experts as the model holds them."""

    name: str  # the experts' module (the ModuleList, or the grouped module)
    kind: str  # LIST or GROUPED
    experts: int
    module: nn.Module


def _has_router(parent: nn.Module, experts: nn.Module, count: int) -> bool:
    """Whether ``parent`` holds, outside ``experts``, a parameter with a first dimension of
    ``count``: a router's projection to one logit per expert."""
    inside = {id(p) for p in experts.parameters()}
    return any(
        p.dim() >= 1 and p.shape[0] == count and id(p) not in inside for p in parent.parameters()
    )


def _signature(module: nn.Module) -> tuple[Any, ...]:
    return (type(module), tuple((n, tuple(p.shape)) for n, p in module.named_parameters()))


def find_expert_layers(model: nn.Module) -> list[ExpertLayer]:
    """The model's MoE experts (see the module's docstring), outermost names first."""
    found: list[ExpertLayer] = []
    taken: set[int] = set()
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if id(child) in taken:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if isinstance(child, nn.ModuleList) and len(child) >= 2:
                members = list(child)
                first = _signature(members[0])
                alike = first[1] and all(_signature(m) == first for m in members[1:])
                if alike and _has_router(parent, child, len(members)):
                    found.append(ExpertLayer(name, LIST, len(members), child))
                    taken.add(id(child))
                continue
            own = list(child.parameters(recurse=False))
            leading = {p.shape[0] for p in own if p.dim() >= 3}
            if own and len(leading) == 1 and all(p.dim() >= 3 for p in own):
                count = leading.pop()
                if count >= 2 and _has_router(parent, child, count):
                    found.append(ExpertLayer(name, GROUPED, count, child))
                    taken.add(id(child))
    return found


def splits(rows: int, parts: int) -> list[int]:
    """``rows`` divided among ``parts`` ranks as evenly as whole rows allow."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def received_rows(rows: int, ep: int, imbalance: float) -> int:
    """The rows the most loaded rank's experts receive for ``rows`` sent per rank: the even
    share (``rows``: every rank sends as much as it receives) times ``imbalance``."""
    return max(0, math.ceil(rows * imbalance - 1e-9))


@dataclass
class ExpertsApplied:
    """What making a workload expert parallel made, and what its exchanges moved. The
    layers' calls keep this object for their exchanges, so it holds no workload: one kept
    here would keep its optimizer, and with it the rank's parameters from before a strategy
    applied afterwards (FSDP2) sharded them."""

    layers: list[ExpertLayer]
    ep: int
    rank: int
    imbalance: float
    local: dict[str, range] = field(default_factory=dict)  # layer -> its experts on this rank
    recorder: Any = None
    # the traced exchanges: (step, layer, what, bytes of the output on this rank)
    exchanges: list[tuple[int, str, str, int]] = field(default_factory=list)
    expert_parameters: int = 0  # elements of the experts this rank holds
    group: Any = None  # the expert-parallel process group (None: the world)
    model_expert_parameters: int = 0  # of every expert

    def exchange(self, layer: str, what: str, tensor: torch.Tensor, rows_out: int) -> torch.Tensor:
        """``tensor``'s rows sent all-to-all, ``rows_out`` received (autograd's backward is
        the reverse exchange); the output's size noted."""
        from torch.distributed import _functional_collectives as funcol

        group = self.group if self.group is not None else torch.distributed.group.WORLD
        out = funcol.all_to_all_single_autograd(
            tensor.contiguous(),
            splits(rows_out, self.ep),
            splits(tensor.shape[0], self.ep),
            group,
        )
        step = getattr(self.recorder, "step", 0)
        self.exchanges.append((step, layer, what, out.numel() * out.element_size()))
        return out

    def local_modules(self) -> list[nn.Module]:
        """The modules of the experts this rank holds: each local expert of a list, each
        grouped module (its share of the experts): what FSDP2 shards over the ranks that
        hold the same experts."""
        found: list[nn.Module] = []
        for layer in self.layers:
            if layer.kind == LIST:
                found += [m for m in layer.module if not isinstance(m, _RemoteExpert)]
            else:
                found.append(layer.module)
        return found

    def to_dict(self) -> dict[str, Any]:
        kinds = sorted({layer.kind for layer in self.layers})
        first = self.layers[0]
        local = self.local[first.name]
        per_layer: dict[str, int] = {}
        last = max((step for step, *_ in self.exchanges), default=0)
        for step, _, what, size in self.exchanges:
            if step == last and what in ("dispatch", "combine"):
                per_layer[what] = per_layer.get(what, 0) + size
        count = max(1, len(self.layers))
        return {
            "size": self.ep,
            "rank": self.rank,
            "layers": len(self.layers),
            "storage": kinds,
            "experts_per_layer": first.experts,
            "local_experts": f"{local.start}-{local.stop - 1}",
            "local_expert_count": len(local),
            "expert_parameters": self.expert_parameters,
            "model_expert_parameters": self.model_expert_parameters,
            "imbalance": self.imbalance,
            "routing": "assumed even"
            if self.imbalance == 1.0
            else f"the most loaded rank's experts get {self.imbalance:g}× the even share",
            # the last traced step's all-to-all outputs per MoE layer in forward: the
            # tokens this rank's experts receive, and the outputs its tokens get back
            "exchange_bytes_per_layer": {k: v // count for k, v in sorted(per_layer.items())},
        }


class _RemoteExpert(nn.Module):
    """An expert of another rank in a list: its call sends this rank's tokens away and
    receives their outputs; nothing is computed here and its parameters are not here."""

    def __init__(self, inner: nn.Module, owner: ExpertsApplied, layer: str) -> None:
        super().__init__()
        object.__setattr__(self, "_inner", inner)  # not a submodule: not this rank's
        object.__setattr__(self, "_owner", owner)
        self._layer = layer

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        from vramscope.distributed.pipeline import _paused, _recorder_of

        # the output's width and dtype, from the expert itself on no rows, unrecorded
        with _paused(_recorder_of(x)), torch.no_grad():
            probe = self._inner(x[:0], *args, **kwargs)
        return _Remote.apply(x, probe, self._owner, self._layer)


class _Remote(torch.autograd.Function):
    """The exchanges of a remote expert's call: forward, its outputs for this rank's tokens
    come back (the combine); backward, their gradients go and the inputs' come back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, probe: torch.Tensor, owner: Any, layer: str) -> Any:
        ctx.owner, ctx.layer, ctx.rows = owner, layer, x.shape[0]
        ctx.empty = x.new_empty((0, *x.shape[1:]))
        # this rank computes none of them: it sends no outputs and receives its own
        return owner.exchange(layer, "combine", probe.detach(), x.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        owner = ctx.owner
        owner.exchange(ctx.layer, "combine backward", grad, 0)  # sent to the expert's rank
        back = owner.exchange(ctx.layer, "dispatch backward", ctx.empty, ctx.rows)
        return back, None, None, None


def _local_list_forward(expert: nn.Module, owner: ExpertsApplied, layer: str) -> Any:
    """A local expert's call in a list: it receives the tokens every rank routes to it."""
    forward = expert.forward

    def call(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        rows = received_rows(x.shape[0] * owner.ep, owner.ep, owner.imbalance)
        received = owner.exchange(layer, "dispatch", x, rows)
        out = forward(received, *args, **kwargs)
        return owner.exchange(layer, "combine", out, x.shape[0])

    return call


def _grouped_forward(module: nn.Module, owner: ExpertsApplied, layer: ExpertLayer) -> Any:
    """A grouped experts module's call (hidden states, each token's top-k experts and
    weights) as an expert-parallel layer runs it (see the module's docstring)."""
    forward = module.forward
    local = len(owner.local[layer.name])

    def call(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: Any, *a: Any) -> Any:
        if not isinstance(top_k_index, torch.Tensor) or top_k_index.dim() != 2:
            raise VramscopeError(
                f"--ep: {type(module).__name__} is called without (hidden states, top-k "
                "expert indices, top-k weights): its experts cannot be exchanged"
            )
        tokens, k = top_k_index.shape
        order = top_k_index.reshape(-1).argsort()  # the token copies in expert order
        source = torch.div(order, k, rounding_mode="floor")
        send = hidden.index_select(0, source)
        rows = received_rows(tokens * k, owner.ep, owner.imbalance)
        received = owner.exchange(layer.name, "dispatch", send, rows)
        # the received tokens arrive grouped by expert: spread evenly over the local ones
        mine = (torch.arange(rows, device=hidden.device) * local // max(rows, 1)).unsqueeze(1)
        weights = torch.ones((rows, 1), dtype=top_k_weights.dtype, device=hidden.device)
        out = forward(received, mine, weights, *a)
        back = owner.exchange(layer.name, "combine", out, tokens * k)
        scale = top_k_weights.reshape(-1).index_select(0, order).unsqueeze(1)
        combined = torch.zeros(
            (tokens, back.shape[-1]), dtype=back.dtype, device=hidden.device
        ).index_add(0, source, back * scale.to(back.dtype))
        return combined

    return call


def apply_expert_parallel(
    workload: Any,
    ep: int,
    rank: int,
    imbalance: float,
    device: torch.device,
    group: Any = None,
) -> tuple[Any, ExpertsApplied]:
    """Make a built ``workload`` rank ``rank`` of an ``ep``-rank expert-parallel group
    (``group``; None: the world): each MoE layer keeps its share of the experts, its calls
    exchange tokens all-to-all; the optimizer is made again over the parameters the rank
    holds. Returns the new workload and what was made."""
    from dataclasses import replace

    from vramscope.distributed.optim import constructor_defaults

    del device  # the exchanges run on the tensors' own device
    if workload.step is not None:
        raise VramscopeError(
            "--ep: the workload has its own step function; expert parallel runs the standard step"
        )
    model = workload.model
    layers = find_expert_layers(model)
    if not layers:
        raise VramscopeError(
            f"--ep: {type(model).__name__} has no mixture-of-experts layer that vramscope "
            "finds (an nn.ModuleList of alike experts, or a module of expert-stacked "
            "parameters, beside a router with one output per expert)"
        )
    for layer in layers:
        if layer.experts % ep:
            raise VramscopeError(
                f"--ep {ep} does not divide the {layer.experts} experts of {layer.name}: each "
                "expert-parallel rank holds the same number of whole experts"
            )
    applied = ExpertsApplied(layers, ep, rank, imbalance, group=group)
    renamed: dict[int, nn.Parameter] = {}  # a grouped module's parameters: their share
    for layer in layers:
        share = layer.experts // ep
        local = range(rank * share, (rank + 1) * share)
        applied.local[layer.name] = local
        applied.model_expert_parameters += sum(p.numel() for p in layer.module.parameters())
        if layer.kind == LIST:
            container = layer.module
            assert isinstance(container, nn.ModuleList)
            for index in range(len(container)):
                expert = container[index]
                if index in local:
                    expert.forward = _local_list_forward(expert, applied, layer.name)
                    applied.expert_parameters += sum(p.numel() for p in expert.parameters())
                else:
                    container[index] = _RemoteExpert(expert, applied, layer.name)
        else:
            module = layer.module
            for key, param in list(module.named_parameters(recurse=False)):
                part = nn.Parameter(
                    param.detach()[local.start : local.stop].clone(),
                    requires_grad=param.requires_grad,
                )
                renamed[id(param)] = part
                module.register_parameter(key, part)
                applied.expert_parameters += part.numel()
            if isinstance(getattr(module, "num_experts", None), int):
                module.num_experts = share
            module.forward = _grouped_forward(module, applied, layer)
    kept = {id(p) for p in model.parameters()}
    optimizer = single_optimizer(workload, "expert parallelism")
    if optimizer is not None:
        groups = []
        for group in optimizer.param_groups:
            params = [renamed.get(id(p), p) for p in group["params"]]
            params = [p for p in params if id(p) in kept]
            if params:
                groups.append(
                    {**{k: v for k, v in group.items() if k != "params"}, "params": params}
                )
        optimizer = type(optimizer)(groups, **constructor_defaults(optimizer))
    return replace(workload, model=model, optimizer=optimizer), applied
