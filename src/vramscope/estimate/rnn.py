"""cuDNN recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) on the emulated GPU.

On a GPU, torch runs these layers through cuDNN (``aten/src/ATen/native/cudnn/RNN.cpp``): the
module's weights are views into one flat buffer (``flatten_parameters`` when the module moves
to the GPU), one ``_cudnn_rnn`` call runs every layer and time step and keeps a *reserve*
buffer for backward, and ``_cudnn_rnn_backward`` returns the weight gradients as views into
one buffer too. A CPU build of torch has no cuDNN, so its LSTM would take the generic path
(an op per gate per time step, each saved for backward: +14 % allocated on a recorded
workload); a CUDA build on a machine without a GPU stops inside cuDNN. This module takes
the cuDNN path on both, without cuDNN:

* :class:`CudnnRnns` (a torch-function mode) answers ``torch._cudnn_rnn_flatten_weight``
  (one buffer, the weights made views into it) and ``torch._VF.lstm/gru/rnn_tanh/rnn_relu``
  as ``_cudnn_impl`` does: the flat buffer when the weights are laid out in it, the dropout
  state cached for the process, and under CUDA autocast the weights re-flattened into a new
  float16 buffer at every call (``AutocastRNN.cpp``: always float16, even in bf16-mixed);
* :data:`KERNELS` make the outputs of ``aten._cudnn_rnn`` and ``aten._cudnn_rnn_backward``
  with the shapes RNN.cpp gives them, and :func:`scratch` puts the buffers each allocates and
  frees inside among them, in RNN.cpp's order (below).

The sizes cuDNN itself chooses (:func:`cudnn_sizes`, :func:`dropout_state_bytes`) were
measured on an NVIDIA H200 with cuDNN 9.19 (torch 2.11): every allocation of the 7 recurrent
workloads of ``tests/layer_workloads.py`` (``tests/data/op_trace_h200_layer-*.json.gz``: LSTM
of 1 and 2 layers, float32 and float16, bidirectional with dropout, a packed sequence,
inference; a GRU and a tanh RNN) and of the 18 shapes of ``tests/rnn_shapes.py``
(``op_trace_h200_rnn-*``: LSTM, GRU and tanh RNN of hidden 128 to 1024, 1 to 3 layers, batch 8
to 128, 16 to 256 steps, one bidirectional, one inference; input width 256 throughout).
cuDNN documents no formula; what the recordings show:

* **reserve** (training only; from forward to the end of backward): per layer, direction
  and *row* (one time step of one sequence: a packed sequence has fewer rows than steps x
  batch) ``RESERVE_PER_ROW`` values of the hidden size -- LSTM 5, GRU 6, RNN 1 -- and for each
  layer but the last its output, in the input's dtype, plus 256 bytes; with dropout, a byte
  per 4 values of each inner layer's output. This reproduces all 23 recorded reserves to the
  byte. The dropout term is from one workload, the ReLU RNN is taken as the tanh one.
* **workspace** (forward, backward data and backward weights each allocate one and free it
  before returning; the same in inference): 8 MiB in any dtype (4 MiB more with 16-bit
  values: the float16 LSTM, one recording), then in the input's dtype a copy of the weight
  matrices (no biases; every layer after the first counted twice), per row and direction
  ``a x hidden + b`` values and per sequence, layer and direction ``c x hidden``
  (``WORKSPACE_PER_ROW``: LSTM 5, 256, 10; GRU 4, 512, 5; the RNN taken as the GRU), plus 256
  bytes and 8 per sequence (its length in and out). Batch 8 to 128 and 16 to 256 steps of
  the LSTM of hidden 512 separate the per-row and per-sequence parts, 1 to 3 layers the
  weights', float16 against float32 the fixed part. The rule is exact to the byte for 17
  recordings: the LSTMs of hidden 512 and 1024 (1 to 3 layers, every batch and length, float16
  and inference), every GRU (hidden 256 to 1024, 2 layers, batch 128), the RNN of hidden 512;
  the LSTM of hidden 256 is 32 KiB (0.14 %) short. The input width is 256 in all of them, so
  the 256 and 512 per row may be the input width's. The rule misses 6 shapes, which keep
  their measured values per row and direction (``WORKSPACE_MEASURED``): the bidirectional
  LSTMs (the rule 25 % and 37 % short; both take 4,320 per row and direction at hidden 256
  and 512, which other bidirectional shapes take as a floor), the small ones -- the LSTM of
  hidden 128 (50 % short), the tanh RNNs of hidden 256 (56 % short: another kernel, it seems)
  -- which other small shapes take from the nearest, and the 2-layer RNN of hidden 1024 (10 %
  over). Packed sequences have a rule of their own (``WORKSPACE_PACKED``, fitted on 402
  recorded training steps of every cell, 1 to 3 layers, one or two directions): 8 MiB per
  layer and direction, every weight matrix once, and per unit of hidden size a values per
  packed row and b per layer and sequence; exact for 366 of the 402, never under for a
  layer whose input is no wider than its hidden size, up to 26 % under for 9 wider ones. For unmeasured
  padded shapes near the rule's (hidden 256 to 1024, one direction) the rule should hold;
  elsewhere it is an extrapolation that may be off by tens of percent.
* **dropout state**: 48 KiB per multiprocessor (curand states of 1024 threads), 6,488,064
  bytes on the H200's 132 (as recorded once); made at the first call with dropout and cached
  for the process.

Their timing, as recorded: ``_cudnn_rnn`` allocates the contiguous sequence-major copy of
the input (batch-first or non-contiguous input), the output, hy, cy, the flat weights when
they are not (a copy at every call), the workspace, the reserve; then frees the workspace
and the copy. ``_cudnn_rnn_backward`` makes zeros for missing gradients of hy and cy (kept
to its end), then for the data pass copies of x and dy (where not contiguous), dx, dhx,
dcx, the workspace, freeing the workspace and the copies; for the weights pass x's copy
again, the weight gradients' flat buffer, the workspace again. With these, the 25 recorded
peaks are within 1.01 % (the float16 LSTM; the rest within 0.61 %: the caching allocator's
choice of blocks).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._mode_utils import no_dispatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from vramscope.estimate.profiles import GpuProfile
    from vramscope.estimate.recorder import Recorder

aten = torch.ops.aten
MiB = 1 << 20
# cuDNN's cudnnRNNMode_t, as torch passes it to _cudnn_rnn
RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
MODES = {"rnn_relu": RNN_RELU, "rnn_tanh": RNN_TANH, "lstm": LSTM, "gru": GRU}
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}
# Values the reserve keeps per layer, direction and row (a sequence's time step), in
# hidden-size units: LSTM 5 (the 4 gates and the cell state), GRU 6, RNN 1 (measured; the ReLU
# RNN taken as the tanh one). Each layer but the last keeps its output besides (1 more).
RESERVE_PER_ROW = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 5, GRU: 6}
RESERVE_SLACK = 256  # bytes cuDNN adds to the reserve, and to the workspace
# The dropout state: 48-byte random-number states of 1024 threads per multiprocessor
DROPOUT_STATE_PER_SM = 48 * 1024
# The workspace: a fixed part in every dtype (4 MiB more with 16-bit values), a copy of the
# weight matrices (the first layer's once, every further layer's twice), and per row and
# direction (a * hidden + b) values and per sequence, layer and direction c * hidden values
# (cell: (a, b, c)), all in the input's dtype; measured, the RNN's taken as the GRU's.
WORKSPACE_FIXED, WORKSPACE_HALF = 8 * MiB, 4 * MiB
WORKSPACE_PER_ROW = {LSTM: (5, 256, 10), GRU: (4, 512, 5), RNN_TANH: (4, 512, 5)}
# Shapes the rule above misses, (mode, hidden, layers, directions): values per row and
# direction beyond the fixed part and the weights, as measured (64 steps). Bidirectional
# layers take at least the bidirectional LSTMs' 4,320 (the same at hidden 256 and 512); small
# ones (RNN of hidden 256 or less, LSTM and GRU of 128 or less) the nearest measured small one.
WORKSPACE_MEASURED = {
    (LSTM, 128, 1, 1): 2960,
    (RNN_TANH, 256, 1, 1): 3864,
    (RNN_TANH, 256, 2, 1): 5104,
    (RNN_TANH, 1024, 2, 1): 4000,
    (LSTM, 256, 2, 2): 4320,
    (LSTM, 512, 1, 2): 4320,
}
# Packed sequences, fitted on 402 training steps recorded on an H200 (cuDNN 9.19; LSTM, GRU
# and tanh RNN, hidden 128 to 1,024, 1 to 3 layers, one or two directions, float32 and
# float16, ``tests/data/workspace_sweep_2_h200.json.gz``): 8 MiB per layer and direction,
# every weight matrix once, and per unit of hidden size a values per packed row and b per
# layer and sequence of the largest batch ((cell, directions): (a, b)); a tanh RNN of two
# directions and more than one layer takes 8 per row. Exact for 366 of the 402; over none of
# the layers whose input is no wider than the hidden size; under, by up to 26 %, for 9 of
# those with a wider input (another engine: an LSTM with input 4 x hidden, an RNN 2 x).
WORKSPACE_PACKED = {
    (LSTM, 1): (4, 6),
    (LSTM, 2): (12, 16),
    (GRU, 1): (3, 3),
    (GRU, 2): (10, 10),
    (RNN_TANH, 1): (2, 1),
    (RNN_TANH, 2): (6, 6),
}
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.float64)


def dropout_state_bytes(profile: GpuProfile) -> int:
    """``cudnnDropoutGetStatesSize``: 6,488,064 bytes on the H200's 132 multiprocessors."""
    return DROPOUT_STATE_PER_SM * profile.multiprocessors


def weight_matrices(
    mode: int, *, inputs: int, hidden: int, layers: int, directions: int
) -> list[int]:
    """Elements of the input and recurrent weight matrices of each layer (no biases)."""
    widths = [inputs] + [hidden * directions] * (layers - 1)
    return [directions * GATES[mode] * hidden * (width + hidden) for width in widths]


def _workspace_per_row(mode: int, hidden: int, layers: int, directions: int) -> tuple[int, bool]:
    """Values per row and direction of a shape the rule misses (``WORKSPACE_MEASURED``) and
    whether it was measured at that shape (else a floor); (0, False) where the rule holds."""
    key = (mode, hidden, layers, directions)
    if key in WORKSPACE_MEASURED:
        return WORKSPACE_MEASURED[key], True
    if directions > 1:
        return max(v for k, v in WORKSPACE_MEASURED.items() if k[3] > 1), False
    if hidden > (256 if mode == RNN_TANH else 128):
        return 0, False
    small = [k for k in WORKSPACE_MEASURED if k[3] == 1 and k[1] <= 256]
    same = [k for k in small if k[0] == mode] or small
    key = min(same, key=lambda k: (abs(k[2] - layers), abs(k[1] - hidden)))
    return WORKSPACE_MEASURED[key], False


def cudnn_sizes(
    mode: int,
    *,
    steps: int,
    batch: int,
    hidden: int,
    layers: int,
    directions: int,
    itemsize: int,
    train: bool,
    inputs: int | None = None,
    rows: int | None = None,
    packed: bool = False,
    dropout: bool = False,
) -> dict[str, int]:
    """Bytes ``cudnnGetRNNTempSpaceSizes`` gives (cuDNN 9.19 on an H200): ``reserve`` (kept
    from forward to backward while training) and ``workspace`` (inside each call: forward,
    backward data and backward weights each take one of this size). ``rows``: the sequence
    steps of all sequences (the sum of a packed sequence's batch sizes; steps x batch
    otherwise); ``inputs``: the first layer's input size (the hidden size if not given)."""
    rows = steps * batch if rows is None else rows
    inputs = hidden if inputs is None else inputs
    values = directions * rows * hidden
    reserve = 0
    if train:
        per_row = layers * RESERVE_PER_ROW[mode] + layers - 1
        reserve = values * per_row * itemsize + RESERVE_SLACK
        if dropout and layers > 1:  # the dropout mask between layers
            reserve += (layers - 1) * values // 4
    matrices = weight_matrices(
        mode, inputs=inputs, hidden=hidden, layers=layers, directions=directions
    )
    weights = sum(matrices) + sum(matrices[1:])
    if packed:
        cell = RNN_TANH if mode == RNN_RELU else mode
        a, b = WORKSPACE_PACKED[(cell, directions)]
        if cell == RNN_TANH and directions == 2 and layers > 1:
            a = 8
        scratch = hidden * (a * rows + b * layers * batch)
        workspace = WORKSPACE_FIXED * layers * directions + (sum(matrices) + scratch) * itemsize
        return {"reserve": reserve, "workspace": workspace + RESERVE_SLACK}
    else:
        cell = RNN_TANH if mode == RNN_RELU else mode
        a, b, c = WORKSPACE_PER_ROW[cell]
        scratch = directions * (rows * (a * hidden + b) + batch * layers * c * hidden)
        measured, exact = _workspace_per_row(cell, hidden, layers, directions)
        if exact or measured * rows * directions > scratch:
            scratch = measured * rows * directions
        slack = RESERVE_SLACK + 8 * batch  # and per sequence, its length in and out
    fixed = WORKSPACE_FIXED + (WORKSPACE_HALF if itemsize == 2 else 0)
    return {
        "reserve": reserve,
        "workspace": fixed + (weights + scratch) * itemsize + slack,
    }


def _layout(input: Any, batch_first: bool, batch_sizes: Any) -> tuple[int, int, int]:
    """(time steps, batch, input size) of an RNN input, as ``TensorDescriptorListParams``."""
    if len(batch_sizes):
        return len(batch_sizes), int(batch_sizes[0]), input.shape[1]
    if batch_first:
        return input.shape[1], input.shape[0], input.shape[2]
    return input.shape[0], input.shape[1], input.shape[2]


def _call_sizes(
    input: Any,
    rnn_mode: int,
    hidden: int,
    layers: int,
    batch_first: bool,
    bidirectional: bool,
    batch_sizes: Any,
    train: bool,
    dropout: float = 0.0,
) -> dict[str, int]:
    """:func:`cudnn_sizes` for one call of the ops below."""
    steps, batch, inputs = _layout(input, batch_first, batch_sizes)
    packed = bool(len(batch_sizes))
    return cudnn_sizes(
        rnn_mode,
        steps=steps,
        batch=batch,
        hidden=hidden,
        layers=layers,
        directions=2 if bidirectional else 1,
        itemsize=input.element_size(),
        train=train,
        inputs=inputs,
        rows=int(sum(int(n) for n in batch_sizes)) if packed else None,
        packed=packed,
        dropout=train and dropout > 0,
    )


# ---- the two ops, as RNN.cpp makes their outputs ---------------------------------------------


def _empty(mode: Any, shape: Any, dtype: torch.dtype, device: Any, stride: Any = None) -> Any:
    """A new fake tensor made by the fake mode itself (not recorded as an op of its own)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if stride is None:
        stride, step = [], 1
        for size in reversed(list(shape)):
            stride.insert(0, step)
            step *= max(size, 1)
    return FakeTensorMode.dispatch(
        mode,
        aten.empty_strided.default,
        (),
        (list(shape), list(stride)),
        {"dtype": dtype, "device": device},
    )


def cudnn_rnn(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten._cudnn_rnn``: (output, hy, cy, reserve, weight_buf)."""
    (input, weight, _, weight_buf, hx, cx, rnn_mode, hidden, proj, layers, batch_first) = args[:11]
    train, bidirectional, batch_sizes = args[12], args[13], args[14]
    steps, batch, _ = _layout(input, batch_first, batch_sizes)
    directions = 2 if bidirectional else 1
    out_size = (proj or hidden) * directions
    device = input.device
    if len(batch_sizes):
        output = _empty(mode, (input.shape[0], out_size), input.dtype, device)
    elif batch_first:  # made sequence-major, then transposed in place
        output = _empty(
            mode, (batch, steps, out_size), input.dtype, device, (out_size, batch * out_size, 1)
        )
    else:
        output = _empty(mode, (steps, batch, out_size), input.dtype, device)
    hy = _empty(mode, (layers * directions, batch, proj or hidden), hx.dtype, device)
    cy = _empty(
        mode,
        (layers * directions, batch, hidden) if cx is not None else (0,),
        hx.dtype,
        device,
    )
    sizes = _call_sizes(
        input, rnn_mode, hidden, layers, batch_first, bidirectional, batch_sizes, train, args[11]
    )
    reserve = _empty(mode, (sizes["reserve"],), torch.uint8, device)
    if weight_buf is None:  # weights not in one buffer: copied into a new one at every call
        weight_buf = _empty(mode, (sum(w.numel() for w in weight),), input.dtype, device)
    return output, hy, cy, reserve, weight_buf


def cudnn_rnn_backward(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten._cudnn_rnn_backward``: (dx, dhx, dcx, weight gradients as views of one buffer)."""
    input, weight, _, weight_buf, hx, cx = args[:6]
    grad_output, grad_hy, grad_cy = args[7:10]
    output_mask = args[21]
    device = input.device
    if grad_output is None and grad_hy is None and grad_cy is None:
        return None, None, None, [None] * len(weight)
    dx = _empty(mode, input.shape, input.dtype, device)
    dhx = _empty(mode, hx.shape, hx.dtype, device)
    dcx = _empty(mode, cx.shape, cx.dtype, device) if cx is not None else None
    grads: list[Any] = []
    if output_mask[3]:
        flat = _empty(mode, weight_buf.shape, weight_buf.dtype, device)
        offset = 0
        for w in weight:
            grads.append(flat.narrow(0, offset, w.numel()).view(w.shape))
            offset += w.numel()
    return dx, dhx, dcx, grads


KERNELS = {aten._cudnn_rnn.default: cudnn_rnn, aten._cudnn_rnn_backward.default: cudnn_rnn_backward}


def scratch(recorder: Recorder, func: Any, args: tuple[Any, ...], out: Any) -> None:
    """What the two ops allocate and free inside, in RNN.cpp's order around their outputs
    (as the H200 recordings show it). Both run cuDNN: its kernels count in the context."""
    if func in KERNELS:
        recorder.libraries.add("cudnn" if func is aten._cudnn_rnn.default else "cudnn_backward")
    if func is aten._cudnn_rnn.default:
        input, batch_first, train = args[0], args[10], args[12]
        hidden, layers, bidirectional, batch_sizes = args[7], args[9], args[13], args[14]
        workspace = _call_sizes(
            input, args[6], hidden, layers, batch_first, bidirectional, batch_sizes, train
        )["workspace"]
        x = _copy_bytes(input, batch_first and not len(batch_sizes))
        output, hy, cy, reserve, weight_buf = out
        # x made sequence-major and contiguous, the outputs, the weights copied into one
        # buffer if they were not (made here), the workspace, the reserve; the workspace is
        # freed after the call, then x
        recorder.kernel_sequence(
            [
                ("alloc", "x", x),
                ("out", output),
                ("out", hy),
                ("out", cy),
                ("out", weight_buf if args[3] is None else None),
                ("alloc", "workspace", workspace),
                ("out", reserve),
                ("free", "workspace"),
                ("free", "x"),
            ],
            "temporary",
            "cudnn rnn",
        )
        return
    input, hx, cx, output = args[0], args[4], args[5], args[6]
    grad_output, grad_hy, grad_cy = args[7:10]
    batch_first, hidden, layers = args[14], args[11], args[13]
    bidirectional, batch_sizes = args[17], args[18]
    if grad_output is None and grad_hy is None and grad_cy is None:
        return
    workspace = _call_sizes(
        input, args[10], hidden, layers, batch_first, bidirectional, batch_sizes, True
    )["workspace"]
    sequence_major = batch_first and not len(batch_sizes)
    x = _copy_bytes(input, sequence_major)
    dy = _copy_bytes(grad_output, sequence_major) if grad_output is not None else 0
    dx, dhx, dcx, grads = out
    weights = grads[0] if grads and grads[0] is not None else None
    plan: list[tuple[Any, ...]] = [
        # the missing gradients as zeros, kept to the end of the op
        ("alloc", "dy zeros", _nbytes(output) if grad_output is None else 0),
        ("alloc", "dhy zeros", _nbytes(hx) if grad_hy is None else 0),
        ("alloc", "dcy zeros", _nbytes(cx) if cx is not None and grad_cy is None else 0),
        # backward data: x and dy contiguous and sequence-major, dx, dhx, dcx, the workspace
        ("alloc", "x", x),
        ("alloc", "dy", dy),
        ("out", dx),
        ("out", dhx),
        ("out", dcx),
        ("alloc", "workspace", workspace),
        ("free", "workspace"),
        ("free", "dy"),
        ("free", "x"),
    ]
    if weights is not None:
        # backward weights: x again, the weight gradients' buffer, the workspace again
        plan += [
            ("alloc", "x again", x),
            ("out", weights),
            ("alloc", "workspace again", workspace),
            ("free", "workspace again"),
            ("free", "x again"),
        ]
    plan += [("free", "dcy zeros"), ("free", "dhy zeros"), ("free", "dy zeros")]
    recorder.kernel_sequence(plan, "temporary", "cudnn rnn backward")


def _copy_bytes(t: Any, transposed: bool) -> int:
    """Bytes of the contiguous copy RNN.cpp makes of ``t`` (sequence-major if
    ``transposed``), 0 where it is contiguous already."""
    sizes, strides = list(t.shape), list(t.stride())
    if transposed:
        sizes[:2], strides[:2] = sizes[1::-1], strides[1::-1]
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return _nbytes(t)
        expected *= size
    return 0


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if t is not None else 0


# ---- the module-level entry points ------------------------------------------------------------


class CudnnRnns(TorchFunctionMode):
    """``nn.LSTM``/``nn.GRU``/``nn.RNN`` on fake CUDA tensors take cuDNN's path."""

    def __init__(
        self,
        profile: GpuProfile,
        recorder: Recorder,
        shadows: Any = None,
        sized_by: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__()
        self.profile = profile
        self.recorder = recorder
        self.shadows = shadows if shadows is not None else {}  # real values of small tensors
        self._sized_by = sized_by  # told of a host tensor whose values made a size
        self.dropout_state: Any = None
        vf = torch._C._VariableFunctions
        self._entries = {getattr(vf, name): name for name in MODES}
        self._flatten = vf._cudnn_rnn_flatten_weight
        self._pad = vf._pad_packed_sequence
        self._pack = vf._pack_padded_sequence

    def __enter__(self) -> CudnnRnns:
        # nn.RNNBase.flatten_parameters asks this before flattening; a CPU build says no
        cudnn = torch.backends.cudnn
        self._is_acceptable = cudnn.is_acceptable
        original = self._is_acceptable

        def is_acceptable(tensor: torch.Tensor) -> bool:
            if _fake_cuda(tensor):
                return bool(cudnn.enabled) and tensor.dtype in _CUDNN_DTYPES
            return original(tensor)

        cudnn.is_acceptable = is_acceptable
        # it also compares data pointers, which fake tensors do not have
        rnn_base = torch.nn.modules.rnn.RNNBase
        self._flatten_parameters = rnn_base.flatten_parameters
        original_flatten = self._flatten_parameters

        def flatten_parameters(module: Any) -> None:
            weights = module._flat_weights
            if not weights or not all(_fake_cuda(w) for w in weights):
                return original_flatten(module)
            if (
                len(weights) != len(module._flat_weights_names)
                or any(w.dtype != weights[0].dtype or not is_acceptable(w) for w in weights)
                or len({(w.untyped_storage()._cdata, w.storage_offset()) for w in weights})
                != len(weights)
            ):
                return None
            with torch.no_grad():
                _flatten(weights)
            return None

        rnn_base.flatten_parameters = flatten_parameters
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.backends.cudnn.is_acceptable = self._is_acceptable
        torch.nn.modules.rnn.RNNBase.flatten_parameters = self._flatten_parameters
        self.dropout_state = None
        return super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is self._flatten and args and _fake_cuda(args[0][0]):
            return _flatten(*args)
        if func is self._pack and len(args) > 1 and self._values(args[1]) is not None:
            if self._sized_by is not None:
                self._sized_by(args[1])
            return self._pack_padded(args[0], self._values(args[1]), *args[2:], **kwargs)
        if func is self._pad and len(args) > 1 and self._values(args[1]) is not None:
            return _pad_packed(args[0], self._values(args[1]), *args[2:], **kwargs)
        name = self._entries.get(func)
        if name is not None:
            result = self._rnn(name, args)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)

    def _values(self, t: Any) -> torch.Tensor | None:
        """The real values of a small host tensor, when the trace has them."""
        known = self.shadows.get(t) if isinstance(t, torch.Tensor) else None
        if known is None and getattr(t, "constant", None) is not None:
            known = t.constant
        return known

    def _pack_padded(self, input: Any, lengths: torch.Tensor, batch_first: bool) -> Any:
        """``_pack_padded_sequence`` (PackedSequence.cpp) from the lengths' real values: one
        row per sequence step, and each step's batch size on the host (its values kept for
        the recurrent layer and for unpacking); backward makes a zero gradient of the input
        and copies the rows in, as ``_pack_padded_sequence_backward`` does."""
        steps = [int(n) for n in lengths.tolist()]
        sizes = [sum(1 for n in steps if n > t) for t in range(max(steps, default=0))]
        data = _Pack.apply(input, sum(steps))
        batch_sizes = torch.empty(len(sizes), dtype=torch.int64)
        with no_dispatch():  # a real tensor, not one of the trace
            values = torch.tensor(sizes, dtype=torch.int64)
        with contextlib.suppress(TypeError):
            self.shadows[batch_sizes] = values
        return data, batch_sizes

    def _accepts(self, input: Any) -> bool:
        """``use_cudnn`` in ATen/native/RNN.cpp."""
        if not (_fake_cuda(input) and torch.backends.cudnn.enabled and input.numel()):
            return False
        if input.dtype == torch.bfloat16:  # cuDNN 9.13+ on sm80+
            return self.profile.sm >= 80
        return input.dtype in _CUDNN_DTYPES

    def _rnn(self, name: str, args: tuple[Any, ...]) -> Any:
        input, second = args[0], args[1]
        batch_sizes: list[int] = []
        if isinstance(second, torch.Tensor) and second.dtype == torch.int64 and second.dim() == 1:
            # a packed sequence: (data, batch_sizes, hx, params, ...), no batch_first
            known = self.shadows.get(second)
            if known is None or not known.numel():
                return NotImplemented
            batch_sizes = [int(n) for n in known.tolist()]
            args = (input, *args[2:], False)
        if not self._accepts(input):
            return NotImplemented
        hx = args[1]
        params, has_biases, layers, dropout, train, bidirectional, batch_first = args[2:9]
        if name == "lstm":
            hx, cx = hx
        else:
            cx = None
        hidden, proj = hx.shape[2], 0
        if cx is not None and cx.shape[2] != hx.shape[2]:
            hidden, proj = cx.shape[2], hx.shape[2]
        stride0 = (4 if has_biases else 2) + (1 if proj else 0)
        weight_buf = _weight_buf(params)
        dropout_state = None
        if train and dropout > 0:
            if self.dropout_state is None:  # cached for the process, made at first use
                self.dropout_state = torch.empty(
                    dropout_state_bytes(self.profile), dtype=torch.uint8, device=input.device
                )
                self.recorder.retag(self.dropout_state.untyped_storage(), "workspace")
            dropout_state = self.dropout_state
        weights = list(params)
        if torch.is_autocast_enabled("cuda") and params[0].dtype != torch.float16:
            # AutocastRNN.cpp: float16 weights re-flattened into a new buffer at every call
            # (autograd sees the copies), float16 input and states
            weight_buf = torch.zeros(
                sum(w.numel() for w in params), dtype=torch.float16, device=input.device
            )
            offset = 0
            for w in params:  # each view made just before its copy, as autograd needs
                weight_buf.narrow(0, offset, w.numel()).view(w.shape).copy_(w)
                offset += w.numel()
            weights = _views(weight_buf, params)
            weight_buf = weight_buf.detach()  # gradients flow through the views
            input, hx = input.half(), hx.half()
            cx = cx.half() if cx is not None else None
        with torch.autocast("cuda", enabled=False):
            output, hy, cy, _, _ = aten._cudnn_rnn(
                input,
                weights,
                stride0,
                weight_buf,
                hx,
                cx,
                MODES[name],
                hidden,
                proj,
                layers,
                batch_first,
                dropout,
                train,
                bidirectional,
                batch_sizes,
                dropout_state,
            )
        return (output, hy, cy) if name == "lstm" else (output, hy)


class _Pack(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.input_shape = input.shape
        return input.new_empty((rows, *input.shape[2:]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.new_zeros(ctx.input_shape), None


def _pad_packed(
    data: torch.Tensor,
    batch_sizes: torch.Tensor,
    batch_first: bool,
    padding_value: float,
    total_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_pad_packed_sequence`` (PackedSequence.cpp) with the batch sizes' real values: a
    padded output filled step by step from the packed data, and each sequence's length."""
    sizes = [int(n) for n in batch_sizes.tolist()]
    batch = sizes[0] if sizes else 0
    output = data.new_full((total_length, batch, *data.shape[1:]), padding_value)
    offset = 0
    for step, size in enumerate(sizes):
        output[step, :size] = data[offset : offset + size]
        offset += size
    lengths = [sum(1 for size in sizes if size > b) for b in range(batch)]
    if batch_first:
        output = output.transpose(0, 1)
    return output, torch.tensor(lengths, dtype=torch.int64)


def _fake_cuda(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) and t.fake_device.type == "cuda"


def _views(buf: torch.Tensor, params: Any) -> list[torch.Tensor]:
    views, offset = [], 0
    for w in params:
        views.append(buf.narrow(0, offset, w.numel()).view(w.shape))
        offset += w.numel()
    return views


def _flatten(weights: Any, *_: Any) -> torch.Tensor:
    """``_cudnn_rnn_flatten_weight``: one buffer of every weight (cuDNN's weight space,
    taken as their sum), each weight made a view into it."""
    first = weights[0]
    buf = torch.zeros(sum(w.numel() for w in weights), dtype=first.dtype, device=first.device)
    with torch.no_grad():
        for view, w in zip(_views(buf, weights), weights, strict=True):
            w.set_(view)  # values do not matter; the copy is left out
    return buf


def _weight_buf(params: Any) -> torch.Tensor | None:
    """``try_get_weight_buf``: the flat buffer when every weight is a view into one storage,
    in order and packed; None otherwise (cuDNN then copies them at every call)."""
    first = params[0]
    storage = first.untyped_storage()
    offset = first.storage_offset()
    if offset != 0:
        return None
    for w in params:
        if w.untyped_storage()._cdata != storage._cdata or w.storage_offset() != offset:
            return None
        if not w.is_contiguous():
            return None
        offset += w.numel()
    with contextlib.suppress(RuntimeError):
        return first.new_empty(0).set_(storage, 0, (offset,), (1,))
    return None
