"""Values a step reads under an estimate: real where the step has them, the bound that needs
the most memory where it does not (``vramscope.estimate.scalars``).

Every workload here is real code traced with fake tensors on this CPU; the sizes asserted are
computed by hand from the workload (a 4-byte float32 element, the caching allocator's
512-byte rounding).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vramscope.errors import VramscopeError
from vramscope.estimate.estimator import estimate
from vramscope.estimate.scalars import assumed_indices

WORKLOADS = """
import torch, vramscope

WIDTH = 256

class Experts(torch.nn.Module):
    '''A mixture-of-experts layer written the way tutorials write it: route each token
    to its top-k experts, then loop over the experts, each on the tokens routed to it.'''
    def __init__(self, experts=8, k=2, capacity=None):
        super().__init__()
        self.router = torch.nn.Linear(WIDTH, experts)
        self.up = torch.nn.ModuleList(torch.nn.Linear(WIDTH, 8 * WIDTH) for _ in range(experts))
        self.down = torch.nn.ModuleList(torch.nn.Linear(8 * WIDTH, WIDTH) for _ in range(experts))
        self.k, self.capacity = k, capacity

    def forward(self, x):
        weights, chosen = self.router(x).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(x)
        for e, (up, down) in enumerate(zip(self.up, self.down)):
            token, slot = torch.where(chosen == e)
            if self.capacity is not None:
                token, slot = token[: self.capacity], slot[: self.capacity]
            if token.numel() == 0:
                continue
            y = down(torch.relu(up(x[token]))) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return out

def _workload(model, batch, loss):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return vramscope.Workload(model=model, optimizer=opt, batch=batch, loss=loss)

def moe(batch_size, device):
    model = Experts().to(device)
    return _workload(model, lambda: torch.randn(batch_size, WIDTH, device=device),
                     lambda m, x: m(x).square().mean())

def moe_with_capacity(batch_size, device):
    # each expert takes at most a quarter of the tokens: routing every token to the same
    # experts drops most of them, spreading them evenly keeps them all
    model = Experts(capacity=batch_size // 4).to(device)
    return _workload(model, lambda: torch.randn(batch_size, WIDTH, device=device),
                     lambda m, x: m(x).square().mean())

def packed_sequences(batch_size, device):
    # lengths the batch states: 1, 2, ... tokens; packed into one (sum, 1 MiB) buffer
    model = torch.nn.Linear(1024, 256).to(device)
    def batch():
        lengths = torch.arange(1, batch_size + 1, device=device)
        return (lengths,)
    def loss(m, lengths):
        rows = torch.repeat_interleave(torch.arange(batch_size, device=device), lengths)
        x = torch.ones(rows.numel(), 1024, device=device)
        return m(x).sum()
    return _workload(model, batch, loss)

def confident_tokens(batch_size, device):
    # which tokens pass a threshold depends on the activations: unknown to an estimate
    model = torch.nn.Linear(1024, 1024).to(device)
    def infer(m, x):
        y = m(x)
        keep = y.amax(-1) > 0.5
        return m(y[keep])
    return vramscope.Workload(model=model, batch=lambda: (torch.randn(batch_size, 1024,
                              device=device),), loss=infer)

class LayerDrop(torch.nn.Module):
    '''Layers skipped at random in training, as transformers' speech encoders write
    LayerDrop: ``torch.rand([]) < layerdrop`` skips the layer.'''
    def __init__(self, layerdrop, draw="rand"):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(4))
        self.head = torch.nn.Linear(1024, 16)
        self.layerdrop, self.draw = layerdrop, draw

    def forward(self, x):
        for layer in self.layers:
            if self.draw == "rand":
                p = torch.rand([])
            elif self.draw == "rand_like":
                p = torch.rand_like(x[0, 0])
            else:
                p = torch.empty(()).uniform_(0.0, 1.0)
            if self.training and p < self.layerdrop:
                continue
            x = torch.relu(layer(x))
        return self.head(x)

def _layer_drop(batch_size, device, layerdrop, draw="rand"):
    model = LayerDrop(layerdrop, draw).to(device)
    return _workload(model, lambda: (torch.randn(batch_size, 1024, device=device),),
                     lambda m, x: m(x).square().mean())

def layer_drop(batch_size, device):
    return _layer_drop(batch_size, device, 0.5)

def layer_drop_like(batch_size, device):
    return _layer_drop(batch_size, device, 0.5, "rand_like")

def layer_drop_uniform(batch_size, device):
    return _layer_drop(batch_size, device, 0.5, "uniform_")

def every_layer(batch_size, device):
    return _layer_drop(batch_size, device, 0.0)

def no_layer(batch_size, device):
    return _layer_drop(batch_size, device, 1.0)

class RandomAugment(torch.nn.Module):
    '''A random augmentation, as torchvision's v2 transforms write it: applied when
    ``torch.rand(1) < p`` (here the batch and its mirror image, twice the activations).'''
    def __init__(self, p):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                          torch.nn.Linear(1024, 16))
        self.p = p

    def forward(self, x):
        if self.training and torch.rand(1) < self.p:
            x = torch.cat([x, x.flip(1)])
        return self.layers(x)

def _augment(batch_size, device, p):
    model = RandomAugment(p).to(device)
    return _workload(model, lambda: (torch.randn(batch_size, 1024, device=device),),
                     lambda m, x: m(x).square().mean())

def augment_half(batch_size, device):
    return _augment(batch_size, device, 0.5)

def augment_always(batch_size, device):
    return _augment(batch_size, device, 1.0)

def augment_never(batch_size, device):
    return _augment(batch_size, device, 0.0)

def random_rows(batch_size, device):
    # a batch of a random number of rows, drawn in the batch (as packed lengths are)
    model = torch.nn.Linear(1024, 1024).to(device)
    def batch():
        rows = int(torch.randint(batch_size, 8 * batch_size, (1,), device=device).item())
        return (torch.randn(rows, 1024, device=device),)
    return _workload(model, batch, lambda m, x: m(x).square().mean())

class PackedLstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 64)
        self.lstm = torch.nn.LSTM(64, 128, batch_first=True)

    def forward(self, ids, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            self.embed(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return h[-1]

def _packed_lstm(batch_size, device, lengths):
    model = PackedLstm().to(device)
    def batch():
        return torch.randint(0, 1000, (batch_size, 200), device=device), lengths()
    return _workload(model, batch, lambda m, ids, n: m(ids, n).square().mean())

def packed_drawn_lengths(batch_size, device):
    # lengths drawn in every step between 10 and 200 tokens (the way a data loader's
    # random crops come out)
    return _packed_lstm(batch_size, device,
                        lambda: torch.randint(10, 201, (batch_size,), device=device))

def packed_longest_lengths(batch_size, device):
    return _packed_lstm(batch_size, device,
                        lambda: torch.full((batch_size,), 200, device=device))

def ids_read_for_a_branch(batch_size, device):
    # ids a step reads for a branch only (transformers' padding warning): not a size
    model = torch.nn.Embedding(1000, 256).to(device)
    def loss(m, ids):
        if (ids == 0).any():
            ids = ids.clamp(min=1)
        return m(ids).square().mean()
    return _workload(model, lambda: (torch.randint(0, 1000, (batch_size, 64), device=device),),
                     loss)

def _repeated_rows(batch_size, device, counts):
    # each of the batch's items repeated as many times as its count (a ragged batch)
    model = torch.nn.Linear(256, 256).to(device)
    def loss(m, n):
        rows = torch.repeat_interleave(torch.arange(n.numel(), device=device), n)
        return m(torch.ones(rows.numel(), 256, device=device)).sum()
    return _workload(model, lambda: (counts(),), loss)

def counts_random_(batch_size, device):
    return _repeated_rows(batch_size, device, lambda: torch.empty(
        batch_size, dtype=torch.long, device=device).random_(1, 65))

def counts_randint_like(batch_size, device):
    return _repeated_rows(batch_size, device, lambda: torch.randint_like(
        torch.empty(batch_size, dtype=torch.long, device=device), 1, 65))

def counts_randint(batch_size, device):
    return _repeated_rows(batch_size, device, lambda: torch.randint(
        1, 65, (batch_size,), device=device))

def counts_at_most(batch_size, device):
    return _repeated_rows(batch_size, device, lambda: torch.full(
        (batch_size,), 64, device=device))

def counts_of_unknown_values(batch_size, device):
    model = torch.nn.Linear(64, 64).to(device)
    def loss(m, x):
        y = m(x)
        counts = torch.bincount((y * 10).long().clamp(min=0).flatten())
        return y.sum() + counts.float().sum()
    return _workload(model, lambda: (torch.randn(batch_size, 64, device=device),), loss)
"""


@pytest.fixture(scope="module")
def workloads(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("values") / "value_workloads.py"
    path.write_text(WORKLOADS)
    return path


def test_indices_of_unknown_values_are_assumed_the_same_for_every_row_or_spread():
    source, index = torch.empty(6, 8), torch.empty(6, 2, dtype=torch.long)
    same = assumed_indices(source, index, -1, permutes=False, spread=False)
    spread = assumed_indices(source, index, -1, permutes=False, spread=True)
    # heavy: every one of the 8 positions picked once, then the same two again and again
    assert same.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1], [0, 1]]
    assert spread.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1], [2, 3]]
    # argmax over the last dimension, reduced away: one pick per row
    row = torch.empty(12, dtype=torch.long)
    assert assumed_indices(torch.empty(12, 8), row, -1, False, True).tolist() == [
        *range(8),
        *range(4),
    ]
    assert assumed_indices(torch.empty(12, 8), row, -1, False, False).tolist() == [
        *range(8),
        *[0] * 4,
    ]
    # sort: the identity
    order = assumed_indices(source, torch.empty(6, 8, dtype=torch.long), -1, True, False)
    assert order.tolist() == [list(range(8))] * 6


def test_tokens_routed_to_the_same_experts_is_the_estimate_and_spread_routing_is_said(
    workloads,
):
    report = estimate(f"{workloads}:moe", 512)
    extra = report.extra["estimate"]
    assert extra["assumption_variant"] == "heavy"
    (routing,) = extra["assumptions"]
    assert routing["op"] == "topk" and "value_workloads.py" in routing["where"]
    # nearly every token on experts 0 and 1: each holds about (512, 2048) float32
    # activations of 4 MiB, against a quarter of that when the picks spread over 8 experts
    assert extra["alternative_peak"]["allocated_bytes"] < report.peak.allocated_bytes
    assert extra["assumption_bytes"]["allocated_bytes"] >= 2 * 512 * 2048 * 4
    finding = next(f for f in report.findings if f.kind == "assumption")
    assert "topk" in finding.message and "depends on it" in finding.message


def test_the_larger_of_the_two_routings_is_kept_when_spreading_needs_more(workloads):
    report = estimate(f"{workloads}:moe_with_capacity", 4096)
    extra = report.extra["estimate"]
    # same experts: two experts take their 1,024 tokens, the six others one each; spread:
    # all 8 take 1,024 (8 MiB of activations each)
    assert extra["assumption_variant"] == "light"
    assert extra["alternative_peak"]["allocated_bytes"] < report.peak.allocated_bytes


def test_sizes_from_the_batch_are_exact(workloads):
    report = estimate(f"{workloads}:packed_sequences", 8)
    # lengths 1..8 pack 36 rows of 1024 float32: 144 KiB, read from the batch's values
    assert report.extra["estimate"].get("assumptions") is None
    assert report.extra["estimate"]["data_dependent"] == []
    small = estimate(f"{workloads}:packed_sequences", 4)  # 10 rows
    grown = report.peak.allocated_bytes - small.peak.allocated_bytes
    assert grown >= (36 - 10) * 1024 * 4


def test_a_selection_on_activations_keeps_every_element(workloads):
    report = estimate(f"{workloads}:confident_tokens", 4096)
    extra = report.extra["estimate"]
    assert extra["assumption_variant"] == "heavy"
    (selection,) = extra["assumptions"]
    assert selection["kind"] == "selection" and "every element selected" in selection["assumed"]
    # all 4,096 rows selected (16 MiB of float32, and the output computed from them) or none
    assert extra["assumption_bytes"]["allocated_bytes"] > 4096 * 1024 * 4


def test_a_size_without_any_bound_names_the_op_its_line_and_what_to_do(workloads):
    with pytest.raises(VramscopeError, match=r"bincount at value_workloads\.py:\d+") as info:
        estimate(f"{workloads}:counts_of_unknown_values", 4)
    assert "minlength" in str(info.value) and "\n" not in str(info.value)


def test_layers_dropped_at_random_all_run_in_the_estimate(workloads):
    """LayerDrop's draw (``torch.rand([]) < p`` skips a layer) is read as the top of its
    range: every layer runs in every traced step, as in the steps that set a run's peak,
    instead of a trace that skips layers at random (half of them here, at p = 0.5); the
    other end (every layer skipped) is traced too and said as the alternative."""
    every = estimate(f"{workloads}:every_layer", 512).peak.allocated_bytes
    none = estimate(f"{workloads}:no_layer", 512).peak.allocated_bytes
    # each of the 4 layers keeps its (512, 1024) float32 output for backward: 2 MiB each
    assert every - none >= 4 * 512 * 1024 * 4
    for name in ("layer_drop", "layer_drop_like", "layer_drop_uniform"):
        report = estimate(f"{workloads}:{name}", 512)
        assert report.peak.allocated_bytes == every, name
        extra = report.extra["estimate"]
        assert extra["assumption_variant"] == "heavy"
        assert {a["kind"] for a in extra["assumptions"]} == {"draw"}
        assert extra["alternative_peak"]["allocated_bytes"] == none


def test_a_random_augmentation_is_applied_in_the_estimate(workloads):
    """A draw that applies work below its probability (``torch.rand(1) < p``: a random
    augmentation) is traced with the bottom of its range too, and that step is kept: the
    estimate is that of the augmentation applied, not of a trace that never applies it."""
    always = estimate(f"{workloads}:augment_always", 512).peak.allocated_bytes
    never = estimate(f"{workloads}:augment_never", 512).peak.allocated_bytes
    assert always - never >= 512 * 1024 * 4  # the doubled batch's activations
    report = estimate(f"{workloads}:augment_half", 512)
    assert report.peak.allocated_bytes == always
    assert report.extra["estimate"]["assumption_variant"] == "light"


def test_estimates_of_a_workload_with_random_sizes_are_the_same_every_time(workloads):
    """Sizes drawn at random in the batch are drawn from a generator the estimate seeds (a
    packed LSTM's lengths made its estimates differ by 5 % from one run to the next), and
    the caller's generator is left as it was."""
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    peaks = {estimate(f"{workloads}:random_rows", 64).peak.allocated_bytes for _ in range(3)}
    assert len(peaks) == 1
    assert torch.equal(torch.rand(3), expected)


def test_lengths_drawn_in_every_step_are_estimated_at_their_longest(workloads):
    """Lengths a batch draws with ``torch.randint`` make the packed rows' size: one traced
    step sees one draw where a run's steps see many (a packed LSTM of the zoo was
    under-estimated by 4 %), so the step is traced again with every draw at the top of its
    range and the larger kept, which is exactly the estimate of every sequence at full
    length; the report names the draw and the bytes that depend on it."""
    longest = estimate(f"{workloads}:packed_longest_lengths", 32)
    report = estimate(f"{workloads}:packed_drawn_lengths", 32)
    assert report.peak.allocated_bytes == longest.peak.allocated_bytes
    draws = report.extra["estimate"]["integer_draws"]
    assert draws["at_top"] is True
    assert draws["draws"] == [
        f"randint at value_workloads.py:{_line('torch.randint(10, 201')} (<lambda>)"
    ]
    # 32 sequences of at most 200 steps, drawn from 10..200: fewer packed rows as drawn
    assert draws["peak_as_drawn"]["allocated_bytes"] < report.peak.allocated_bytes
    (finding,) = [f for f in report.findings if "random integer draw" in f.message]
    assert "traced as drawn and at the top of its range" in finding.message
    assert longest.extra["estimate"].get("integer_draws") is None


def test_a_draw_read_only_for_a_branch_keeps_its_values(workloads):
    """Ids read by Python for a branch (``(ids == 0).any()``) make no size: the draw keeps
    its values (ids at the top of a vocabulary would all be its last token) and the step is
    traced once."""
    report = estimate(f"{workloads}:ids_read_for_a_branch", 8)
    assert report.extra["estimate"].get("integer_draws") is None
    assert report.extra["estimate"].get("assumptions") is None


def test_a_count_drawn_and_read_by_python_is_taken_at_the_top(workloads):
    """``int(torch.randint(lo, hi, (1,)).item())`` rows: an integer read makes a size, and
    the estimate is that of the most rows the draw can give (``hi - 1``)."""
    report = estimate(f"{workloads}:random_rows", 64)
    draws = report.extra["estimate"]["integer_draws"]
    assert draws["at_top"] is True
    # (8 * 64 - 1) rows of 1024 float32 inputs and outputs against the drawn count
    rows_bytes = 1024 * 4
    assert report.peak.allocated_bytes - draws["peak_as_drawn"]["allocated_bytes"] >= rows_bytes


def _line(text: str) -> int:
    """The line of WORKLOADS holding ``text`` (as the trace names the user's line)."""
    return next(i for i, line in enumerate(WORKLOADS.splitlines(), 1) if text in line)


@pytest.mark.parametrize("draw", ["randint", "randint_like", "random_"])
def test_every_integer_draw_is_taken_at_the_top_of_its_range(workloads, draw):
    """``randint``, ``randint_like`` and ``Tensor.random_(from, to)`` counts that make a size
    (``repeat_interleave``): the estimate is that of every count at ``to - 1``."""
    at_most = estimate(f"{workloads}:counts_at_most", 64).peak.allocated_bytes
    report = estimate(f"{workloads}:counts_{draw}", 64)
    assert report.peak.allocated_bytes == at_most
    (where,) = report.extra["estimate"]["integer_draws"]["draws"]
    assert where.startswith(f"{draw} at value_workloads.py:")
