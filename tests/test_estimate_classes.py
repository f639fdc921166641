"""Code the estimator once could not trace, one class of it per test: modules that deep-copy
their layers, a model compiled in ``build()``, ops without a fake kernel, CUDA kernels whose
rules differ from their fake kernel's, sparse gradients. Each is real code traced on this CPU,
and each asserts sizes worked out from the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vramscope.estimate.estimator import estimate
from vramscope.estimate.profiles import get_profile
from vramscope.estimate.trace import trace_workload
from vramscope.workload import resolve

WORKLOADS = """
import torch, torch.nn as nn, torch.nn.functional as F, vramscope

def _train(model, batch, loss, optimizer=None):
    opt = optimizer or torch.optim.AdamW(model.parameters())
    return vramscope.Workload(model=model, optimizer=opt, batch=batch, loss=loss)

def small_vit(batch_size, device):
    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 64, 8, 8)
            layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 3)   # deep-copies the layer 3 times
            self.head = nn.Linear(64, 10)
        def forward(self, x):
            return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2)).mean(1))
    model = ViT().to(device)
    return _train(model, lambda: (torch.randn(batch_size, 3, 32, 32, device=device),
                                  torch.randint(0, 10, (batch_size,), device=device)),
                  lambda m, x, y: F.cross_entropy(m(x), y))

def _bn_net(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).to(device)

def _bn_batch(batch_size, device):
    return lambda: (torch.randn(batch_size, 3, 32, 32, device=device),
                    torch.randint(0, 10, (batch_size,), device=device))

def bn_net(batch_size, device):
    return _train(_bn_net(device), _bn_batch(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y))

def bn_net_with_ema(batch_size, device):
    import copy
    model = _bn_net("cpu")
    # an EMA copy made before the move (timm's pruned models copy so too): BatchNorm's
    # num_batches_tracked is a fake tensor made from a number, its value kept as a constant
    ema = copy.deepcopy(model).to(device)
    model = model.to(device)
    def loss(m, x, y):
        with torch.no_grad():
            for e, p in zip(ema.parameters(), m.parameters()):
                e.lerp_(p, 0.001)
        return F.cross_entropy(m(x), y)
    workload = _train(model, _bn_batch(batch_size, device), loss)
    workload.meta["ema"] = ema
    return workload

def orthogonal_linear(batch_size, device):
    lin = nn.Linear(64, 64)
    nn.utils.parametrizations.orthogonal(lin)  # checks its weight with torch.allclose
    model = nn.Sequential(lin, nn.ReLU(), nn.Linear(64, 10)).to(device)
    return _train(model, _mlp_batch_64(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y))

def _mlp_batch_64(batch_size, device):
    return lambda: (torch.randn(batch_size, 64, device=device),
                    torch.randint(0, 10, (batch_size,), device=device))

def _mlp(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 10)).to(device)

def _mlp_batch(batch_size, device):
    return lambda: (torch.randn(batch_size, 128, device=device),
                    torch.randint(0, 10, (batch_size,), device=device))

def eager_mlp(batch_size, device):
    return _train(_mlp(device), _mlp_batch(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y))

def compiled_mlp(batch_size, device):
    model = _mlp(device)
    opt = torch.optim.AdamW(model.parameters())
    return _train(torch.compile(model), _mlp_batch(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y), opt)

T, S, CLASSES = 50, 12, 32

def speech_ctc(batch_size, device):
    model = nn.Linear(40, CLASSES).to(device)
    def batch():
        features = torch.randn(T, batch_size, 40, device=device)
        targets = torch.randint(1, CLASSES, (batch_size, S), device=device)
        inputs = torch.full((batch_size,), T, dtype=torch.long, device=device)
        lengths = torch.full((batch_size,), S, dtype=torch.long, device=device)
        return features, targets, inputs, lengths
    def loss(m, features, targets, inputs, lengths):
        return F.ctc_loss(m(features).log_softmax(-1), targets, inputs, lengths)
    return _train(model, batch, loss)

def speech_ctc_lengths_from_the_audio(batch_size, device):
    # as transformers' CTC heads do without an attention mask: lengths from ones_like of
    # the float features (too large to have values), then integer arithmetic
    model = nn.Linear(40, CLASSES).to(device)
    def batch():
        return (torch.randn(T * 4, batch_size, 40, device=device),
                torch.randint(1, CLASSES, (batch_size * S,), device=device))
    def loss(m, audio, targets):
        mask = torch.ones_like(audio[..., 0].T, dtype=torch.long)  # (batch, 4T)
        inputs = torch.div(mask.sum(-1) - 4, 4, rounding_mode="floor") + 1
        lengths = torch.full((batch_size,), S, dtype=torch.long, device=audio.device)
        return F.ctc_loss(m(audio[::4]).log_softmax(-1), targets, inputs, lengths)
    return _train(model, batch, loss)

ROWS, DIM, BAG = 100_000, 64, 20

def _sparse(batch_size, device, optimizer):
    model = nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True).to(device)
    return _train(model, lambda: (torch.arange(batch_size * BAG, device=device).view(-1, BAG),),
                  lambda m, ids: m(ids).square().mean(), optimizer(model.parameters()))

def sparse_adagrad(batch_size, device):
    return _sparse(batch_size, device, torch.optim.Adagrad)

def sparse_adam(batch_size, device):
    return _sparse(batch_size, device, torch.optim.SparseAdam)

def sparse_twice(batch_size, device):
    # one sparse embedding looked up twice: autograd sums its two sparse gradients
    model = nn.Embedding(ROWS, DIM, sparse=True).to(device)
    def loss(m, a, b):
        return (m(a) * m(b)).sum()
    ids = lambda: torch.arange(batch_size * BAG, device=device)
    return _train(model, lambda: (ids(), ids() + 1), loss, torch.optim.Adagrad(model.parameters()))

def conv_only(batch_size, device):
    # no GEMM anywhere (a fully convolutional net, as FCN or SqueezeNet): no cuBLAS handle
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1))
    return _train(model.to(device), lambda: (torch.randn(batch_size, 3, 16, 16, device=device),),
                  lambda m, x: m(x).mean())

def conv_then_linear(batch_size, device):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 14 * 14, 2))
    return _train(model.to(device), lambda: (torch.randn(batch_size, 3, 16, 16, device=device),),
                  lambda m, x: m(x).mean())

def grid_sampling(batch_size, device):
    # optical flow's warping (RAFT): bilinear grid_sample with aligned corners, which CUDA
    # runs through cuDNN's grid sampler, an op without a fake kernel
    model = nn.Conv2d(3, 8, 3, padding=1).to(device)
    def loss(m, x, grid):
        return F.grid_sample(m(x), grid, align_corners=True).square().mean()
    return _train(model, lambda: (torch.randn(batch_size, 3, 32, 32, device=device),
                                  torch.rand(batch_size, 24, 40, 2, device=device) * 2 - 1), loss)

def learned_attention_bias(batch_size, device):
    # TinyViT's attention: a learned bias passed to SDPA as its mask (it needs a gradient)
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192)
            self.bias = nn.Parameter(torch.zeros(4, 49, 49))
        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], 49, 3, 4, 16).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias).mean()
    return _train(Attention().to(device), lambda: (torch.randn(batch_size, 49, 64, device=device),),
                  lambda m, x: m(x))

def attention_3d(batch_size, device):
    # SAM's ViT: heads folded into the batch, 3-D query, key and value with a bias mask
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192)
        def forward(self, x):
            q, k, v = self.qkv(x).view(-1, 49, 3, 16).permute(2, 0, 1, 3).unbind(0)
            bias = torch.zeros(q.shape[0], 49, 49, device=x.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).mean()
    return _train(Attention().to(device), lambda: (torch.randn(batch_size, 49, 64, device=device),),
                  lambda m, x: m(x))

LOOPS = []

def per_class_selection(batch_size, device):
    # torchvision's per-class NMS: boxes selected by score (values the trace does not have),
    # then a loop over the classes of what was selected
    model = nn.Linear(16, 1).to(device)
    def loss(m, x):
        scores = m(x).squeeze(-1)
        labels = torch.arange(scores.shape[0], device=scores.device) % 5
        kept = torch.where(scores > 0.5)[0]
        total = scores.sum() * 0
        for c in torch.unique(labels[kept]):
            LOOPS.append(int(c))
            total = total + scores[kept][labels[kept] == c].sum()
        return total
    return _train(model, lambda: (torch.randn(batch_size * 100, 16, device=device),), loss)

def experts_by_name(batch_size, device):
    # Switch Transformers: the expert module picked by f"expert_{index}" of a 0-dim tensor
    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleDict({f"expert_{i}": nn.Linear(8, 8) for i in range(3)})
        def forward(self, x, chosen):
            for index in chosen.unique():
                x = self.experts[f"expert_{index}"](x)
            return x.mean()
    return _train(Experts().to(device), lambda: (torch.randn(batch_size, 8, device=device),
                                                 torch.tensor([0, 2, 2], device=device)),
                  lambda m, x, chosen: m(x, chosen))

EXPERTS, TOKENS, IN, OUT = 4, 64, 32, 10

def grouped_experts(batch_size, device, stored_transposed=True):
    # experts' weights stored [out, in] as nn.Linear's and transposed (column-major: CUDA
    # takes them); stored [in, out] their rows of 10 float32 are not 16-byte multiples
    shape = (EXPERTS, OUT, IN) if stored_transposed else (EXPERTS, IN, OUT)
    model = nn.Module()
    model.weight = nn.Parameter(torch.randn(*shape, device=device))
    def loss(m, x):
        offsets = torch.tensor([16, 32, 48, 64], dtype=torch.int32, device=device)
        w = m.weight.transpose(-2, -1) if stored_transposed else m.weight
        return torch._grouped_mm(x, w, offs=offsets).sum()
    return _train(model, lambda: (torch.randn(TOKENS, IN, device=device),), loss)

def grouped_experts_misaligned(batch_size, device):
    return grouped_experts(batch_size, device, stored_transposed=False)

def _wn_net(device, precision=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.weight_norm(nn.Linear(64, 128)), nn.ReLU(),
                          nn.Linear(128, 10))   # the old weight_norm: its weight computed
    return model.to(device)

def old_weight_norm(batch_size, device):
    return _train(_wn_net(device), _mlp_batch_64(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y))

def old_weight_norm_half(batch_size, device):
    model = _wn_net(device).half()
    return _train(model, lambda: (torch.randn(batch_size, 64, device=device).half(),
                                  torch.randint(0, 10, (batch_size,), device=device)),
                  lambda m, x, y: F.cross_entropy(m(x).float(), y))

class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
    def forward(self, x):
        return x + torch.relu(self.fc(x))

def scripted_blocks(batch_size, device):
    torch.manual_seed(0)
    model = nn.Sequential(torch.jit.script(_Block()), torch.jit.script(_Block()),
                          nn.Linear(64, 10)).to(device)
    return _train(model, _mlp_batch_64(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y))

def pinned_batches(batch_size, device):
    model = _mlp(device)
    def batch():
        x = torch.randn(batch_size, 128).pin_memory().to(device, non_blocking=True)
        return x, torch.randint(0, 10, (batch_size,)).pin_memory().to(device, non_blocking=True)
    return _train(model, batch, lambda m, x, y: F.cross_entropy(m(x), y))

def lbfgs(batch_size, device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 64)).to(device)
    opt = torch.optim.LBFGS(model.parameters(), history_size=5, max_iter=8)
    x = torch.randn(batch_size, 64, device=device)
    def loss(m, x):
        return F.mse_loss(m(x), x)
    def step():
        def closure():
            opt.zero_grad()
            value = loss(model, x)
            value.backward()
            return value
        return opt.step(closure)
    return vramscope.Workload(model=model, optimizer=opt, batch=lambda: (x,), loss=loss,
                              step=step)

class _Both:
    # two optimizers behind one step() and zero_grad(), as people write them
    def __init__(self, *optimizers):
        self.optimizers = optimizers
    def step(self):
        for o in self.optimizers:
            o.step()
    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

def _two_part_mlp(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)

def optimizer_wrapper(batch_size, device):
    model = _two_part_mlp(device)
    opt = _Both(torch.optim.AdamW(model[0].parameters()),
                torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9))
    return _train(model, _mlp_batch_64(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y), opt)

class _Deep:
    # optimizers kept two levels down, where no one looks for them
    def __init__(self, *optimizers):
        self.parts = {"all": {"of": list(optimizers)}}
    def step(self):
        for o in self.parts["all"]["of"]:
            o.step()
    def zero_grad(self, set_to_none=True):
        for o in self.parts["all"]["of"]:
            o.zero_grad(set_to_none=set_to_none)

class _Hidden:
    # optimizers only a closure holds: nothing can find them
    def __init__(self, *optimizers):
        self.step = lambda: [o.step() for o in optimizers]
        self.zero_grad = lambda set_to_none=True: [o.zero_grad() for o in optimizers]

def deep_wrapper(batch_size, device, wrapper=_Deep):
    model = _two_part_mlp(device)
    opt = wrapper(torch.optim.AdamW(model.parameters()))
    return _train(model, _mlp_batch_64(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y), opt)

def hidden_wrapper(batch_size, device):
    return deep_wrapper(batch_size, device, _Hidden)

def optimizer_list(batch_size, device):
    model = _two_part_mlp(device)
    opts = [torch.optim.AdamW(model[0].parameters()),
            torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9)]
    return _train(model, _mlp_batch_64(batch_size, device),
                  lambda m, x, y: F.cross_entropy(m(x), y), opts)

def own_step(batch_size, device):
    model = _mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _mlp_batch(batch_size, device)()
    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return vramscope.Workload(model=model, optimizer=opt, batch=lambda: (x, y),
                              loss=lambda m, x, y: F.cross_entropy(m(x), y), step=step)

def exits(batch_size, device):
    import sys
    sys.exit(3)

def not_a_module(batch_size, device):
    return vramscope.Workload(model=lambda x: x, optimizer=None, batch=lambda: (1,),
                              loss=lambda m, x: m(x))


def cuda_calls_in_the_step(batch_size, device):
    model = _mlp(device)
    noise = torch.Generator(device=device)   # diffusion noise drawn on the device
    noise.manual_seed(0)
    side = torch.cuda.Stream()
    def loss(m, x, y):
        x = x + torch.randn(x.shape, device=device, generator=noise)
        x.record_stream(side)
        summary = torch.cuda.memory_summary()        # a user logging memory in the step
        assert torch.cuda.memory_stats()["allocated_bytes.all.current"] > 0 and summary
        return F.cross_entropy(m(x), y)
    return _train(model, _mlp_batch(batch_size, device), loss)


class _LearnedPositions(nn.Module):
    def __init__(self, positions):
        super().__init__()
        self.tokens = nn.Embedding(100, 32)
        self.positions = nn.Embedding(positions, 32)
        self.head = nn.Linear(32, 100)
    def forward(self, ids):
        where = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.tokens(ids) + self.positions(where))

def _positions(batch_size, device, positions, seq, vocab=100):
    torch.manual_seed(0)
    model = _LearnedPositions(positions).to(device)
    return _train(model, lambda: (torch.randint(0, vocab, (batch_size, seq), device=device),),
                  lambda m, ids: m(ids).logsumexp(-1).mean())

def positions_enough(batch_size, device):
    return _positions(batch_size, device, 64, 64)

def positions_too_few(batch_size, device):
    return _positions(batch_size, device, 64, 128)

def ids_past_the_vocabulary(batch_size, device):
    return _positions(batch_size, device, 64, 32, vocab=1000)

def index_add_of_another_dtype(batch_size, device):
    model = _mlp(device)
    def loss(m, x, y):
        out = m(x)
        rows = torch.zeros(out.shape, device=device, dtype=torch.float64)
        return rows.index_add(0, y, out).sum()   # float64 += float32: refused
    return _train(model, _mlp_batch(batch_size, device), loss)


class _WideInForward(nn.Module):
    # a forward whose peak is its own: a wide product, freed before backward begins
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)
    def forward(self, x):
        h = torch.relu(self.fc(x))                      # saved for backward
        with torch.no_grad():  # a statistic of the forward: batch x 256 x 256, freed at once
            wide = (h.unsqueeze(2) * h.unsqueeze(1)).sum()
        return h.sum() + 0 * wide

def peak_in_forward(batch_size, device):
    torch.manual_seed(0)
    model = _WideInForward().to(device)
    return _train(model, lambda: (torch.randn(batch_size, 256, device=device),),
                  lambda m, x: m(x), torch.optim.SGD(model.parameters(), lr=0.1))

"""


@pytest.fixture(scope="module")
def workloads(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("classes") / "class_workloads.py"
    path.write_text(WORKLOADS)
    return path


def _parameter_blocks(workloads: Path, name: str) -> int:
    """The parameters of workload ``name`` built for real on the CPU, in float32, each in
    the allocator's 512-byte blocks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("class_workloads", workloads)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real = getattr(module, name)(2, torch.device("cpu")).model
    return sum(-(-p.numel() * 4 // 512) * 512 for p in real.parameters())


def _allocations(spec: str, batch: int) -> list[tuple[str, int]]:
    trace = trace_workload(resolve(spec), batch, get_profile("h200"))
    return [(trace.blocks[e[1]].op, e[2]) for e in trace.events if e[0] == "alloc"]


def test_a_module_that_deep_copies_its_layers_is_estimated(workloads):
    weights = _parameter_blocks(workloads, "small_vit")
    report = estimate(f"{workloads}:small_vit", 8)
    # the three deep copies of the encoder layer are parameters of their own
    assert report.categories_at_peak.parameters == weights


def test_a_deep_copy_of_a_model_with_batchnorm_is_estimated(workloads):
    """An EMA copy made with ``copy.deepcopy`` in ``build()``: BatchNorm's
    ``num_batches_tracked`` keeps its value as a fake tensor's constant, copied for real; the
    copy's tensors are alive through every step, on top of the same run without it."""
    import copy

    plain = estimate(f"{workloads}:bn_net", 8)
    with_ema = estimate(f"{workloads}:bn_net_with_ema", 8)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.Linear(16, 10)
    )
    ema = copy.deepcopy(net)
    held = [*ema.parameters(), *ema.buffers()]
    copied = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in held)
    assert with_ema.peak.allocated_bytes - plain.peak.allocated_bytes == copied


def test_a_whole_tensor_comparison_in_build_reads_the_values_the_trace_has(workloads):
    """``nn.utils.parametrizations.orthogonal`` checks its initial weight with
    ``torch.allclose``: the weight's values are the real initializer's (a small tensor), so
    the comparison is computed, not assumed; the parametrized weight is a parameter."""
    weights = _parameter_blocks(workloads, "orthogonal_linear")
    report = estimate(f"{workloads}:orthogonal_linear", 8)
    assert report.categories_at_peak.parameters == weights
    assert not any("allclose" in f.message for f in report.findings)


def test_a_model_compiled_in_build_is_estimated_as_its_eager_original(workloads):
    eager = estimate(f"{workloads}:eager_mlp", 64)
    compiled = estimate(f"{workloads}:compiled_mlp", 64)
    assert compiled.peak.allocated_bytes == eager.peak.allocated_bytes
    notes = compiled.extra["estimate"]["notes"]
    assert any("the model (Sequential) is compiled" in n for n in notes)
    assert not any("compiled" in n for n in eager.extra["estimate"]["notes"])


def test_ctc_loss_runs_its_cpu_kernel_for_the_sizes_cuda_allocates(workloads):
    allocations = _allocations(f"{workloads}:speech_ctc", 8)
    # CUDA's CTC loss keeps log_alpha, (batch, T, 2S + 1) float32, for backward, and its
    # backward makes log_beta of the same size
    log_alpha = 8 * 50 * (2 * 12 + 1) * 4
    ops = [op for op, size in allocations if size == log_alpha]
    assert any("ctc_loss" in op for op in ops)
    assert any(op == "ctc loss bwd" for op in ops)


@pytest.mark.parametrize("optimizer", ["sparse_adagrad", "sparse_adam"])
def test_sparse_gradients_have_the_size_of_their_indices_and_values(workloads, optimizer):
    report = estimate(f"{workloads}:{optimizer}", 16)
    looked_up = 16 * 20  # one row of the gradient per id looked up
    indices, values = looked_up * 8, looked_up * 64 * 4
    gradient = -(-indices // 512) * 512 + -(-values // 512) * 512
    dense = 100_000 * 64 * 4
    assert report.categories_at_peak.gradients == gradient
    assert report.categories_at_peak.parameters == dense


def test_a_sparse_weight_looked_up_twice_sums_its_sparse_gradients(workloads):
    # autograd adds the two sparse gradients (sparse + sparse); the trace once read the
    # storage of the sum, which a sparse tensor does not have
    report = estimate(f"{workloads}:sparse_twice", 16)
    one = 16 * 20  # entries of one lookup's gradient
    assert report.categories_at_peak.gradients >= -(-one * 8 // 512) * 512 + one * 64 * 4
    assert report.categories_at_peak.parameters == 100_000 * 64 * 4


def test_a_step_without_gemms_sets_up_no_cublas_handles(workloads):
    # measured on an H200: training steps of FCN, DeepLab and SqueezeNet used 126-128 MiB
    # less than those with a GEMM; their inference 66 MiB less
    profile = get_profile("h200")
    without = estimate(f"{workloads}:conv_only", 4, gpu="h200")
    with_gemm = estimate(f"{workloads}:conv_then_linear", 4, gpu="h200")
    handles = 2 * profile.cublas_handle_bytes  # the main thread's and autograd's
    assert (
        with_gemm.startup.context_and_libraries_bytes - without.startup.context_and_libraries_bytes
        == handles
    )
    assert without.startup.context_and_libraries_bytes == profile.context_bytes(
        training=True, cudnn=True, cudnn_backward=True, cublas_threads=0
    )


def test_grid_sampling_has_the_grids_size(workloads):
    # a CUDA build of torch sends float32 to cuDNN's grid sampler (no fake kernel: the rule
    # in cuda_rules), a CPU build to grid_sampler_2d: the same sizes either way
    allocations = _allocations(f"{workloads}:grid_sampling", 2)
    forward = {"cudnn_grid_sampler.default", "grid_sampler_2d.default"}
    backward = {"cudnn_grid_sampler_backward.default", "grid_sampler_2d_backward.default"}
    assert any(op in forward and size == 2 * 8 * 24 * 40 * 4 for op, size in allocations)
    grads = sorted({size for op, size in allocations if op in backward})
    assert grads == [2 * 24 * 40 * 2 * 4, 2 * 8 * 32 * 32 * 4]


def test_lengths_made_from_ones_like_of_a_large_input_have_values(workloads):
    allocations = _allocations(f"{workloads}:speech_ctc_lengths_from_the_audio", 8)
    log_alpha = 8 * 50 * (2 * 12 + 1) * 4  # as for lengths given in the batch
    assert any("ctc_loss" in op and size == log_alpha for op, size in allocations)


def test_a_learned_attention_bias_takes_memory_efficient_attention(workloads):
    # cuDNN's attention has no gradient for its mask: torch picks the memory-efficient kernel
    report = estimate(f"{workloads}:learned_attention_bias", 8, precision="bf16-mixed")
    assert set(report.extra["estimate"]["sdpa_kernels"]) == {"efficient"}


def test_3d_attention_takes_the_math_path(workloads):
    # every fused CUDA kernel takes 4-D inputs only (check_tensor_shapes)
    report = estimate(f"{workloads}:attention_3d", 8)
    assert set(report.extra["estimate"]["sdpa_kernels"]) == {"math"}


def test_a_loop_over_the_classes_of_an_assumed_selection_runs_once_per_class(workloads):
    spec = resolve(f"{workloads}:per_class_selection")
    loops = spec.builder.__globals__["LOOPS"]
    loops.clear()
    trace_workload(spec, 8, get_profile("h200"), steps=1)
    # every box kept: their positions are known, so are their labels: 5 classes a trace
    # (heavy and light), not one iteration per box (800)
    assert 0 < len(loops) <= 2 * 5


def test_a_module_named_by_a_tensors_value_is_found(workloads):
    report = estimate(f"{workloads}:experts_by_name", 4)
    # experts 0 and 2 ran (weight and bias, a 512-byte block each): their gradients and
    # AdamW's two states; expert 1 has none
    categories = report.categories_at_peak
    assert categories.parameters == 3 * 2 * 512
    assert categories.gradients == 2 * 2 * 512
    assert categories.optimizer_state == 2 * 2 * 2 * 512


def test_grouped_gemm_in_float32_follows_cudas_rules(workloads):
    allocations = _allocations(f"{workloads}:grouped_experts", 1)
    # 64 tokens x 10 outputs, the rows 16-byte aligned (a stride of 12 float32): the
    # storage ends at the last row's 10th element
    assert ("_grouped_mm.default", (63 * 12 + 10) * 4) in allocations


def test_parameters_something_else_holds_change_in_place_under_to(workloads):
    """The old ``nn.utils.weight_norm`` keeps a weight computed from ``weight_g`` and
    ``weight_v`` (holding them), which ``Module._apply`` cannot swap under fake tensors: they
    change in place, as ``param.data = ...`` changes a real one. Float32 and after
    ``.half()``: the parameters' blocks exactly."""
    weights = _parameter_blocks(workloads, "old_weight_norm")
    assert estimate(f"{workloads}:old_weight_norm", 8).categories_at_peak.parameters == weights
    half = estimate(f"{workloads}:old_weight_norm_half", 8).categories_at_peak.parameters
    import importlib.util

    spec = importlib.util.spec_from_file_location("class_workloads", workloads)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real = module.old_weight_norm_half(2, torch.device("cpu")).model
    assert half == sum(-(-p.numel() * 2 // 512) * 512 for p in real.parameters())


def test_torchscript_modules_are_traced_op_by_op(workloads):
    """``torch.jit.script``'ed blocks: their fusers would compile kernels for the emulated
    device; unfused, their parameters and a step are estimated."""
    report = estimate(f"{workloads}:scripted_blocks", 8)
    assert report.categories_at_peak.parameters == _parameter_blocks(workloads, "scripted_blocks")
    assert report.categories_at_peak.gradients > 0


def test_pinned_batches_are_host_memory(workloads):
    """``pin_memory()`` before ``.to(device, non_blocking=True)``: page-locked host memory,
    none of the device's; the same estimate as the batch made on the device."""
    pinned = estimate(f"{workloads}:pinned_batches", 8)
    assert pinned.peak.allocated_bytes == estimate(f"{workloads}:eager_mlp", 8).peak.allocated_bytes


def test_lbfgs_runs_to_its_iteration_limit_and_fills_its_history(workloads):
    """Its convergence checks read values the trace does not have: run to ``max_iter`` (8)
    with a history of 5 pairs of flat parameter-sized vectors (and its direction, the last
    gradient), the most memory it can take, and the report says so."""
    report = estimate(f"{workloads}:lbfgs", 16)
    flat = (64 * 256 + 256 + 256 * 64 + 64) * 4
    assert report.categories_at_peak.optimizer_state >= 2 * 5 * flat
    notes = report.extra["estimate"]["notes"]
    assert any(
        n.startswith("LBFGS: run to its limit (8 iterations, a history of 5)") for n in notes
    )


@pytest.mark.parametrize("name", ["optimizer_wrapper", "optimizer_list"])
def test_several_optimizers_hold_their_state(workloads, name):
    """Two optimizers, a list of them or a wrapper of the user's with ``step()`` and
    ``zero_grad()``: AdamW's two moments and a step count on the first layer, SGD's momentum
    on the last, each labelled optimizer state."""
    report = estimate(f"{workloads}:{name}", 8)
    first = 64 * 128 + 128
    last = 128 * 10 + 10

    def blocks(n: int) -> int:
        return -(-n * 4 // 512) * 512

    adam = 2 * (blocks(64 * 128) + blocks(128))
    momentum = blocks(128 * 10) + blocks(10)
    state = report.categories_at_peak.optimizer_state
    assert adam + momentum <= state <= adam + momentum + 2 * 512  # (the step counts)
    assert first and last


def test_a_wrappers_optimizers_are_found_where_it_keeps_them(workloads):
    """A wrapper's optimizers in dicts and lists a few levels down: their state is
    optimizer state, and under 16-mixed each steps through the GradScaler. One that only a
    closure holds cannot be found: refused in one line under 16-mixed (not estimated
    without an update); in 32-true its own step() runs."""
    from vramscope.errors import VramscopeError

    adamw = 2 * sum(-(-n * 4 // 512) * 512 for n in (64 * 128, 128, 128 * 10, 10))
    for precision in ("32-true", "16-mixed"):
        report = estimate(f"{workloads}:deep_wrapper", 8, precision=precision)
        assert adamw <= report.categories_at_peak.optimizer_state <= adamw + 4 * 512
    assert estimate(f"{workloads}:hidden_wrapper", 8).peak.allocated_bytes > 0
    with pytest.raises(VramscopeError, match="_Hidden holds none among its attributes"):
        estimate(f"{workloads}:hidden_wrapper", 8, precision="16-mixed")


def test_a_precision_asked_of_a_workload_with_its_own_step_is_said_not_applied(workloads):
    plain = estimate(f"{workloads}:own_step", 8)
    asked = estimate(f"{workloads}:own_step", 8, precision="bf16-mixed")
    assert asked.peak.allocated_bytes == plain.peak.allocated_bytes
    assert asked.workload["precision"] == "32-true"  # what ran, not what was asked
    notes = asked.extra["estimate"]["notes"]
    assert any(n.startswith("precision bf16-mixed asked for, not applied") for n in notes)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("exits", "exited (sys.exit(3))"),
        ("not_a_module", "must be a torch.nn.Module, not function"),
    ],
)
def test_a_build_that_exits_or_returns_no_module_is_one_line(workloads, name, message):
    from vramscope.errors import VramscopeError

    with pytest.raises(VramscopeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        estimate(f"{workloads}:{name}", 8)


def test_cuda_calls_a_step_makes_are_emulated(workloads):
    """A device generator (``torch.Generator(device="cuda")``), ``record_stream`` and the
    allocator's tables read in the step: each answered as the emulated device would, and the
    step estimated as without them plus the noise it draws."""
    report = estimate(f"{workloads}:cuda_calls_in_the_step", 8)
    plain = estimate(f"{workloads}:eager_mlp", 8)
    assert report.categories_at_peak.parameters == plain.categories_at_peak.parameters
    assert report.peak.allocated_bytes >= plain.peak.allocated_bytes


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("positions_too_few", "an embedding of 64 rows looked up with ids from 0 to 127"),
        ("ids_past_the_vocabulary", "an embedding of 100 rows looked up with ids from"),
        ("index_add_of_another_dtype", "must have the same scalar type"),
        ("grouped_experts_misaligned", "strides should be multiple of 16 bytes"),
    ],
)
def test_a_step_the_gpu_would_refuse_is_refused(workloads, name, message):
    """Values and dtypes a GPU's kernel refuses and the fake kernels let pass: learned
    positions shorter than the sequence, token ids past the vocabulary (their values are the
    trace's), ``index_add`` of another dtype, a grouped GEMM's rows not 16-byte multiples
    (refused so on an H200). Not a "fits" for a step that fails."""
    from vramscope.estimate.recorder import TraceError

    estimate(f"{workloads}:positions_enough", 2)  # as many positions as tokens: fine
    with pytest.raises(TraceError, match=message):
        estimate(f"{workloads}:{name}", 2)


def test_at_a_peak_inside_a_forward_what_backward_will_need_is_activations(workloads):
    """The peak is the forward's wide product: there, what the forward made and its backward
    will find alive (the ReLU's output, 64 x 256 floats) is activations, as a measured run's
    trace labels it by lifetime; the product, freed before backward, a temporary."""
    report = estimate(f"{workloads}:peak_in_forward", 64)
    assert report.peak.phase == "forward"
    cats = report.categories_at_peak
    assert cats.activations >= 64 * 256 * 4
    assert cats.temporaries >= 64 * 256 * 256 * 4
