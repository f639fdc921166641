"""Ops whose fake (meta) kernel does not follow their CUDA kernel, and ops with no fake kernel.

A fake tensor's output comes from the op's meta function. Most follow the CUDA kernel, but
some check rules the CUDA kernel no longer has, or have no meta function at all:

* :data:`KERNELS`: ``aten._grouped_mm`` (the grouped GEMM of mixture-of-experts layers,
  which transformers 5 runs by default). Its meta function still demands bfloat16, as the
  first CUDA kernel did; since torch 2.9 the CUDA kernel also takes float32 and float16
  (through a loop of ``mm`` per group) and pads the output's rows to 16 bytes for TMA
  (``GroupedMMUtils.h``). Outputs are made by those rules.
* The gradients of ``mse_loss``, ``smooth_l1_loss`` and ``huber_loss``: the kernels make
  them with ``zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT)`` (``Loss.cpp``, on every
  device: contiguous, whatever the input's layout), where the meta functions keep the
  input's (a channels-last input's gradient stayed channels-last, and what follows it in
  backward took other layouts and copies: a channels-last VAE's reconstruction loss).
* ``_c10d_functional.wait_tensor``: the wait for a functional collective (DTensor's
  redistributions) returns its input (``Functional.cpp``); its meta function makes a new
  tensor, which no GPU allocates. :data:`WAIT_HOOKS` are told of each wait, and
  :data:`COLLECTIVE_HOOKS` of each functional all-gather and reduce-scatter once its output
  is made (what a backend allocates besides: gloo's copies).
* :func:`run_on_cpu`: an op without a fake kernel (``_ctc_loss`` on CUDA, a custom op of a
  library) runs its CPU kernel on real tensors of its inputs' shapes — their real values
  where the trace has them, zeros otherwise — and its outputs become fake tensors of the
  same shapes, dtypes and strides on the emulated GPU. torch's own fallback would run the
  op on the (absent) GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch

from vramscope.estimate.recorder import TraceError, on_meta
from vramscope.estimate.shadows import fits_shadow

aten = torch.ops.aten

_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# an op run on the CPU for its output shapes takes at most this much host memory
CPU_FALLBACK_LIMIT = 1 << 30


def _empty_strided(mode: Any, shape: Any, stride: Any, dtype: torch.dtype, device: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode.dispatch(
        mode,
        aten.empty_strided.default,
        (),
        (tuple(shape), tuple(stride)),
        {"dtype": dtype, "device": device},
    )


def grouped_mm(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`` as CUDA runs
    it: float32, bfloat16 or float16 inputs, the output in ``mat_a``'s dtype, its last
    dimension's stride padded to 16 bytes."""
    names = ("mat_a", "mat_b", "offs", "bias", "out_dtype")
    given = dict(zip(names, args, strict=False)) | kwargs
    a, b, offs = given["mat_a"], given["mat_b"], given.get("offs")
    out_dtype = given.get("out_dtype") or a.dtype
    for name, mat in (("mat_a", a), ("mat_b", b)):
        if mat.dtype not in _GROUPED_MM_DTYPES:
            raise RuntimeError(
                f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {mat.dtype}"
            )
        _grouped_mm_strides(mat)
    if out_dtype != a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if a.dim() == 2 and b.dim() == 2:
        size = [offs.shape[0], a.shape[0], b.shape[1]]
    elif a.dim() == 2:
        size = [a.shape[0], b.shape[-1]]
    elif b.dim() == 2:
        size = [a.shape[1], b.shape[1]]
    else:
        size = [a.shape[0], a.shape[1], b.shape[-1]]
    alignment = 16 // torch.empty((), dtype=out_dtype, device="meta").element_size()
    padded = -(-size[-1] // alignment) * alignment
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return _empty_strided(mode, size, stride, out_dtype, a.device)


def _grouped_mm_strides(mat: Any) -> None:
    """CUDA's grouped GEMM reads each matrix row- or column-major, its leading stride a
    multiple of 16 bytes: a ``[E, in, out]`` weight with ``out`` not a multiple of 4 float32
    is refused (seen so on an H200), one stored ``[E, out, in]`` and transposed is not. (A
    matrix of neither layout, an expanded gradient, is left to the kernel.)"""
    sizes, strides = mat.shape[-2:], mat.stride()[-2:]
    if strides[0] == 1 and strides[1] >= max(1, sizes[0]):
        leading = strides[1]
    elif strides[1] == 1 and strides[0] >= max(1, sizes[1]):
        leading = strides[0]
    else:
        return
    if leading % (16 // mat.element_size()):
        raise RuntimeError("strides should be multiple of 16 bytes")


def _values(mode: Any, t: Any) -> list[int] | None:
    """The values of a small integer tensor (its shadow), or of a list; None if unknown."""
    if isinstance(t, (list, tuple)):
        return [int(v) for v in t]
    shadow = mode.shadows.get(t) if isinstance(t, FakeTensor) else None
    if shadow is None:
        return None
    with no_dispatch():
        return [int(v) for v in shadow.reshape(-1).tolist()]


def use_cudnn_ctc_loss(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``aten._use_cudnn_ctc_loss``: whether CUDA's CTC loss runs cuDNN's kernel
    (``LossCTC.cpp``): blank 0, 1-D int32 targets (on the CPU, for the list overload), float32
    3-D log-probabilities, every input as long as the longest, targets under 256 and no
    longer than their inputs. Lengths without known values: the native kernel (it keeps
    more: its log-alpha)."""
    log_probs, targets, input_lengths, target_lengths = args[:4]
    blank = args[4] if len(args) > 4 else kwargs.get("blank", 0)
    tensor_lengths = isinstance(input_lengths, torch.Tensor)
    ok = (
        torch.backends.cudnn.enabled
        and blank == 0
        and targets.dim() == 1
        and log_probs.dtype == torch.float32
        and targets.dtype == torch.int32
        and log_probs.dim() == 3
        and targets.is_contiguous()
    )
    if tensor_lengths:
        ok = ok and input_lengths.dtype == target_lengths.dtype == torch.int32
    else:
        ok = ok and getattr(targets, "fake_device", targets.device).type == "cpu"
    if not ok:
        return False
    inputs, lengths = _values(mode, input_lengths), _values(mode, target_lengths)
    if inputs is None or lengths is None:
        return False
    longest = log_probs.shape[0]
    if not tensor_lengths and any(n != longest for n in inputs):
        return False
    return all(t < 256 and t <= i for t, i in zip(lengths, inputs, strict=False))


def cudnn_ctc_loss(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten._cudnn_ctc_loss``: (costs of each sequence, the gradient, computed in the
    forward: ``empty_like(log_probs)``)."""
    log_probs = args[0]
    device = log_probs.device
    costs = _empty_strided(mode, (log_probs.shape[1],), (1,), log_probs.dtype, device)
    shape = tuple(log_probs.shape)
    stride = (shape[1] * shape[2], shape[2], 1)
    grad = _empty_strided(mode, shape, stride, log_probs.dtype, device)
    return costs, grad


def _contiguous(mode: Any, shape: Any, like: Any) -> Any:
    shape = tuple(int(n) for n in shape)
    stride, step = [], 1
    for n in reversed(shape):
        stride.insert(0, step)
        step *= max(n, 1)
    return _empty_strided(mode, shape, stride, like.dtype, like.device)


def _loss_backward(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten.{mse,smooth_l1,huber}_loss_backward(grad_output, input, target, ...)``: the
    input's gradient, contiguous in the input's shape and dtype."""
    x = args[1]
    return _contiguous(mode, x.shape, x)


def cudnn_grid_sampler(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten.cudnn_grid_sampler(input, grid)`` (``grid_sample`` on 4-D float inputs):
    ``(N, C, H_out, W_out)`` from the grid's ``(N, H_out, W_out, 2)``, in the input's dtype
    (``aten/src/ATen/native/cudnn/GridSampler.cpp``); no fake kernel exists for it."""
    x, grid = args[0], args[1]
    return _contiguous(mode, (x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), x)


def cudnn_grid_sampler_backward(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten.cudnn_grid_sampler_backward(input, grid, grad_output)``: the gradients of the
    input and of the grid, each the size of what it is the gradient of."""
    x, grid = args[0], args[1]
    return _contiguous(mode, x.shape, x), _contiguous(mode, grid.shape, grid)


# told of each functional collective's output as it is waited on
WAIT_HOOKS: list[Callable[[Any], None]] = []
# told of each functional all-gather and reduce-scatter: (mode, op name, input, output)
COLLECTIVE_HOOKS: list[Callable[[Any, str, Any, Any], None]] = []


def wait_tensor(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_c10d_functional.wait_tensor``: the collective's output itself, once waited on."""
    tensor = args[0] if args else kwargs["tensor"]
    for hook in WAIT_HOOKS:
        hook(tensor)
    return tensor


def _collective(func: Any) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """A functional collective as its meta function makes it, :data:`COLLECTIVE_HOOKS`
    told."""

    def kernel(mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torch._subclasses.fake_tensor import FakeTensorMode

        out = FakeTensorMode.dispatch(mode, func, (), args, kwargs)
        if COLLECTIVE_HOOKS:
            tensor = args[0] if args else kwargs.get("input")
            for hook in COLLECTIVE_HOOKS:
                hook(mode, func.__name__, tensor, out)
        return out

    return kernel


def _functional_collectives() -> dict[Any, Any]:
    """The kernels for torch's functional collectives, where this torch has them."""
    try:
        ops = torch.ops._c10d_functional
        return {
            ops.wait_tensor.default: wait_tensor,
            ops.all_gather_into_tensor.default: _collective(ops.all_gather_into_tensor.default),
            ops.reduce_scatter_tensor.default: _collective(ops.reduce_scatter_tensor.default),
        }
    except (AttributeError, RuntimeError):  # a torch built without distributed
        return {}


KERNELS = {
    **_functional_collectives(),
    aten.mse_loss_backward.default: _loss_backward,
    aten.smooth_l1_loss_backward.default: _loss_backward,
    aten.huber_loss_backward.default: _loss_backward,
    aten.cudnn_grid_sampler.default: cudnn_grid_sampler,
    aten.cudnn_grid_sampler_backward.default: cudnn_grid_sampler_backward,
    aten._grouped_mm.default: grouped_mm,
    aten._use_cudnn_ctc_loss.default: use_cudnn_ctc_loss,
    aten._use_cudnn_ctc_loss.Tensor: use_cudnn_ctc_loss,
    aten._cudnn_ctc_loss.default: cudnn_ctc_loss,
    aten._cudnn_ctc_loss.Tensor: cudnn_ctc_loss,
    # MIOpen is ROCm's: never on an NVIDIA GPU
    aten._use_miopen_ctc_loss.default: lambda mode, args, kwargs: False,
    aten._use_miopen_ctc_loss.Tensor: lambda mode, args, kwargs: False,
}


def run_on_cpu(mode: Any, func: Any, args: Any, kwargs: dict[str, Any], where: str) -> Any:
    """``func`` has no fake kernel: run its CPU kernel on real inputs (the trace's values,
    else zeros) and return fake outputs of the same metadata on the inputs' device."""
    device = None
    inputs_bytes = 0

    def real(value: Any) -> Any:
        nonlocal device, inputs_bytes
        if isinstance(value, FakeTensor):
            if device is None:
                device = value.fake_device
            if value.layout == torch.sparse_coo:
                return _real_sparse(value)
            shadow = mode.shadows.get(value)
            if shadow is not None:
                return shadow.clone()
            inputs_bytes += value.numel() * value.element_size()
            with no_dispatch():
                if _dense_strides(value):
                    return torch.empty_strided(
                        value.shape, value.stride(), dtype=value.dtype
                    ).zero_()
                return torch.zeros(value.shape, dtype=value.dtype)
        if isinstance(value, torch.device):
            return torch.device("cpu")
        if isinstance(value, (list, tuple)):
            return type(value)(real(v) for v in value)
        return value

    real_args = [real(a) for a in args]
    real_kwargs = {k: real(v) for k, v in kwargs.items()}
    name = getattr(func, "__name__", str(func))
    if inputs_bytes > CPU_FALLBACK_LIMIT:
        raise TraceError(
            f"{name} at {where} has no fake kernel, and running it on the CPU for its output "
            f"sizes would take {inputs_bytes / 2**30:.1f} GiB; an estimate cannot trace it"
        )
    try:
        with no_dispatch():
            out = func(*real_args, **real_kwargs)
    except Exception as exc:
        raise TraceError(
            f"{name} at {where} has no fake kernel, and its CPU kernel failed on inputs of "
            f"the same shapes: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    device = device or torch.device("cuda", 0)
    inplace = _returned_inputs(func, args, kwargs)

    def fake(value: Any, position: int) -> Any:
        if position in inplace:
            return inplace[position]
        if isinstance(value, torch.Tensor) and value.layout == torch.sparse_coo:
            return _fake_sparse(mode, value, device)
        if isinstance(value, torch.Tensor):
            made = _empty_strided(mode, value.shape, value.stride(), value.dtype, device)
            if fits_shadow(made):
                mode.shadows[made] = value
            return made
        return value

    if isinstance(out, (tuple, list)):
        return type(out)(fake(v, i) for i, v in enumerate(out))
    return fake(out, 0)


def _real_sparse(t: FakeTensor) -> torch.Tensor:
    """A real sparse COO tensor with ``t``'s shape and number of entries, all at distinct
    positions (so that coalescing keeps them all, as the fake tensor assumes) and zero."""
    with on_meta():
        nnz, sparse_dims, coalesced = t._nnz(), t.sparse_dim(), t.is_coalesced()
    with no_dispatch():
        indices = (
            torch.stack([torch.arange(nnz) % max(1, t.shape[d]) for d in range(sparse_dims)])
            if sparse_dims
            else torch.zeros((0, nnz), dtype=torch.long)
        )
        values = torch.zeros((nnz, *t.shape[sparse_dims:]), dtype=t.dtype)
        return torch.sparse_coo_tensor(indices, values, tuple(t.shape), is_coalesced=coalesced)


def _fake_sparse(mode: Any, value: torch.Tensor, device: Any) -> Any:
    """A fake sparse COO tensor on ``device`` like the real one ``value``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with no_dispatch():
        indices, values = value._indices(), value._values()
    fake_indices = _empty_strided(mode, indices.shape, indices.stride(), indices.dtype, device)
    fake_values = _empty_strided(mode, values.shape, values.stride(), values.dtype, device)
    return FakeTensorMode.dispatch(
        mode,
        aten._sparse_coo_tensor_with_dims_and_tensors.default,
        (),
        (value.sparse_dim(), value.dense_dim(), tuple(value.shape), fake_indices, fake_values),
        {
            "dtype": value.dtype,
            "layout": torch.sparse_coo,
            "device": device,
            "is_coalesced": value.is_coalesced(),
        },
    )


def _dense_strides(t: torch.Tensor) -> bool:
    """Whether ``t``'s strides describe a dense layout (a permutation of contiguous)."""
    expected = 1
    for dim in sorted(range(t.dim()), key=lambda d: t.stride(d)):
        if t.shape[dim] > 1 and t.stride(dim) != expected:
            return False
        expected *= max(1, t.shape[dim])
    return True


def _returned_inputs(func: Any, args: Any, kwargs: dict[str, Any]) -> dict[int, Any]:
    """Outputs that alias an input the op writes (``out=`` and in-place ops): output
    position -> the input (fake) tensor."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return {}
    found: dict[int, Any] = {}
    for position, ret in enumerate(schema.returns):
        alias = ret.alias_info
        if alias is None or not alias.is_write:
            continue
        for index, argument in enumerate(schema.arguments):
            info = argument.alias_info
            if info is not None and info.before_set & alias.before_set:
                value = kwargs.get(argument.name, args[index] if index < len(args) else None)
                if isinstance(value, torch.Tensor):
                    found[position] = value
    return found
