"""torch.nn and hand-written layers for the zoo sweep, as workload build functions (contract 1).

Each function is ``build(batch_size, device) -> vramscope.Workload`` and is named in a spec
as ``benchmarks/zoo_layers.py:NAME`` (from the repository's root). They cover what users
write themselves: torch's Transformer modules, attention, recurrent layers with packed
sequences, convolutions of every dimension, EmbeddingBag, sparse embeddings with SparseAdam
and Adagrad, FFT layers, a graph layer built on ``index_add_`` and ``scatter_reduce``, a CTC
speech model, a mixture of experts with top-k routing, a model compiled inside build, a
channels-last VAE, 3-D convolutions in 16-mixed and an Inception-style net. Every random
value of a step comes from the batch function.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vramscope import Workload

# name -> (default batch size, precision): what the sweep runs
LAYERS: dict[str, tuple[int, str]] = {
    "transformer": (16, "32-true"),
    "transformer_encoder": (32, "bf16-mixed"),
    "transformer_decoder": (32, "32-true"),
    "vit_encoder": (32, "32-true"),
    "multihead_attention": (32, "bf16-mixed"),
    "rnn_tanh": (32, "32-true"),
    "lstm_bidirectional": (32, "32-true"),
    "lstm_packed": (32, "32-true"),
    "gru_bidirectional": (32, "bf16-mixed"),
    "conv1d": (32, "32-true"),
    "conv2d": (32, "32-true"),
    "conv3d": (8, "32-true"),
    "conv_transpose": (16, "32-true"),
    "embedding_bag": (256, "32-true"),
    "sparse_embedding_sparse_adam": (256, "32-true"),
    "sparse_embedding_adagrad": (256, "32-true"),
    "fft_mixer": (32, "32-true"),
    "spectral_conv": (16, "32-true"),
    "graph_message_passing": (8, "32-true"),
    "ctc_speech": (16, "32-true"),
    "moe_top2": (16, "32-true"),
    "compiled_mlp": (64, "32-true"),
    "vae_channels_last": (32, "32-true"),
    "conv3d_fp16": (8, "16-mixed"),
    "inception_fp32": (32, "32-true"),
    "lora_llama_1b": (4, "bf16-true"),
}


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _workload(
    model: nn.Module, batch: Any, loss: Any, precision: str = "32-true", optimizer: Any = None
) -> Workload:
    return Workload(
        model=model,
        optimizer=optimizer if optimizer is not None else _adamw(model),
        batch=batch,
        loss=loss,
        precision=precision,
    )


# ---- transformers from torch.nn --------------------------------------------------------------


class _Seq2Seq(nn.Module):
    def __init__(self, vocab: int = 8000, d_model: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.core = nn.Transformer(
            d_model, nhead=8, num_encoder_layers=2, num_decoder_layers=2, batch_first=True
        )
        self.head = nn.Linear(d_model, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        return self.head(self.core(self.embed(src), self.embed(tgt), tgt_mask=mask))


def transformer(batch_size: int, device: torch.device) -> Workload:
    """``nn.Transformer``: a small sequence-to-sequence model with a causal target mask."""
    model = _Seq2Seq().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        src = torch.randint(0, 8000, (batch_size, 128), device=device)
        tgt = torch.randint(0, 8000, (batch_size, 65), device=device)
        return src, tgt

    def loss(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        logits = model(src, tgt[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())

    return _workload(model, batch, loss, LAYERS["transformer"][1])


class _Encoder(nn.Module):
    def __init__(self, vocab: int = 8000, d_model: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, 8, dim_feedforward=4 * d_model, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=padding))


def transformer_encoder(batch_size: int, device: torch.device) -> Workload:
    """``nn.TransformerEncoder`` (pre-norm) with a key padding mask, as a masked LM."""
    model = _Encoder().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 8000, (batch_size, 128), device=device)
        padding = torch.rand(batch_size, 128, device=device) < 0.1
        padding[:, 0] = False
        return ids, padding

    def loss(model: nn.Module, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(ids, padding).flatten(0, 1), ids.flatten())

    return _workload(model, batch, loss, LAYERS["transformer_encoder"][1])


class _Decoder(nn.Module):
    def __init__(self, vocab: int = 8000, d_model: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerDecoderLayer(d_model, 8, dim_feedforward=1024, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, 3)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.decoder(self.embed(ids), memory, tgt_mask=mask, tgt_is_causal=True))


def transformer_decoder(batch_size: int, device: torch.device) -> Workload:
    """``nn.TransformerDecoder`` attending to a given memory (a captioning head)."""
    model = _Decoder().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 8000, (batch_size, 97), device=device)
        memory = torch.randn(batch_size, 49, 256, device=device)
        return ids, memory

    def loss(model: nn.Module, ids: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        logits = model(ids[:, :-1], memory)
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    return _workload(model, batch, loss, LAYERS["transformer_decoder"][1])


class SmallViT(nn.Module):
    """A ViT of one's own: patches by a strided convolution, a class token, learned
    positions, ``nn.TransformerEncoder``."""

    def __init__(
        self, size: int = 224, patch: int = 16, dim: int = 384, depth: int = 6, classes: int = 1000
    ) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        count = (size // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, count + 1, dim))
        layer = nn.TransformerEncoderLayer(
            dim, 6, 4 * dim, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def vit_encoder(batch_size: int, device: torch.device) -> Workload:
    """A small ViT of one's own on ``nn.TransformerEncoder``."""
    model = SmallViT().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, 224, 224, device=device)
        return x, torch.randint(0, 1000, (batch_size,), device=device)

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    return _workload(model, batch, loss, LAYERS["vit_encoder"][1])


class _Attention(nn.Module):
    def __init__(self, dim: int = 512) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, 8, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        mixed, _ = self.attn(x, context, context, need_weights=False)
        return self.out(self.norm(x + mixed))


def multihead_attention(batch_size: int, device: torch.device) -> Workload:
    """``nn.MultiheadAttention`` as cross-attention (query and key lengths differ)."""
    model = _Attention().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randn(batch_size, 256, 512, device=device),
            torch.randn(batch_size, 384, 512, device=device),
        )

    def loss(model: nn.Module, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return model(x, context).float().pow(2).mean()

    return _workload(model, batch, loss, LAYERS["multihead_attention"][1])


# ---- recurrent layers --------------------------------------------------------------------------


class _Recurrent(nn.Module):
    def __init__(self, kind: str, bidirectional: bool, features: int = 128) -> None:
        super().__init__()
        cls = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[kind]
        self.rnn = cls(features, 256, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(256 * (2 if bidirectional else 1), 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def _recurrent(kind: str, bidirectional: bool, name: str) -> Any:
    def build(batch_size: int, device: torch.device) -> Workload:
        model = _Recurrent(kind, bidirectional).to(device)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch_size, 200, 128, device=device)
            return x, torch.randint(0, 10, (batch_size,), device=device)

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(x), y)

        return _workload(model, batch, loss, LAYERS[name][1])

    build.__name__ = name
    build.__doc__ = f"``nn.{kind.upper()}``, 2 layers" + (
        ", bidirectional" if bidirectional else ""
    )
    return build


rnn_tanh = _recurrent("rnn", False, "rnn_tanh")
lstm_bidirectional = _recurrent("lstm", True, "lstm_bidirectional")
gru_bidirectional = _recurrent("gru", True, "gru_bidirectional")


class _Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5000, 128)
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(512, 5)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embed(ids), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, (hidden, _) = self.lstm(packed)
        return self.head(torch.cat([hidden[-2], hidden[-1]], dim=1))


def lstm_packed(batch_size: int, device: torch.device) -> Workload:
    """A bidirectional ``nn.LSTM`` over packed sequences of different lengths."""
    model = _Packed().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 5000, (batch_size, 160), device=device)
        lengths = torch.randint(40, 161, (batch_size,), device=device)
        lengths[0] = 160
        return ids, lengths, torch.randint(0, 5, (batch_size,), device=device)

    def loss(
        model: nn.Module, ids: torch.Tensor, lengths: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return F.cross_entropy(model(ids, lengths), y)

    return _workload(model, batch, loss, LAYERS["lstm_packed"][1])


# ---- convolutions ------------------------------------------------------------------------------


def _conv_net(dims: int, width: int = 64) -> nn.Sequential:
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    norm = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]
    pool = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}[dims]
    layers: list[nn.Module] = []
    channels = 3
    for i in range(4):
        out = width * 2**i
        layers += [conv(channels, out, 3, stride=2 if i else 1, padding=1), norm(out), nn.ReLU()]
        channels = out
    return nn.Sequential(*layers, pool(1), nn.Flatten(), nn.Linear(channels, 10))


def _conv(dims: int, shape: tuple[int, ...], name: str) -> Any:
    def build(batch_size: int, device: torch.device) -> Workload:
        model = _conv_net(dims, 32 if dims == 3 else 64).to(device)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch_size, 3, *shape, device=device)
            return x, torch.randint(0, 10, (batch_size,), device=device)

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(x), y)

        return _workload(model, batch, loss, LAYERS[name][1])

    build.__name__ = name
    build.__doc__ = f"``nn.Conv{dims}d`` with batch norm, 4 stages"
    return build


conv1d = _conv(1, (4096,), "conv1d")
conv2d = _conv(2, (128, 128), "conv2d")
conv3d = _conv(3, (16, 64, 64), "conv3d")


class _Transposed(nn.Module):
    """An encoder-decoder of strided convolutions and transposed convolutions, in 1-D, 2-D
    and 3-D."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Conv1d(2, 32, 4, stride=2, padding=1)
        self.up1 = nn.ConvTranspose1d(32, 2, 4, stride=2, padding=1)
        self.down2 = nn.Conv2d(3, 64, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(64, 3, 4, stride=2, padding=1)
        self.down3 = nn.Conv3d(1, 16, 4, stride=2, padding=1)
        self.up3 = nn.ConvTranspose3d(16, 1, 4, stride=2, padding=1, output_padding=0)

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        ra = self.up1(F.relu(self.down1(a)))
        rb = self.up2(F.relu(self.down2(b)))
        rc = self.up3(F.relu(self.down3(c)))
        return F.mse_loss(ra, a) + F.mse_loss(rb, b) + F.mse_loss(rc, c)


def conv_transpose(batch_size: int, device: torch.device) -> Workload:
    """``nn.ConvTranspose1d/2d/3d`` decoders after strided convolutions (autoencoders)."""
    model = _Transposed().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.randn(batch_size, 2, 2048, device=device),
            torch.randn(batch_size, 3, 128, 128, device=device),
            torch.randn(batch_size, 1, 16, 64, 64, device=device),
        )

    def loss(model: nn.Module, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        return model(a, b, c)

    return _workload(model, batch, loss, LAYERS["conv_transpose"][1])


# ---- embeddings --------------------------------------------------------------------------------


class _Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(100_000, 64, mode="mean")
        self.head = nn.Linear(64, 2)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids, offsets))


def embedding_bag(batch_size: int, device: torch.device) -> Workload:
    """``nn.EmbeddingBag`` (mean) over bags of 50 ids given by offsets."""
    model = _Bag().to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 100_000, (batch_size * 50,), device=device)
        offsets = torch.arange(0, batch_size * 50, 50, device=device)
        return ids, offsets, torch.randint(0, 2, (batch_size,), device=device)

    def loss(
        model: nn.Module, ids: torch.Tensor, offsets: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return F.cross_entropy(model(ids, offsets), y)

    return _workload(model, batch, loss, LAYERS["embedding_bag"][1])


class SkipGram(nn.Module):
    """word2vec's skip-gram with negative sampling on two sparse embeddings."""

    def __init__(self, vocab: int = 200_000, dim: int = 128) -> None:
        super().__init__()
        self.inputs = nn.Embedding(vocab, dim, sparse=True)
        self.outputs = nn.Embedding(vocab, dim, sparse=True)

    def forward(
        self, center: torch.Tensor, context: torch.Tensor, negatives: torch.Tensor
    ) -> torch.Tensor:
        c = self.inputs(center)
        positive = (c * self.outputs(context)).sum(-1)
        negative = torch.bmm(self.outputs(negatives), c.unsqueeze(2)).squeeze(2)
        return -(F.logsigmoid(positive).mean() + F.logsigmoid(-negative).mean())


def _sparse(optimizer: str, name: str) -> Any:
    def build(batch_size: int, device: torch.device) -> Workload:
        model = SkipGram().to(device)
        if optimizer == "sparse_adam":
            opt: torch.optim.Optimizer = torch.optim.SparseAdam(list(model.parameters()), lr=1e-3)
        else:
            opt = torch.optim.Adagrad(model.parameters(), lr=1e-2)

        def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return (
                torch.randint(0, 200_000, (batch_size * 8,), device=device),
                torch.randint(0, 200_000, (batch_size * 8,), device=device),
                torch.randint(0, 200_000, (batch_size * 8, 5), device=device),
            )

        def loss(model: nn.Module, *batch: torch.Tensor) -> torch.Tensor:
            return model(*batch)

        return _workload(model, batch, loss, LAYERS[name][1], optimizer=opt)

    build.__name__ = name
    build.__doc__ = f"``nn.Embedding(sparse=True)`` (skip-gram) trained with {optimizer}"
    return build


sparse_embedding_sparse_adam = _sparse("sparse_adam", "sparse_embedding_sparse_adam")
sparse_embedding_adagrad = _sparse("adagrad", "sparse_embedding_adagrad")


# ---- FFT -----------------------------------------------------------------------------------------


class _FNetBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + torch.fft.fft2(x.float()).real.to(x.dtype))
        return self.norm2(x + self.ff(x))


def fft_mixer(batch_size: int, device: torch.device) -> Workload:
    """FNet: token mixing by a 2-D FFT (``torch.fft.fft2``, the real part) instead of
    attention."""
    model = nn.Sequential(
        nn.Embedding(8000, 256), *[_FNetBlock(256) for _ in range(4)], nn.Linear(256, 8000)
    ).to(device)

    def batch() -> tuple[torch.Tensor]:
        return (torch.randint(0, 8000, (batch_size, 256), device=device),)

    def loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())

    return _workload(model, batch, loss, LAYERS["fft_mixer"][1])


class SpectralConv2d(nn.Module):
    """A Fourier neural operator layer: ``rfft2``, complex weights on the lowest modes,
    ``irfft2``."""

    def __init__(self, channels: int = 32, modes: int = 16) -> None:
        super().__init__()
        self.modes = modes
        scale = 1 / (channels * channels)
        self.weight = nn.Parameter(
            scale * torch.randn(channels, channels, modes, modes, dtype=torch.cfloat)
        )
        self.skip = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft2(x)
        out = torch.zeros_like(spectrum)
        m = self.modes
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", spectrum[:, :, :m, :m], self.weight)
        return F.gelu(torch.fft.irfft2(out, s=x.shape[-2:]) + self.skip(x))


def spectral_conv(batch_size: int, device: torch.device) -> Workload:
    """A Fourier neural operator (``torch.fft.rfft2`` / ``irfft2``, complex parameters)."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 1), *[SpectralConv2d() for _ in range(4)], nn.Conv2d(32, 1, 1)
    ).to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randn(batch_size, 3, 128, 128, device=device),
            torch.randn(batch_size, 1, 128, 128, device=device),
        )

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(model(x), y)

    return _workload(model, batch, loss, LAYERS["spectral_conv"][1])


# ---- graphs ------------------------------------------------------------------------------------


class MessagePassing(nn.Module):
    """A GNN layer: messages along edges summed into their targets with ``index_add_``,
    and the mean of the neighbours with ``scatter_reduce``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.message = nn.Linear(2 * dim, dim)
        self.update = nn.Linear(3 * dim, dim)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        source, target = edges
        messages = F.relu(self.message(torch.cat([x[source], x[target]], dim=1)))
        summed = torch.zeros_like(x).index_add_(0, target, messages)
        index = target.unsqueeze(1).expand(-1, x.shape[1])
        mean = torch.zeros_like(x).scatter_reduce(0, index, x[source], "mean", include_self=False)
        return x + F.relu(self.update(torch.cat([x, summed, mean], dim=1)))


class _Graph(nn.Module):
    def __init__(self, features: int = 64, dim: int = 128, classes: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.layers = nn.ModuleList([MessagePassing(dim) for _ in range(3)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, edges)
        return self.head(h)


def graph_message_passing(batch_size: int, device: torch.device) -> Workload:
    """Node classification on a batch of random graphs (1,000 nodes and 8,000 edges each)."""
    model = _Graph().to(device)
    nodes, edges = 1000 * batch_size, 8000 * batch_size

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(nodes, 64, device=device)
        edge_index = torch.randint(0, nodes, (2, edges), device=device)
        return x, edge_index, torch.randint(0, 16, (nodes,), device=device)

    def loss(model: nn.Module, x: torch.Tensor, edges: torch.Tensor, y: torch.Tensor) -> Any:
        return F.cross_entropy(model(x, edges), y)

    return _workload(model, batch, loss, LAYERS["graph_message_passing"][1])


# ---- speech ------------------------------------------------------------------------------------


class _CtcModel(nn.Module):
    """Log-mel frames → two strided convolutions → a bidirectional GRU → characters."""

    def __init__(self, mels: int = 80, vocab: int = 32) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(mels, 256, 5, stride=2, padding=2),
            nn.GELU(),
            nn.Conv1d(256, 256, 5, stride=2, padding=2),
            nn.GELU(),
        )
        self.rnn = nn.GRU(256, 256, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(512, vocab)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.conv(frames).transpose(1, 2)
        x, _ = self.rnn(x)
        return self.head(x).log_softmax(-1)


def ctc_speech(batch_size: int, device: torch.device) -> Workload:
    """A speech recogniser trained with ``F.ctc_loss`` (labels shorter than the frames)."""
    model = _CtcModel().to(device)
    frames, label_length = 800, 60

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 80, frames, device=device)
        labels = torch.randint(1, 32, (batch_size, label_length), device=device)
        lengths = torch.randint(label_length // 2, label_length + 1, (batch_size,), device=device)
        return x, labels, lengths

    def loss(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor):
        log_probs = model(x).transpose(0, 1).float()  # (T, B, vocab)
        inputs = torch.full((x.shape[0],), log_probs.shape[0], dtype=torch.long, device=x.device)
        return F.ctc_loss(log_probs, labels, inputs, lengths, blank=0, zero_infinity=True)

    return _workload(model, batch, loss, LAYERS["ctc_speech"][1])


# ---- mixture of experts ------------------------------------------------------------------------


class MoE(nn.Module):
    """Top-k routing over experts: each expert runs on the tokens routed to it (sizes that
    depend on the router's values), and a load-balancing loss from ``bincount``."""

    def __init__(self, dim: int = 256, experts: int = 8, top_k: int = 2) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            for _ in range(experts)
        )
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = x.reshape(-1, x.shape[-1])
        probs = self.router(tokens).softmax(-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel():
                out.index_add_(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
        counts = torch.bincount(chosen.flatten(), minlength=len(self.experts)).float()
        balance = len(self.experts) * (counts / counts.sum() * probs.mean(0)).sum()
        return out.reshape_as(x), balance


class _MoeModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8000, 256)
        self.blocks = nn.ModuleList(MoE() for _ in range(2))
        self.head = nn.Linear(256, 8000)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(ids)
        aux = x.new_zeros(())
        for block in self.blocks:
            y, balance = block(x)
            x, aux = x + y, aux + balance
        return self.head(x), aux


def moe_top2(batch_size: int, device: torch.device) -> Workload:
    """A mixture-of-experts LM: top-2 of 8 experts, with a bincount load-balancing loss."""
    model = _MoeModel().to(device)

    def batch() -> tuple[torch.Tensor]:
        return (torch.randint(0, 8000, (batch_size, 128), device=device),)

    def loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        logits, aux = model(ids)
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten()) + 0.01 * aux

    return _workload(model, batch, loss, LAYERS["moe_top2"][1])


# ---- compiled, channels-last, 16-mixed, Inception ----------------------------------------------


def compiled_mlp(batch_size: int, device: torch.device) -> Workload:
    """An MLP compiled inside build: ``model = torch.compile(model)``."""
    model = nn.Sequential(
        nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 10)
    ).to(device)
    model = torch.compile(model)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randn(batch_size, 1024, device=device),
            torch.randint(0, 10, (batch_size,), device=device),
        )

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    return _workload(model, batch, loss, LAYERS["compiled_mlp"][1])


class ConvVAE(nn.Module):
    def __init__(self, latent: int = 128) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 64, 4, 2, 1),
            nn.SiLU(),
            nn.Conv2d(64, 128, 4, 2, 1),
            nn.GroupNorm(8, 128),
            nn.SiLU(),
            nn.Conv2d(128, 256, 4, 2, 1),
            nn.GroupNorm(8, 256),
            nn.SiLU(),
        )
        self.to_latent = nn.Conv2d(256, 2 * 4, 1)
        self.decoder = nn.Sequential(
            nn.Conv2d(4, 256, 3, padding=1),
            nn.SiLU(),
            nn.ConvTranspose2d(256, 128, 4, 2, 1),
            nn.GroupNorm(8, 128),
            nn.SiLU(),
            nn.ConvTranspose2d(128, 64, 4, 2, 1),
            nn.SiLU(),
            nn.ConvTranspose2d(64, 3, 4, 2, 1),
        )

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        mean, logvar = self.to_latent(self.encoder(x)).chunk(2, dim=1)
        z = mean + noise * torch.exp(0.5 * logvar)
        recon = self.decoder(z)
        kl = -0.5 * torch.mean(1 + logvar - mean.pow(2) - logvar.exp())
        return F.mse_loss(recon, x) + 1e-3 * kl


def vae_channels_last(batch_size: int, device: torch.device) -> Workload:
    """A convolutional VAE in channels-last memory format (model and inputs)."""
    model = ConvVAE().to(device).to(memory_format=torch.channels_last)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, 256, 256, device=device)
        noise = torch.randn(batch_size, 4, 32, 32, device=device)
        return (
            x.contiguous(memory_format=torch.channels_last),
            noise.contiguous(memory_format=torch.channels_last),
        )

    def loss(model: nn.Module, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return model(x, noise)

    return _workload(model, batch, loss, LAYERS["vae_channels_last"][1])


def conv3d_fp16(batch_size: int, device: torch.device) -> Workload:
    """3-D convolutions (a video or volume classifier) in 16-mixed, with a GradScaler."""
    model = _conv_net(3, 32).to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, 32, 96, 96, device=device)
        return x, torch.randint(0, 10, (batch_size,), device=device)

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    return _workload(model, batch, loss, LAYERS["conv3d_fp16"][1])


class _InceptionBlock(nn.Module):
    def __init__(self, channels: int, branch: int) -> None:
        super().__init__()

        def conv(c_in: int, c_out: int, k: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
            )

        self.b1 = conv(channels, branch, 1)
        self.b3 = nn.Sequential(conv(channels, branch, 1), conv(branch, branch, 3))
        self.b5 = nn.Sequential(conv(channels, branch // 2, 1), conv(branch // 2, branch, 5))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv(channels, branch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], dim=1)


def inception_fp32(batch_size: int, device: torch.device) -> Workload:
    """An Inception-style net of one's own (parallel 1/3/5 branches, concatenated), fp32."""
    blocks: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for i, branch in enumerate((32, 64, 64, 96)):
        blocks.append(_InceptionBlock(channels, branch))
        channels = 4 * branch
        if i % 2:
            blocks.append(nn.MaxPool2d(3, 2, 1))
    model = nn.Sequential(
        *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 1000)
    ).to(device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, 224, 224, device=device)
        return x, torch.randint(0, 1000, (batch_size,), device=device)

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    return _workload(model, batch, loss, LAYERS["inception_fp32"][1])


def lora_llama_1b(batch_size: int, device: torch.device) -> Workload:
    """A LoRA fine-tune as a user writes it: a 1.1 B Llama-shaped model in bfloat16, peft's
    adapters (r=16) on the attention projections, a tokenizer-style batch with an attention
    mask and explicit positions, 1,024 tokens."""
    import peft
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    adapters = peft.LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    model = peft.get_peft_model(model, adapters).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    length = 1024

    def batch() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (batch_size, length), device=device)
        positions = torch.arange(length, device=device).expand(batch_size, -1)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": positions,
            "labels": ids,
        }

    def loss(model: nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
        return model(**inputs).loss

    return _workload(model, batch, loss, LAYERS["lora_llama_1b"][1], optimizer)


assert all(callable(globals().get(name)) for name in LAYERS), "every layer has a builder"
