"""The estimator's fast paths (``estimate/trace.py``: the fake-tensor cache key and cache hits,
foreach ops; ``estimate/estimator.py``: the peak's live blocks) give the numbers the plain
paths give."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vramscope.estimate import trace
from vramscope.estimate.estimator import _ALLOC, _FREE, _KIND, _state_at, estimate

TIMINGS = {"seconds", "trace_seconds", "build_seconds", "step_seconds", "created_at"}


def _numbers(report) -> dict:
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMINGS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(report.to_dict())


@pytest.mark.parametrize(
    ("spec", "batch", "precision"),
    [("example:gpt", 8, "16-mixed"), ("example:cnn", 32, "bf16-mixed")],
)
def test_the_fast_paths_change_no_number(monkeypatch, spec, batch, precision):
    available = dict(trace.FAST_PATHS)
    fast = estimate(spec, batch, gpu="h200", precision=precision)
    assert available == trace.FAST_PATHS, "a self-check turned a fast path off"
    for name in trace.FAST_PATHS:
        monkeypatch.setitem(trace.FAST_PATHS, name, False)
    slow = estimate(spec, batch, gpu="h200", precision=precision)
    assert _numbers(slow) == _numbers(fast)


def test_every_fast_key_and_wrapper_matches_torchs(monkeypatch):
    """Compare every key with torch's ``_cache_key`` and every fast wrapper with the
    ``FakeTensor`` constructor for a whole estimate: one difference would turn them off."""
    if not (trace.FAST_PATHS["key"] and trace.FAST_PATHS["wrap"]):
        pytest.skip("this torch's fake-tensor cache differs: the fast paths are off")
    monkeypatch.setattr(trace, "_FAST_KEY_CHECKS", 10**9)
    monkeypatch.setattr(trace, "_WRAP_CHECKS", 10**9)
    estimate("example:gpt", 4, gpu="h200", precision="16-mixed")
    assert trace.FAST_PATHS["key"] and trace.FAST_PATHS["wrap"]


def test_the_fast_key_is_torchs_key_for_unusual_layouts():
    if not trace.FAST_PATHS["key"]:
        pytest.skip("this torch's fake-tensor cache key differs: the fast key is off")
    from torch._subclasses._fake_tensor_utils import _CacheKeyState

    aten = torch.ops.aten
    real = torch.ones(2)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        nchw = torch.empty(2, 3, 4, 5)
        nhwc = nchw.to(memory_format=torch.channels_last)
        ncdhw = torch.empty(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d)
        strided = torch.empty(6, 8).t()[1:]
        calls = [
            (aten.add.Tensor, (nhwc, nchw), {"alpha": 2}),
            (aten.mul.Scalar, (ncdhw, 1.5), {}),
            (aten.clone.default, (strided,), {"memory_format": torch.contiguous_format}),
            (aten._to_copy.default, (nchw,), {"dtype": torch.bfloat16, "device": None}),
            (aten.cat.default, ([nchw, nhwc], 1), {}),
            (aten._foreach_add.Scalar, ([nchw, strided, ncdhw], True), {}),
            (aten.view.default, (nchw, [6, 20]), {}),
        ]
        for func, args, kwargs in calls:
            key = FakeTensorMode._cache_key(mode, _CacheKeyState(None), func, args, kwargs)
            assert trace._fast_cache_key(mode, func, args, kwargs) == key.key, func
        constant = torch.tensor(2.0)  # a fake tensor that keeps its value
        # torch's own method decides about real tensors and constants (it does not cache them)
        for unusual in (real, constant):
            assert trace._fast_cache_key(mode, aten.add.Tensor, (unusual, nchw), {}) is None


def test_the_peak_state_is_rebuilt_from_the_history():
    history = [
        (_ALLOC, 1, 512),
        (_KIND, 1, "parameter"),
        (_KIND, 2, "temporary"),
        (_ALLOC, 2, 1024),
        (_KIND, 3, "temporary"),
        (_ALLOC, 3, 2048),
        (_KIND, 3, "activation"),
        (_FREE, 2, None),
        (_KIND, 4, "temporary"),
        (_ALLOC, 4, 4096),
    ]
    assert _state_at(history, 6) == (
        {1: 512, 2: 1024, 3: 2048},
        {1: "parameter", 2: "temporary", 3: "temporary"},
    )
    assert _state_at(history, len(history)) == (
        {1: 512, 3: 2048, 4: 4096},
        {1: "parameter", 3: "activation", 4: "temporary"},
    )
