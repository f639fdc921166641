"""Recurrent layers over a grid of shapes, to pin cuDNN's workspace and reserve sizes
(``estimate/rnn.py``): cell, hidden size, layers, directions and sequence length vary, the
input width and vocabulary stay those of ``tests/layer_workloads.py``. Specs are
``tests/rnn_shapes.py:NAME``; ``SHAPES`` gives each one's batch size. Recorded on a GPU by
``tests/gpu/record_rnn_shapes.py``."""

from __future__ import annotations

from collections.abc import Callable

import torch

import vramscope
from layer_workloads import Recurrent, language_model

# name: (cell, hidden, layers, bidirectional, sequence length, batch size, training)
SHAPES: dict[str, tuple[str, int, int, bool, int, int, bool]] = {
    "lstm_h128_l1": ("LSTM", 128, 1, False, 64, 32, True),
    "lstm_h256_l1": ("LSTM", 256, 1, False, 64, 32, True),
    "lstm_h1024_l1": ("LSTM", 1024, 1, False, 64, 32, True),
    "lstm_h512_l1": ("LSTM", 512, 1, False, 64, 32, True),
    "lstm_h512_l3": ("LSTM", 512, 3, False, 64, 32, True),
    "lstm_h512_l1_b8": ("LSTM", 512, 1, False, 64, 8, True),
    "lstm_h512_l1_b128": ("LSTM", 512, 1, False, 64, 128, True),
    "lstm_h512_l1_s16": ("LSTM", 512, 1, False, 16, 32, True),
    "lstm_h512_l1_s256": ("LSTM", 512, 1, False, 256, 32, True),
    "lstm_h512_l1_bi": ("LSTM", 512, 1, True, 64, 32, True),
    "lstm_h512_l1_infer": ("LSTM", 512, 1, False, 64, 32, False),
    "gru_h256_l1": ("GRU", 256, 1, False, 64, 32, True),
    "gru_h1024_l1": ("GRU", 1024, 1, False, 64, 32, True),
    "gru_h512_l2": ("GRU", 512, 2, False, 64, 32, True),
    "gru_h512_l1_b128": ("GRU", 512, 1, False, 64, 128, True),
    "rnn_h512_l1": ("RNN", 512, 1, False, 64, 32, True),
    "rnn_h1024_l2": ("RNN", 1024, 2, False, 64, 32, True),
    "rnn_h256_l1_b128": ("RNN", 256, 1, False, 64, 128, True),
}


def _builder(name: str) -> Callable[[int, torch.device], vramscope.Workload]:
    cell, hidden, layers, bidirectional, seq, _, train = SHAPES[name]

    def build(batch_size: int, device: torch.device) -> vramscope.Workload:
        model = Recurrent(cell, hidden, layers, bidirectional=bidirectional, batch_first=True)
        return language_model(model, batch_size, device, train, seq)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"{cell}, hidden {hidden}, {layers} layer(s), sequence {seq}"
    return build


for _name in SHAPES:
    globals()[_name] = _builder(_name)
