"""Small workloads, one per kind of layer the estimator models: estimated on the CPU by
``tests/test_estimate_layers.py``, recorded on a GPU by ``tests/gpu/record_layers.py`` and
compared there by ``tests/gpu/test_estimate_layers_gpu.py``. Specs are
``tests/layer_workloads.py:NAME``; ``CASES`` gives each one's batch size and precision."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import vramscope

VOCAB, SEQ = 1000, 64


class Recurrent(nn.Module):
    def __init__(self, cell: str, hidden: int, layers: int, **options: object) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 256)
        self.rnn = getattr(nn, cell)(256, hidden, num_layers=layers, **options)
        directions = 2 if options.get("bidirectional") else 1
        self.head = nn.Linear(hidden * directions, VOCAB)
        self.batch_first = bool(options.get("batch_first"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.emb(x if self.batch_first else x.t()))
        return self.head(y if self.batch_first else y.transpose(0, 1))


def language_model(
    model: nn.Module, batch_size: int, device: torch.device, train: bool, seq: int = SEQ
) -> vramscope.Workload:
    """Next-token prediction on random tokens (Adam), or the forward alone (``train`` off)."""
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if train else None

    def batch():
        x = torch.randint(0, VOCAB, (batch_size, seq), device=device)
        return x, x

    def loss(m, x, y):
        out = m(x)
        if not train:
            return out
        return nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


def lstm(batch_size: int, device: torch.device) -> vramscope.Workload:
    """Two layers, batch first: cuDNN's flat weights, reserve and workspace."""
    return language_model(Recurrent("LSTM", 512, 2, batch_first=True), batch_size, device, True)


def lstm_bidirectional(batch_size: int, device: torch.device) -> vramscope.Workload:
    """Sequence first, bidirectional, dropout between layers (cuDNN's dropout state)."""
    model = Recurrent("LSTM", 256, 2, bidirectional=True, dropout=0.1)
    return language_model(model, batch_size, device, True)


def lstm_inference(batch_size: int, device: torch.device) -> vramscope.Workload:
    """No reserve in inference."""
    return language_model(Recurrent("LSTM", 512, 2, batch_first=True), batch_size, device, False)


def gru(batch_size: int, device: torch.device) -> vramscope.Workload:
    return language_model(Recurrent("GRU", 512, 1, batch_first=True), batch_size, device, True)


def rnn_tanh(batch_size: int, device: torch.device) -> vramscope.Workload:
    return language_model(Recurrent("RNN", 256, 2), batch_size, device, True)


class PackedRecurrent(nn.Module):
    """Sequences of different lengths packed for the LSTM, padded again after it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 256)
        self.rnn = nn.LSTM(256, 512, batch_first=True)
        self.head = nn.Linear(512, VOCAB)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        y, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=SEQ)
        return self.head(y)


def lstm_packed(batch_size: int, device: torch.device) -> vramscope.Workload:
    """``pack_padded_sequence``: lengths SEQ/2+1 ... SEQ, known on the host."""
    model = PackedRecurrent().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def batch():
        x = torch.randint(0, VOCAB, (batch_size, SEQ), device=device)
        lengths = torch.arange(batch_size) % (SEQ // 2) + SEQ // 2 + 1
        return x, lengths

    def loss(m, x, lengths):
        return nn.functional.cross_entropy(m(x, lengths).flatten(0, 1), x.flatten())

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


def lstm_drawn_lengths(batch_size: int, device: torch.device) -> vramscope.Workload:
    """``pack_padded_sequence`` over lengths drawn in every step (SEQ/4 ... SEQ), the way a
    loader's random crops come: the estimate takes them at the top of their range."""
    return _packed(batch_size, device, lambda: torch.randint(SEQ // 4, SEQ + 1, (batch_size,)))


def lstm_longest_lengths(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The same with every sequence at its full length."""
    return _packed(batch_size, device, lambda: torch.full((batch_size,), SEQ))


def _packed(
    batch_size: int, device: torch.device, lengths: Callable[[], torch.Tensor]
) -> vramscope.Workload:
    model = PackedRecurrent().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def batch():
        return torch.randint(0, VOCAB, (batch_size, SEQ), device=device), lengths()

    def loss(m, x, n):
        return nn.functional.cross_entropy(m(x, n).flatten(0, 1), x.flatten())

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


class Convolutions(nn.Module):
    """Depthwise, pointwise and grouped convolutions (a MobileNet-like block), and one
    dense 3x3 convolution, the kind that takes a cuDNN workspace on channels-first input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pointwise = nn.Conv2d(32, 64, 1)
        self.grouped = nn.Conv2d(64, 64, 3, padding=1, groups=4)
        self.dense = nn.Conv2d(64, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.relu(self.pointwise(torch.relu(self.depthwise(x))))
        x = torch.relu(self.dense(torch.relu(self.grouped(x))))
        return self.head(x.mean((2, 3)))


class NarrowGroups(nn.Module):
    """Convolutions in 2 groups of few channels (6 to 96 a group, CPUBone's kind), 3x3
    stride 2 and 2x2 stride 1, between 1x1 ones."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 12, 3, stride=2, padding=1)]
        channels = 12
        for _ in range(3):
            layers += [
                nn.Conv2d(channels, 4 * channels, 3, stride=2, padding=1, groups=2),
                nn.ReLU(),
                nn.Conv2d(4 * channels, 2 * channels, 1),
                nn.ReLU(),
            ]
            channels *= 2
        layers += [nn.Conv2d(channels, 4 * channels, 2, groups=2), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(4 * channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


def narrow_groups(batch_size: int, device: torch.device) -> vramscope.Workload:
    return _vision(NarrowGroups(), batch_size, device, channels_last=False)


def _vision(model: nn.Module, batch_size: int, device: torch.device, channels_last: bool):
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def batch():
        x = torch.randn(batch_size, 3, 128, 128, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, torch.randint(0, 10, (batch_size,), device=device)

    def loss(m, x, y):
        return nn.functional.cross_entropy(m(x), y)

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


def grouped_convolutions(batch_size: int, device: torch.device) -> vramscope.Workload:
    return _vision(Convolutions(), batch_size, device, channels_last=False)


def channels_last(batch_size: int, device: torch.device) -> vramscope.Workload:
    return _vision(Convolutions(), batch_size, device, channels_last=True)


class Bags(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(20000, 128, mode=mode)
        self.head = nn.Linear(128, 10)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(indices, offsets))


def _bags(mode: str, batch_size: int, device: torch.device) -> vramscope.Workload:
    model = Bags(mode).to(device)
    optimizer = torch.optim.Adagrad(model.parameters())

    def batch():
        indices = torch.randint(0, 20000, (batch_size * 20,), device=device)
        offsets = torch.arange(0, batch_size * 20, 20, device=device)
        return indices, offsets, torch.randint(0, 10, (batch_size,), device=device)

    def loss(m, indices, offsets, y):
        return nn.functional.cross_entropy(m(indices, offsets), y)

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


def embedding_bag_sum(batch_size: int, device: torch.device) -> vramscope.Workload:
    return _bags("sum", batch_size, device)


def embedding_bag_max(batch_size: int, device: torch.device) -> vramscope.Workload:
    return _bags("max", batch_size, device)


class MaskedAttention(nn.Module):
    """Attention with an additive mask and dropout, as written by hand in many models."""

    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.1 if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, length, dim))


def sdpa_mask_dropout(batch_size: int, device: torch.device) -> vramscope.Workload:
    model = MaskedAttention().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    length = 256

    def batch():
        x = torch.randn(batch_size, length, 256, device=device)
        keep = torch.rand(batch_size, 1, length, length, device=device) > 0.1
        return x, keep

    def loss(m, x, keep):
        return m(x, keep).float().pow(2).mean()

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


class PositionBiasAttention(nn.Module):
    """Attention whose additive mask is a learned bias per head and position pair, looked up
    as (L, S, H) and permuted to (1, H, L, S) the way T5 builds its relative position bias:
    the mask's last dimension then has the stride of the heads, not 1."""

    def __init__(self, dim: int = 256, heads: int = 4, length: int = 256) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(length, length, heads))
        self.contiguous_bias = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mask = self.bias.permute(2, 0, 1).unsqueeze(0)
        if self.contiguous_bias:
            mask = mask.contiguous()
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.1 if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, length, dim))


def _position_bias(batch_size: int, device: torch.device, contiguous: bool) -> vramscope.Workload:
    model = PositionBiasAttention().to(device)
    model.contiguous_bias = contiguous
    optimizer = torch.optim.AdamW(model.parameters())

    def batch():
        return (torch.randn(batch_size, 256, 256, device=device),)

    def loss(m, x):
        return m(x).pow(2).mean()

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


def sdpa_position_bias(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The permuted bias as the mask: on CUDA the math path (the fused kernels need a mask
    whose last dimension has stride 1)."""
    return _position_bias(batch_size, device, contiguous=False)


def sdpa_position_bias_contiguous(batch_size: int, device: torch.device) -> vramscope.Workload:
    """The same bias made contiguous first: memory-efficient attention."""
    return _position_bias(batch_size, device, contiguous=True)


class FlexAttention(nn.Module):
    """``flex_attention`` with a causal score modification, called as it is (not compiled:
    the estimate does not trace ``torch.compile``)."""

    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention

        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attend = flex_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)

        def causal(score, batch, head, query, key):
            return torch.where(query >= key, score, -float("inf"))

        return self.attend(q, k, v, score_mod=causal).transpose(1, 2).reshape(b, length, dim)


def flex_attention(batch_size: int, device: torch.device) -> vramscope.Workload:
    model = FlexAttention().to(device)
    optimizer = torch.optim.AdamW(model.parameters())

    def batch():
        return (torch.randn(batch_size, 512, 256, device=device),)

    def loss(m, x):
        return m(x).float().pow(2).mean()

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


class Mlp(nn.Module):
    def __init__(self, width: int = 1024, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _mlp(batch_size: int, device: torch.device, **adam: object) -> vramscope.Workload:
    model = Mlp().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **adam)

    def batch():
        return (torch.randn(batch_size, 1024, device=device),)

    def loss(m, x):
        return m(x).float().pow(2).mean()

    return vramscope.Workload(model=model, optimizer=optimizer, batch=batch, loss=loss)


def fused_adam(batch_size: int, device: torch.device) -> vramscope.Workload:
    """``Adam(fused=True)``: one kernel for the whole update; ``step`` lives on the GPU."""
    return _mlp(batch_size, device, fused=True)


def mlp_16_mixed(batch_size: int, device: torch.device) -> vramscope.Workload:
    """Float16 autocast with a GradScaler (the workload's precision ``16-mixed``)."""
    w = _mlp(batch_size, device)
    return w.with_overrides(precision="16-mixed")


# name -> (batch size, precision)
CASES: dict[str, tuple[int, str]] = {
    "lstm": (32, "32-true"),
    "lstm_bidirectional": (16, "32-true"),
    "lstm_inference": (64, "32-true"),
    "lstm_16_mixed": (32, "16-mixed"),
    "lstm_packed": (32, "32-true"),
    "gru": (32, "32-true"),
    "rnn_tanh": (32, "32-true"),
    "grouped_convolutions": (32, "32-true"),
    "grouped_convolutions_bf16": (32, "bf16-mixed"),
    "narrow_groups_bf16": (32, "bf16-mixed"),
    "narrow_groups": (32, "32-true"),
    "channels_last": (32, "32-true"),
    "embedding_bag_sum": (256, "32-true"),
    "embedding_bag_max": (256, "32-true"),
    "sdpa_mask_dropout": (16, "bf16-mixed"),
    "flex_attention": (8, "32-true"),
    "fused_adam": (64, "32-true"),
    "mlp_16_mixed": (64, "16-mixed"),
}
# cases that reuse another case's build function
BUILDERS = {
    "lstm_16_mixed": "lstm",
    "grouped_convolutions_bf16": "grouped_convolutions",
    "narrow_groups_bf16": "narrow_groups",
}
# the recurrent cases, held to the 2 % on allocated memory against the GPU
RECURRENT = {name for name in CASES if name.startswith(("lstm", "gru", "rnn"))}
