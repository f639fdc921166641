"""CUDA-specific memory that a fake-tensor trace does not show by itself.

Fake tensors run each op's meta kernel: the right outputs, but not which kernel CUDA would
pick, nor the buffers a CUDA kernel or library allocates through the caching allocator for
its own use. This module supplies both, from reading torch's CUDA sources (torch 2.9–2.13):

* **Scaled-dot-product attention** (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``):
  :func:`choose_sdpa_backend` answers ``aten::_fused_sdp_choice`` as the profiled GPU would
  (cuDNN first on sm90/sm100, then FlashAttention-2 for fp16/bf16 on sm80+ without a mask,
  then memory-efficient attention for sm50+, else math; every fused kernel needs query, key,
  value and the mask at stride 1 along their last dimension). The fused op then runs with its
  real autograd formula, so what is saved for backward is exact: the output and a float32
  logsumexp of (B, H, L) (FlashAttention, cuDNN) or (B, H, ⌈L/32⌉·32) (memory-efficient),
  instead of the (B, H, L, L) attention matrix the math path materializes on a CPU.
* **Attention backward buffers**: FlashAttention-2 allocates ``softmax_d`` (B, H, L₁₂₈) and a
  float32 ``dq_accum`` (B, L₁₂₈, H, D₃₂) (``flash_api.cpp``; L₁₂₈: L rounded up to 128),
  and expanded dK/dV for grouped-query attention; cuDNN's backward workspace holds the same
  float32 dQ accumulator; memory-efficient attention a float32 ``delta`` (B, H, L) and a
  float32 dQ accumulator (in float32 tiles of 64 or 128 queries, with ``delta`` computed
  outside the kernel: :func:`efficient_fp32_backward_buffers`).
* **cuBLAS and cuBLASLt workspaces** (``aten/src/ATen/cuda/CublasHandlePool.cpp``): the first
  GEMM of a thread allocates a workspace for that thread's cuBLAS handle on the current
  stream -- ``CUBLAS_WORKSPACE_CONFIG`` or 32 MiB on sm90+ (8 MiB + 128 KiB before) -- kept for
  the life of the process; a GEMM with a fused bias (``addmm`` with a 1-D bias, the
  ``nn.Linear`` path, run by cuBLASLt) allocates the cuBLASLt workspace,
  ``CUBLASLT_WORKSPACE_SIZE`` KiB or 1 MiB, once per handle. Forward and the optimizer run on
  the main thread, backward on autograd's device thread: two handles, two workspaces.
* **Depthwise convolutions over channels-last inputs**: the bias gradient's reduction buffer,
  two float32 values per input element at most 1 MiB per multiprocessor
  (:func:`_depthwise_channels_last_backward_bytes`, recorded over 242 layers), and, on the
  swept GPU for recorded shapes only, cuDNN's data- and weight-gradient workspaces
  (:func:`_recorded_depthwise_2d`: no rule of the shape predicts them).
* **Reductions split over blocks** (``ATen/native/cuda/Reduce.cuh``, ``setReduceConfig``): a
  sum or mean over the leading dimensions with many values per output (a bias gradient over
  all tokens) splits each output over several thread blocks, sized by the GPU's SM count,
  whose float32 partial results wait in a staging buffer (:func:`_reduce_staging_bytes`).
* **Embedding and EmbeddingBag (sum, mean) backward** (``Embedding.cu``, ``EmbeddingBag.cu``,
  ``embedding_backward_cuda_kernel``): sorting the indices takes a few int64 arrays of the
  index count, and the per-segment partial sums a float32 row per index (an upper bound: one
  segment per index).
* **cuDNN convolutions** (``benchmark=False``, heuristics) on tensor-core GPUs: for a 2-D
  convolution on channels-first (NCHW) tensors the engines cuDNN 9 picks transpose to
  channels-last first, and take a workspace holding the input, the output and the weight
  transposed (recorded on an H200, cuDNN 9.19, for ResNet-18/50, VGG-16, MobileNetV3,
  EfficientNet-B0 and ViT in fp32, bf16 and fp16: ``tests/data/op_trace_h200_*.json.gz``). The
  backward takes the same for data (dY, dX, W) and for weights (dY, X, dW), one after the
  other; a grouped convolution that is not depthwise takes the same with each group's
  channels padded to 8 (its float32 forward: unpadded, as recorded for 4 groups of 16
  channels and a 2-group 1-D one; :func:`_grouped_padded_bytes`, a grid of 9,104 layers). No
  workspace for depthwise convolutions, for channels-last inputs, for a 1x1 stride-1
  convolution over at least 14x14 positions (run as a GEMM), nor for a 3x3 or smaller kernel
  over at most 4 input channels (an image's first layer); a larger kernel on such an input
  takes input and output (bf16/fp16 pad the channels to 8). A float32 forward
  convolution that widens at most 64 input channels (ResNet-18's and the example CNN's
  downsampling 3x3 convolutions, VGG-16's 64 to 128) writes its output directly: input and
  weight only; a 1x1 weight needs no transpose (its NCHW and NHWC layouts are the same), and
  a strided float32 1x1 over 56x56 positions or more reads only the input (ResNet-18/50's
  first downsampling: none with 64 channels). It is a rule of the engines' shape, not a fit:
  individual engines may take one operand less. When a workspace does not fit (under a
  memory cap), cuDNN tries its other engines: recorded, a forward then took input and weight
  only, a weight gradient its transposes with 3 split-K slices instead of 14, and otherwise
  an engine without a workspace ran; torch caches the engine that ran. The replay tries
  those sizes in that order and keeps the choice (``Trace.fallbacks``) instead of failing.
  cuDNN's heuristics also pick by batch size. A sweep of batch 32-512 on an H200
  (``tests/gpu/record_conv_batch_sweep.py``, ResNet-18's shapes in float32, kept in
  ``tests/data/conv_batch_sweep_h200_resnet18.json.gz``) showed, for the 1x1 stride-2
  convolutions (a ResNet's downsampling), engines that change once with the batch: from
  batch 256 on the forward takes no workspace over 128 channels and input and weight over
  256 (at 28x28 and 14x14; 192 and below: input and output), and from batch 192 on the
  weight gradient over 64 channels takes none. Those are modelled for the H200. Two more
  held at every batch but are not modelled yet, because each moved a measured result the
  wrong way (the reserved memory of ResNet-18 at batch 128, the 4 GiB fit edge): these
  convolutions' data gradients over at most 128 channels take no workspace, and the first
  layer's weight gradient pads its input to 4 channels with 5.75 MiB of partial sums. Not
  modelled either: the 512-channel 3x3 convolutions on 7x7 took a few MiB more than input,
  output and weight at some batches (7 to 7.5 MiB at 466-470,
  ``tests/data/fit_edge_h200_resnet18_*``) and not at others.

Everything here is a global rule from those sources; nothing is fitted to a workload.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import re
import threading
from importlib import resources
from typing import TYPE_CHECKING, Any

import torch
from torch._prims_common import suggest_memory_format
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from vramscope.estimate.profiles import GpuProfile
    from vramscope.estimate.recorder import Recorder

aten = torch.ops.aten
MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3
BACKEND_NAMES = {MATH: "math", FLASH: "flash", EFFICIENT: "efficient", CUDNN: "cudnn"}
HALF = (torch.float16, torch.bfloat16)
MiB = 1 << 20


def _round(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ---- scaled-dot-product attention -----------------------------------------------------------


def _enabled(name: str) -> bool:
    getter = getattr(torch._C, f"_get_{name}_sdp_enabled", None)
    return bool(getter()) if getter is not None else True


def _prefer_cudnn(profile: GpuProfile) -> bool:
    setting = os.environ.get("TORCH_CUDNN_SDPA_PREFERRED", "").strip().lower()
    if setting in ("0", "false", "off", "no"):
        return False
    return profile.prefers_cudnn_attention


def sdpa_backend(
    profile: GpuProfile,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> int:
    """The backend ``select_sdp_backend`` would return on the profiled GPU."""
    dtype = query.dtype
    dims_ok = query.dim() == 4 and key.dim() == 4 and value.dim() == 4
    d_qk, d_v = query.shape[-1], value.shape[-1]
    lq, lk = query.shape[-2], key.shape[-2]
    heads_q, heads_k = (query.shape[1], key.shape[1]) if dims_ok else (1, 1)
    nonzero = lq > 0 and lk > 0
    needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
    # check_last_dim_stride_equals_1_dense: every fused CUDA kernel reads query, key, value
    # and the mask with a unit stride along the last dimension (a CPU takes any mask). A mask
    # that is a transposed view, such as a relative position bias permuted from (L, S, H) to
    # (1, H, L, S) as T5 builds it, sends the call to the math path, which materializes the
    # (B, H, L, S) scores. FlashAttention and cuDNN let a query whose head dimension is 1
    # pass (ignore_singleton_dim); memory-efficient attention does not.
    qkv_unit = all(t.stride(-1) == 1 for t in (query, key, value))
    mask_unit = attn_mask is None or attn_mask.dim() == 0 or attn_mask.stride(-1) == 1
    dense_ok = qkv_unit and mask_unit
    dense_ok_singleton = (qkv_unit or d_qk == 1) and mask_unit

    def cudnn_ok() -> bool:
        return (
            _enabled("cudnn")
            and dims_ok
            and nonzero
            and dtype in HALF
            and profile.sm >= 80
            and d_qk == d_v
            and d_qk % 8 == 0
            and d_qk <= 128
            # check_batch_size_and_num_heads_dense<enable_gqa=true>: grouped-query attention
            # (key and value heads a divisor of the query's) runs cuDNN when asked for; an
            # H200 under torch 2.11 loaded cuDNN's kernels for every such bf16 model
            and (heads_q == heads_k or (enable_gqa and heads_k > 0 and heads_q % heads_k == 0))
            and not (is_causal and attn_mask is not None)
            # its backward gives no gradient for the mask: a learned bias (TinyViT's, Swin's
            # relative position bias passed as the mask) goes to memory-efficient attention
            and not (attn_mask is not None and attn_mask.requires_grad)
            and dense_ok_singleton
        )

    def flash_ok() -> bool:
        if not (_enabled("flash") and dims_ok and nonzero and profile.flash_attention):
            return False
        if not dense_ok_singleton:
            return False
        if dtype not in HALF or attn_mask is not None or d_qk != d_v or d_qk > 256:
            return False
        if is_causal and lq != lk and lq > 1:
            return False  # check_flash_causal_non_square_seqlens
        if heads_q != heads_k and not enable_gqa:
            return False
        return not (profile.sm in (86, 89, 120, 121) and needs_grad and d_qk > 192)

    def efficient_ok() -> bool:
        if not (_enabled("mem_efficient") and nonzero and profile.efficient_attention):
            return False
        if not dense_ok:
            return False
        if not dims_ok:  # check_tensor_shapes: every fused kernel takes 4-D inputs only
            return False
        if dtype == torch.bfloat16 and profile.sm < 80:
            return False
        if dtype not in (torch.float32, *HALF):
            return False
        align = 8 if dtype in HALF else (4 if profile.sm >= 80 else 1)
        if d_qk != key.shape[-1] or d_qk % align or d_v % align:
            return False
        # grouped-query attention goes to flash or math: the memory-efficient kernel's
        # backward returns gradients for every query head
        return heads_q == heads_k

    order = [(FLASH, flash_ok), (EFFICIENT, efficient_ok)]
    if _prefer_cudnn(profile):
        order.insert(0, (CUDNN, cudnn_ok))
    for backend, ok in order:
        if ok():
            return backend
    return MATH


def choose_sdpa_backend(
    profile: GpuProfile,
    recorder: Recorder,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> int:
    """Answer ``aten::_fused_sdp_choice`` for a fake CUDA call and count the choice."""
    backend = sdpa_backend(profile, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if backend == CUDNN and not _has_fake_kernel("_scaled_dot_product_cudnn_attention"):
        backend = FLASH  # same memory: output and float32 (B, H, L) statistics
    name = BACKEND_NAMES[backend]
    with recorder.lock:
        recorder.sdpa[name] = recorder.sdpa.get(name, 0) + 1
    return backend


class AttentionKernels(TorchFunctionMode):
    """Run ``F.scaled_dot_product_attention`` on fake CUDA tensors as CUDA would.

    The C++ composite picks its kernel through a per-device stub that a CPU build of torch
    does not have for CUDA, so it would always take the math path. This mode makes the choice
    with :func:`sdpa_backend` and calls the fused op the way
    ``aten/src/ATen/native/transformers/attention.cpp`` does (boolean masks converted to
    additive ones, head dims padded to 8 for FlashAttention, masks padded to 16 for
    memory-efficient attention)."""

    def __init__(self, profile: GpuProfile, recorder: Recorder) -> None:
        super().__init__()
        self.profile = profile
        self.recorder = recorder
        # per thread: a call the patched function already chose the math path for
        self._chosen = threading.local()

    def __enter__(self) -> AttentionKernels:
        # Torch-function modes do not follow autograd to its device thread, where activation
        # checkpointing recomputes forward: patch the module attribute as well.
        import torch.nn.functional as F

        self._original = F.scaled_dot_product_attention
        original = self._original

        def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
            result = self._sdpa(*args, **kwargs)
            if result is not NotImplemented:
                return result
            # the math path: the mode below sees this call again; the choice is made
            self._chosen.active = True
            try:
                return original(*args, **kwargs)
            finally:
                self._chosen.active = False

        F.scaled_dot_product_attention = scaled_dot_product_attention
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self._original
        return super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch._C._nn.scaled_dot_product_attention and not getattr(
            self._chosen, "active", False
        ):
            result = self._sdpa(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)

    def _sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        if not (_on_cuda(query) and _on_cuda(key) and _on_cuda(value)):
            return NotImplemented
        if torch.is_autocast_enabled("cuda"):
            # scaled_dot_product_attention is on CUDA autocast's lower-precision list; this
            # runs above the autocast kernel, so cast as it would
            dtype = torch.get_autocast_dtype("cuda")
            query, key, value = (
                t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t
                for t in (query, key, value)
            )
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(dtype)
        backend = choose_sdpa_backend(
            self.profile,
            self.recorder,
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        if backend == MATH:
            return NotImplemented
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(
                attn_mask.logical_not(), float("-inf")
            )
        grad = torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
        )
        if backend == CUDNN:
            out = aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, grad, dropout_p, is_causal, False, scale=scale
            )
            return out[0]
        if backend == FLASH:
            size = query.shape[-1]
            og_scale = scale if scale is not None else 1.0 / math.sqrt(size)
            if size % 8:
                pad = 8 - size % 8
                query, key, value = (
                    torch.nn.functional.pad(t, (0, pad)) for t in (query, key, value)
                )
            out = aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=og_scale
            )[0]
            return out[..., :size] if out.shape[-1] != size else out
        if attn_mask is not None:
            last = attn_mask.shape[-1]
            if last % 16:
                attn_mask = torch.nn.functional.pad(attn_mask, (0, 16 - last % 16))[..., :last]
            target = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            attn_mask = attn_mask.expand(target)
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, grad, dropout_p, is_causal, scale=scale
        )[0]


_FAKE_KERNELS: dict[str, bool] = {}


def _has_fake_kernel(op: str) -> bool:
    if op not in _FAKE_KERNELS:
        packet = getattr(aten, op, None)
        ok = packet is not None
        if ok:
            try:
                ok = (
                    torch._C._dispatch_has_kernel_for_dispatch_key(packet.default.name(), "Meta")
                    or packet.default in torch._decomp.meta_table
                )
            except Exception:
                ok = False
        _FAKE_KERNELS[op] = ok
    return _FAKE_KERNELS[op]


# ---- cuBLAS workspaces -------------------------------------------------------------------------

_CUBLAS_OPS = {
    aten.mm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.addbmm.default,
    aten.addmv.default,
    aten.mv.default,
    aten.dot.default,
    aten.vdot.default,
    aten.addr.default,
    aten.mm.out,
    aten.bmm.out,
}
_LT_OPS = {aten._addmm_activation.default}
_REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim}


def cublas_workspace_bytes(profile: GpuProfile) -> int:
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return profile.cublas_workspace_bytes


def cublaslt_workspace_bytes() -> int:
    text = os.environ.get("CUBLASLT_WORKSPACE_SIZE")
    try:
        return int(text) * 1024 if text else 1024 * 1024
    except ValueError:
        return 1024 * 1024


def _uses_cublaslt(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``addmm_out_cuda_impl``: a 1-D bias the size of the output's columns, beta 1, a float
    type, both matrices with more than one row/column -> cuBLASLt ``gemm_and_bias``."""
    bias, mat1, mat2 = args[0], args[1], args[2]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    return (
        isinstance(bias, torch.Tensor)
        and bias.dim() == 1
        and mat2.dim() == 2
        and mat1.dim() == 2
        and bias.shape[0] == mat2.shape[1]
        and beta == 1
        and mat1.dtype in (torch.float32, *HALF)
        and mat1.shape[0] > 1
        and mat2.shape[0] > 1
        and mat2.shape[1] > 1
    )


def _workspace(recorder: Recorder, library: str, size: int) -> None:
    # On the GPU backward runs on autograd's device thread, with its own cuBLAS handle; the
    # trace runs it on the calling thread, so tell the two apart by phase.
    key = ("autograd" if recorder.in_backward else "main", library)
    if key in recorder.threads_with_workspace:
        return
    if library == "cublas":
        recorder.libraries.add(f"cublas:{key[0]}")  # this thread sets up a cuBLAS handle
    bid = recorder.persistent(size, "workspace", f"{library} workspace")
    if bid is not None:
        recorder.threads_with_workspace[key] = bid
        recorder.workspaces[library] = recorder.workspaces.get(library, 0) + size


def _lt_workspaces(recorder: Recorder, profile: GpuProfile) -> None:
    # cuBLASLt runs on the thread's cuBLAS handle: its first use sets that handle up, cuBLAS
    # workspace included, then takes its own (recorded on an H200: 32 MiB, then 1 MiB, at the
    # first nn.Linear of ResNet-18/50, VGG-16, ViT-B/16 and the example CNN)
    _workspace(recorder, "cublas", cublas_workspace_bytes(profile))
    _workspace(recorder, "cublaslt", cublaslt_workspace_bytes())


# ---- what each op adds -----------------------------------------------------------------------


def _nbytes(shape: tuple[int, ...] | list[int], itemsize: int) -> int:
    n = itemsize
    for s in shape:
        n *= int(s)
    return n


def after_op(
    profile: GpuProfile,
    recorder: Recorder,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
) -> None:
    """Allocations a CUDA kernel makes besides its outputs, recorded after the op's outputs."""
    if func not in _INTERESTING:
        return
    if func in _CUBLAS_OPS:
        if _on_cuda(args[0]):
            _workspace(recorder, "cublas", cublas_workspace_bytes(profile))
        return
    if func is aten.addmm.default:
        if _on_cuda(args[1]):
            if _uses_cublaslt(args, kwargs):
                _lt_workspaces(recorder, profile)
            else:
                _workspace(recorder, "cublas", cublas_workspace_bytes(profile))
        return
    if func in _LT_OPS:
        if _on_cuda(args[1]):
            _lt_workspaces(recorder, profile)
        return
    if func in _REDUCTIONS:
        if _on_cuda(args[0]) and len(args) > 1:
            staging, semaphores = _reduce_staging_bytes(profile, args[0], args[1])
            recorder.transient(staging, "temporary", "reduction staging buffer")
            recorder.transient(semaphores, "temporary", "reduction semaphores")
        return
    if func in _CUDNN_FORWARD or func in _CUDNN_BACKWARD:
        _note_cudnn(recorder, func, args)
    if func is aten.convolution.default:
        if _on_cuda(args[0]) and profile.capability[0] >= 8:
            swept = profile.name in _SWEPT_GPUS
            recorded = _recorded_grouped_1d(args[0], args[1], args[3], args[4], args[5], args[8])
            grouped = (
                _recorded_grouped_2d("forward", *args[:2], *args[3:6], args[8])
                if swept and not args[6]
                else None
            )
            if swept and recorded is not None and not args[6]:
                size = recorded[0]
            elif grouped is not None:
                size = grouped
            else:
                size = _conv_transform_bytes(
                    args[0], args[1], out, args[3], args[8], args[6], forward=True, swept=swept
                )
            smaller = _storage_bytes(args[0]) + _storage_bytes(args[1])
            ladder = (smaller, 0) if 0 < smaller < size else (0,)
            key = _plan_key("forward", args[0], args[1], args[3])
            recorder.transient(size, "temporary", "cuDNN convolution workspace", (key, ladder))
        return
    if func is aten.convolution_backward.default:
        if _on_cuda(args[1]) and profile.capability[0] >= 8:
            swept = profile.name in _SWEPT_GPUS
            _conv_backward_workspaces(recorder, args, out, swept)
            recorded = (
                _recorded_depthwise_2d(args[1], args[2], args[4], args[5], args[6], args[9])
                if swept and not args[7]
                else None
            )
            mask = args[10]
            if recorded is not None and isinstance(out, (tuple, list)):
                # recorded: each gradient is allocated just before the pass that fills it, and
                # each pass frees its workspace before the next gradient (data, weight, bias)
                for index in (0, 1):
                    later = out[index + 1]
                    later = later if mask[index + 1] and isinstance(later, torch.Tensor) else None
                    if mask[index]:
                        recorder.transient(
                            recorded[index],
                            "temporary",
                            "cuDNN depthwise convolution backward workspace (recorded)",
                            before=later,
                        )
            has_bias = args[3] is not None and bool(mask[2])
            size = _depthwise_channels_last_backward_bytes(
                args[1], args[2], args[9], profile, bias=has_bias
            )
            recorder.transient(size, "temporary", "depthwise convolution backward workspace")
        return
    if func in _ATTENTION_FORWARD:
        seeds = _ATTENTION_FORWARD[func]
        dropout = args[seeds[2]] if len(args) > seeds[2] else kwargs.get("dropout_p", 0.0)
        if not dropout and isinstance(out, (tuple, list)):
            for index in seeds[:2]:
                recorder.forget(out[index])
        return
    if func is aten._scaled_dot_product_flash_attention_backward.default:
        _flash_backward(recorder, args)
    elif func is aten._scaled_dot_product_cudnn_attention_backward.default:
        q = args[1]
        b, h, lq, d = q.shape
        recorder.transient(
            _nbytes((b, h, lq, d), 4) + _nbytes((b, h, lq), 4), "temporary", "cuDNN attention bwd"
        )
    elif func is aten._scaled_dot_product_efficient_attention_backward.default:
        q = args[1]
        b, h, lq, d = q.shape
        if q.dtype == torch.float32:
            plan = efficient_fp32_backward_buffers(profile, q, args[3])
            recorder.kernel_sequence(plan, "temporary", "efficient attention bwd")
            return
        size = _nbytes((b, h, lq), 4)
        if q.dtype in HALF and args[2].shape[-2] > 64:
            size += _nbytes((b, lq, h, d), 4)  # float32 dQ accumulator across key blocks
        recorder.transient(size, "temporary", "efficient attention bwd")
    elif func is aten._softmax_backward_data.default:
        if _on_cuda(args[0]):
            recorder.transient(softmax_backward_bytes(args[0]), "temporary", "softmax bwd product")
    elif func is aten._safe_softmax.default:
        if _on_cuda(args[0]) and args[0].dim() > 0:
            plan: list[tuple[Any, ...]] = [("out", out)]
            buffers = safe_softmax_buffers(args[0], int(args[1]))
            plan += [("alloc", name, size) for name, size in buffers]
            plan += [("free", name) for name, _ in reversed(buffers)]
            recorder.kernel_sequence(plan, "temporary", "safe softmax masks")
    elif func in _MAX_POOL_2D:
        _max_pool_copies(recorder, func, args)
    elif func is aten.native_layer_norm.default:
        # layer_norm_cuda (layer_norm.cpp): ``input.expect_contiguous()`` before its outputs,
        # kept until it returns (recorded on an H200: a permuted [8, 224, 224, 96] input,
        # Hiera's first block, copies 147 MiB ahead of the output)
        x = args[0]
        if _on_cuda(x) and not x.is_contiguous() and isinstance(out, (tuple, list)):
            plan: list[tuple[Any, ...]] = [("alloc", "x", x.numel() * x.element_size())]
            plan += [("out", t) for t in out if isinstance(t, torch.Tensor)]
            plan.append(("free", "x"))
            recorder.kernel_sequence(plan, "temporary", "layer norm contiguous input")
    elif func is aten.embedding_dense_backward.default:
        _embedding_backward(recorder, args[0], args[1], "embedding bwd")
    elif func in _CTC_BACKWARD:
        # LossCTC.cu: log_beta, like the forward's log_alpha, is made before the gradient and
        # freed after it
        log_alpha = args[_CTC_BACKWARD[func]]
        if _on_cuda(log_alpha) and isinstance(out, torch.Tensor):
            recorder.kernel_sequence(
                [("alloc", "beta", log_alpha.numel() * 4), ("out", out), ("free", "beta")],
                "temporary",
                "ctc loss bwd",
            )
    elif func in _EMBEDDING_BAG_BACKWARD:
        # sum and mean sort the indices and run embedding's backward kernel (with the bags'
        # offsets); max scatters by the recorded arg-max, without buffers
        mode = args[_EMBEDDING_BAG_BACKWARD[func]]
        if mode in (0, 1) and not (func is aten._embedding_bag_backward.default and args[9]):
            _embedding_backward(recorder, args[0], args[1], "embedding bag bwd")


def softmax_backward_bytes(grad: Any) -> int:
    """SoftMax.cu's softmax backward multiplies the gradient by the output into a temporary
    first (``grad * output``), then reduces that into the input's gradient."""
    return _storage_bytes(grad)


def safe_softmax_buffers(x: Any, dim: int) -> list[tuple[str, int]]:
    """``_safe_softmax`` (SoftMax.cpp; the math attention's softmax) after its softmax: a
    boolean mask of the input's -inf entries, the rows that are all -inf (the mask reduced
    over ``dim``) and a 0-dim zero, freed in the reverse order before it returns (recorded on
    an H200)."""
    rows = x.numel() // max(1, int(x.shape[dim % x.dim()]))
    return [("mask", x.numel()), ("rows", rows), ("zero", x.element_size())]


def efficient_fp32_backward_buffers(
    profile: GpuProfile, q: Any, v: Any
) -> list[tuple[str, str] | tuple[str, str, int]]:
    """What the float32 memory-efficient attention backward (``attention_backward.cu``,
    CUTLASS's ``AttentionBackwardKernel``) allocates after its gradients, in order, as a
    :meth:`Recorder.kernel_sequence` plan. Its float32 kernels do not compute ``delta``
    themselves: ``(grad_out * out).sum(-1)`` makes a temporary the size of the output and
    the (B, L, H) sum, which ``.transpose(-2, -1).contiguous()`` copies to (B, H, L) when
    there are several heads and queries (with one head the sum is ``delta``); the product
    and the sum are freed before the workspace. The workspace holds the dQ accumulator the
    kernels (built with key splitting) always keep: per batch and head, per block of
    ``kBlockSizeI`` queries and per 64 columns of the head dimension
    (``MatmulGradQ::ThreadblockShape::kN``), a ``kBlockSizeI`` x 64 float32 tile and 16
    bytes of its lock. The dispatcher takes the first kernel whose head dimension and shared
    memory fit: 64 x 64 tiles up to 64 dimensions, beyond that 128 x 64 where a block may
    have 163 KiB or more of shared memory (sm80, sm90, sm100). Recorded on an H200 for every
    backward of PVT-v2 (head dimension 32), test_vit (32) and SAM2's Hiera (96: tiles of 128
    queries, so 4 queries of 4 heads in each of 6,272 windows took 1.53 GiB, twice what
    64-query tiles hold): each sequence exactly. The A100's choice is assumed from the
    kernels' order (not recorded), sm86/sm89/sm120's beyond 64 dimensions is not known (64
    queries assumed); a GPU without key splitting (before sm70) keeps no workspace."""
    b, h, lq, d = (int(n) for n in q.shape)
    dv = int(v.shape[-1])
    plan: list[tuple[str, str] | tuple[str, str, int]] = [
        ("alloc", "product", _nbytes((b, h, lq, dv), 4)),
        ("alloc", "sum", _nbytes((b, h, lq), 4)),
    ]
    delta = "sum"
    if h > 1 and lq > 1:
        plan += [("alloc", "delta", _nbytes((b, h, lq), 4)), ("free", "sum")]
        delta = "delta"
    plan.append(("free", "product"))
    if profile.capability[0] >= 7:
        large = profile.capability in ((8, 0), (9, 0)) or profile.capability[0] == 10
        rows = 128 if max(d, dv) > 64 and large else 64
        tiles = _round(lq, rows) // rows * (_round(d, 64) // 64)
        plan.append(("alloc", "workspace", b * h * tiles * (rows * 64 * 4 + 16)))
    plan += [("free", delta), ("free", "workspace")]
    return plan


def _embedding_backward(recorder: Recorder, grad: Any, indices: Any, op: str) -> None:
    """Sorting the indices (int64 arrays of their count) and the per-segment partial sums of
    ``embedding_backward_cuda_kernel`` (a float32 row per index: an upper bound)."""
    n = indices.numel()
    row = grad.shape[-1] if grad.dim() else 1
    recorder.transient(n * 8 * 6 + n * row * 4, "temporary", op)


# EmbeddingBag's backward ops: the position of their ``mode`` argument (0 sum, 1 mean, 2 max)
_EMBEDDING_BAG_BACKWARD = {
    aten._embedding_bag_backward.default: 8,
    aten._embedding_bag_dense_backward.default: 7,
}


# fused attention forwards: (index of philox seed, of offset, of dropout_p in the arguments);
# without dropout the CUDA kernels make seed and offset as empty host tensors
_ATTENTION_FORWARD = {
    aten._scaled_dot_product_flash_attention.default: (6, 7, 3),
    aten._scaled_dot_product_efficient_attention.default: (2, 3, 5),
    aten._scaled_dot_product_cudnn_attention.default: (6, 7, 5),
}


_CUDNN_FORWARD = {
    aten.convolution.default,
    aten._scaled_dot_product_cudnn_attention.default,
}
_CUDNN_BACKWARD = {
    aten.convolution_backward.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
}


def runs_cudnn_convolution(input: Any, weight: Any, transposed: bool, groups: int) -> bool:
    """Whether CUDA runs a convolution through cuDNN (``_select_conv_backend``,
    ``aten/src/ATen/native/Convolution.cpp``): a depthwise convolution (as many groups as
    input channels, not transposed; a 1-D one is viewed as 2-D first) runs torch's own
    depthwise kernels unless cuDNN's are preferred (``use_cudnn_depthwise``: a channels-last
    input or weight, or float16 with at least 32 channels); every other one runs cuDNN."""
    from vramscope.estimate.cuda_device import cudnn_conv_memory_format

    dim = weight.dim()
    channels = input.shape[1]
    depthwise = (
        not transposed
        and dim in (3, 4, 5)
        and groups > 1
        and channels == groups
        and weight.shape[0] % groups == 0
    )
    if not depthwise:
        return True
    if dim in (4, 5) and cudnn_conv_memory_format(input, weight) != torch.contiguous_format:
        return True
    return input.dtype == torch.float16 and dim in (3, 4) and channels >= 32


def _note_cudnn(recorder: Recorder, func: Any, args: tuple[Any, ...]) -> None:
    """Which cuDNN kernels the step loads (the context's ``cudnn`` parts) and, for
    convolutions, in which precision they train (the reserved allowance of
    :mod:`vramscope.estimate.allowance`)."""
    forward = func in _CUDNN_FORWARD
    if func is aten.convolution.default or func is aten.convolution_backward.default:
        input, weight = (args[0], args[1]) if forward else (args[1], args[2])
        transposed, groups = (args[6], args[8]) if forward else (args[7], args[9])
        if not _on_cuda(input) or not runs_cudnn_convolution(input, weight, transposed, groups):
            return
        if not forward:
            half = "half" if input.dtype in HALF else "float32"
            recorder.libraries.add(f"cudnn_conv_backward:{half}")
    recorder.libraries.add("cudnn" if forward else "cudnn_backward")


# CUDA max pooling (DilatedMaxPool2d.cu): op -> positions of the tensors the kernel makes
# contiguous, in its input's suggested memory format, after its outputs are allocated
_MAX_POOL_2D = {
    aten.max_pool2d_with_indices.default: (0,),
    aten.max_pool2d_with_indices_backward.default: (1, 0, 7),  # input, grad_output, indices
}


def _max_pool_copies(recorder: Recorder, func: Any, args: tuple[Any, ...]) -> None:
    """``input_.contiguous(input_.suggest_memory_format())`` (and the backward's grad_output
    and indices): a copy of each that is not dense in that format (a slice of a fused
    q/k/v projection, pooled as SAM2's Hiera pools its queries), alive until the kernel ends.
    Recorded on an H200: Hiera's query pooling copies its 308 MiB input in the forward and
    again in the backward."""
    tensors = [args[i] for i in _MAX_POOL_2D[func] if i < len(args)]
    if not tensors or not isinstance(tensors[0], torch.Tensor) or not _on_cuda(tensors[0]):
        return
    memory_format = suggest_memory_format(tensors[0])
    plan: list[tuple[Any, ...]] = []
    for index, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and not t.is_contiguous(memory_format=memory_format):
            plan.append(("alloc", f"copy{index}", t.numel() * t.element_size()))
    if plan:
        plan += [("free", item[1]) for item in reversed(plan)]
        recorder.kernel_sequence(plan, "temporary", "max pooling contiguous copy")


# the native CTC loss's backward: op -> position of its log_alpha argument
_CTC_BACKWARD = {aten._ctc_loss_backward.default: 6, aten._ctc_loss_backward.Tensor: 6}

_INTERESTING = frozenset(
    {
        *_MAX_POOL_2D,
        aten.native_layer_norm.default,
        *_CTC_BACKWARD,
        *_CUBLAS_OPS,
        *_LT_OPS,
        aten.addmm.default,
        *_CUDNN_FORWARD,
        *_CUDNN_BACKWARD,
        *_ATTENTION_FORWARD,
        aten._scaled_dot_product_flash_attention_backward.default,
        aten._scaled_dot_product_cudnn_attention_backward.default,
        aten._scaled_dot_product_efficient_attention_backward.default,
        aten.embedding_dense_backward.default,
        aten._softmax_backward_data.default,
        aten._safe_softmax.default,
        *_EMBEDDING_BAG_BACKWARD,
        *_REDUCTIONS,
    }
)


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _reduce_staging_bytes(profile: GpuProfile, x: Any, dims: Any) -> tuple[int, int]:
    """The global-memory staging buffer and semaphores of a CUDA sum/mean over the leading
    dimensions of a contiguous tensor (a bias gradient: ``grad.sum(0)`` over [tokens, N]),
    following ``ATen/native/cuda/Reduce.cuh`` (``setReduceConfig``): outputs along the
    contiguous dimension, 4 to a thread, 32 threads wide; the input split over 4 warps and,
    when each thread would still sum 256 values or more, over several blocks whose float32
    partial results wait in the buffer. Recorded on an H200 (132 SMs) for ViT-B/16's bias
    gradients: 74-133 MiB each, exactly this."""
    if not x.is_contiguous() or x.dim() < 2 or dims is None:
        return 0, 0
    rank = x.dim()
    reduced = sorted({int(d) % rank for d in ([dims] if isinstance(dims, int) else dims)})
    if not reduced or reduced != list(range(len(reduced))) or len(reduced) == rank:
        return 0, 0
    outputs = math.prod(int(s) for s in x.shape[len(reduced) :])
    inputs = math.prod(int(s) for s in x.shape[: len(reduced)])
    vec = 4 if outputs % 4 == 0 else 1
    max_threads = 512 // vec
    dim0, dim1 = outputs // vec, inputs
    p0 = min(_last_pow2(dim0), max_threads)
    p1 = min(_last_pow2(dim1), max_threads)
    width = min(p0, 32)
    height = min(p1, max_threads // width)
    width = min(p0, max_threads // height)
    if inputs < min(height * 16, 256):  # too few to split over warps: one thread per output
        return 0, 0
    values = -(-inputs // height)
    grid = -(-dim0 // width)
    target = profile.multiprocessors * (profile.threads_per_multiprocessor // (width * height))
    if values < 256 or grid > target:
        return 0, 0
    ctas = max(min(-(-target // grid), -(-values // 16)), -(-values // 256))
    if ctas <= 1:
        return 0, 0
    acc = 8 if x.dtype == torch.float64 else 4
    return acc * outputs * ctas * width * vec, 4 * grid


def _storage_bytes(t: Any) -> int:
    return _round(t.numel() * t.element_size(), 512)


def _conv_transform_bytes(
    x: Any,
    w: Any,
    out: Any,
    stride: Any,
    groups: int,
    transposed: bool,
    gemm_from: int = 14 * 14,
    forward: bool = False,
    gradient: str | None = None,
    swept: bool = False,
) -> int:
    """The workspace of a cuDNN 2-D convolution whose engine transposes NCHW to NHWC: the
    input, the output and the weight, each rounded as the allocator rounds (see the module
    docstring for the cases without one and those that skip an operand). A 1x1 stride-1
    convolution over ``gemm_from`` positions or more runs as a GEMM, without. ``gradient``:
    ``"data"`` or ``"weight"`` for the two backward passes (``None``: not said); ``swept``:
    the GPU is the one whose batch sweep showed the rules that depend on it (the H200)."""
    if x.dim() not in (3, 4, 5) or not isinstance(out, torch.Tensor):
        return 0
    if groups != 1 and (
        groups == int(x.shape[1]) or transposed or x.dtype not in (torch.float32, *HALF)
    ):
        # depthwise: none; grouped transposed (or in float64): not recorded, none taken
        return 0
    if groups != 1 and (x.dtype in HALF or (gradient is not None and x.dim() == 4)):
        # half precision, and float32's gradients: each group's channels padded to 8
        return _grouped_padded_bytes(x, w, out, groups)
    if not x.is_contiguous() or _channels_last_weight(w):
        # channels-last (NHWC) already: no transposes; a channels-last weight makes torch run
        # the convolution channels-last whatever the input's layout (its suggested format).
        # A forward over a few channels is the exception (a transposed convolution's data
        # gradient is such a forward, over the output's gradient)
        if forward and not transposed:
            return _few_channels_last_forward_bytes(x, w)
        if transposed and gradient == "data":
            return _few_channels_last_forward_bytes(out, w)
        return 0
    if transposed:
        return _transposed_conv_bytes(x, out, forward, gradient)
    if x.dim() == 5:
        # 3-D (NCDHW): recorded on an H200 in float16 for every layer, the first one over 3
        # channels included: input, output and weight, for the forward and both gradients.
        # A float32 forward is taken to have none: recorded in training, a layer doubling <=64
        # channels took input and weight, and wider ones all three operands (as the 2-D rules
        # say), but with those rules 3-D ResNets' measured inference peaks come out 15 % over
        # and their training's reserved memory further under; its gradients are taken to
        # transpose as float16's do (measured training peaks agree)
        if forward and x.dtype == torch.float32:
            return 0
        return _storage_bytes(x) + _storage_bytes(out) + _storage_bytes(w) + _CUDNN_SLACK
    # torch runs a 1-D convolution as a 2-D one over a height of 1 (recorded on an H200 in
    # float32: the engines and their workspaces are those of the 2-D rules)
    size = [int(n) for n in w.shape[2:]]
    kh, kw = (1, size[0]) if x.dim() == 3 else (size[0], size[1])
    channels = int(x.shape[1])
    positions = math.prod(int(n) for n in x.shape[2:])
    pointwise = kh == kw == 1 and all(int(s) == 1 for s in stride)
    if pointwise and positions >= gemm_from:
        if swept and forward and _wide_pointwise_fp32(x, w):
            return _storage_bytes(x) + _storage_bytes(out) + _CUDNN_SLACK
        return 0  # run as a GEMM over the channels, in place
    if channels <= 4:
        if kh <= 3 and kw <= 3:
            return 0
        patches = [kh, kw] == [int(n) for n in stride][-2:]
        if forward and patches and x.dtype == torch.float32:
            # a patch embedding (a kernel as large as its stride: ViT's 16x16, RDNet's 4x4)
            # in float32, recorded on an H200: no workspace (bf16's pads and transposes)
            return 0
        # a large kernel on an image: input (channels padded to 8 in half precision) and output
        pad = 8 if x.dtype in HALF else channels
        return _round(x.numel() // channels * pad * x.element_size(), 512) + _storage_bytes(out)
    strided = any(int(s) > 1 for s in stride)
    if swept and kh == kw == 1 and strided and x.dtype == torch.float32 and x.dim() == 4:
        by_batch = _strided_pointwise_fp32(x, w, out, channels, forward, gradient)
        if by_batch is not None:
            return by_batch
    return _transform_operands(x, w, out, kh, kw, channels, positions, forward) + _CUDNN_SLACK


def _grouped_padded_bytes(x: Any, w: Any, out: Any, groups: int) -> int:
    """A grouped 2-D convolution in half precision that is not depthwise (ResNeXt's, RegNet's,
    CPUBone's), channels-first: the engines transpose input, output and weight, each group's
    channels padded to a multiple of 8. Recorded on an H200 (cuDNN 9.19, ``tests/gpu/
    record_conv_workspace_sweep.py --grid grouped``: 5,488 half-precision layers of 2 to 32
    groups of 4 to 64 channels, 3x3, 2x2 and 1x1 kernels, 8x8 to 112x112, batch 16 and 64, each pass alone):
    the rule holds to 4 KiB in 30 to 51 % of the forwards and data gradients, cuDNN took none
    in 7 to 30 %, and the rest spread on both sides (other engines); over the grid it gives
    0.77 to 0.97 of what forwards and data gradients took, and with the weight gradient's
    split-K partial sums 0.87 to 0.99 of what weight gradients took, where none (the rule
    before) left all of it out: its error is 0.20 to 0.45 of none's
    (``tests/test_grouped_conv2d_grid.py``). Channels-last, 1-D and 3-D ones: not recorded,
    none taken. The same grid in float32 (3,616 layers): the rule gives the gradients 1.00
    (data) and 1.07 (weight, with its partial sums) of what they took, where the unpadded
    transposes of the general rule gave 0.67 and 0.74 and left 1,542 and 1,475 layers under by
    more than 1 MiB (866 and 1,021 with this rule); its forwards keep the general rule (this
    one's error there is 0.58 of what they took, the general rule's 0.45)."""
    if x.dim() != 4 or not x.is_contiguous() or _channels_last_weight(w):
        return 0
    og, cg = int(w.shape[0]) // groups, int(w.shape[1])
    size = x.element_size()
    per_x = x.numel() // int(x.shape[1]) * groups * _round(cg, 8) * size
    per_out = out.numel() // int(out.shape[1]) * groups * _round(og, 8) * size
    per_w = groups * _round(og, 8) * _round(cg, 8) * math.prod(int(n) for n in w.shape[2:])
    return _round(per_x, 512) + _round(per_out, 512) + _round(per_w * size, 512) + _CUDNN_SLACK


# a float32 1x1 stride-1 forward from at least 1,024 to at least 2,048 channels over more
# than this many batch × positions takes an NCHW-to-NHWC engine (see _wide_pointwise_fp32)
_WIDE_POINTWISE_ROWS = 4096


# a float32 channels-last forward over 2 to 4 channels from this many input elements on
# transposes its input and weight (see _few_channels_last_forward_bytes)
_FEW_CHANNELS_LAST_FROM = 1 << 19


def _few_channels_last_forward_bytes(x: Any, w: Any) -> int:
    """A float32 2-D forward convolution over a channels-last input of 2 to 4 channels (an
    image's first layer in channels-last; a transposed convolution's data gradient into an
    image): cuDNN's engine takes a workspace holding the input and the weight (both
    transposed). Recorded on an H200 (cuDNN 9.19, ``tests/gpu/record_workspace_sweep_2.py``,
    the "clfwd" rows: 3 and 4 channels, 3x3 to 16x16 kernels, batch 1 to 64, 64x64 to
    512x512): from 2**19 input elements on, 46 of 59 took input + weight to the KiB (the
    rest none but one; their total 0.89 of the rule's); below, 25 of 37 none, the rest at
    most 2.2 MiB. One channel (laid out as in NCHW) took none (32 of 36). A channels-last VAE
    on the H200 took it for its first layer's forward and for its last transposed layer's
    data gradient (``tests/data/op_trace_h200_zoo-vae_channels_last.json.gz``: 25,178,128
    bytes each, the 3 x 256 x 256 input and the 64 x 3 x 4 x 4 weight). Half precision
    takes other sizes (the channels padded): not modelled."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.dtype != torch.float32:
        return 0
    if not 2 <= int(x.shape[1]) <= 4 or x.numel() < _FEW_CHANNELS_LAST_FROM:
        return 0
    return _storage_bytes(x) + _storage_bytes(w) + _CUDNN_SLACK


def _wide_pointwise_fp32(x: Any, w: Any) -> bool:
    """Whether a 1x1 stride-1 forward, otherwise a GEMM without workspace, takes cuDNN's
    engine that transposes the input and the output: recorded on an H200 (cuDNN 9.19,
    ``tests/gpu/record_workspace_sweep_2.py``) over 505 such forwards of 64 to 2,048
    channels and 14x14 to 64x64 positions. Every float32 one from 1,024 or more to 2,048
    channels over more than 4,096 batch × positions took input + output (13 of 13, within
    8 %: a dilated ResNet's last stage, FCN's and DeepLab's, keeps 60x60 there; at 4,096
    and below none); of the other 492, 445 took none and the rest under 60 MiB (input +
    output of a few layers narrowing 2,048 channels to 64 or 128, and of small bfloat16
    ones: not modelled). The test: ``tests/test_pointwise_workspace_sweep.py``."""
    if x.dtype != torch.float32 or x.dim() != 4:
        return False
    rows = int(x.shape[0]) * int(x.shape[2]) * int(x.shape[3])
    return int(w.shape[1]) >= 1024 and int(w.shape[0]) >= 2048 and rows > _WIDE_POINTWISE_ROWS


def _transposed_conv_bytes(x: Any, out: Any, forward: bool, gradient: str | None) -> int:
    """A transposed convolution (its forward is cuDNN's data gradient, its data gradient a
    forward convolution), recorded on an H200 in float32 for 1-D, 2-D and 3-D layers of
    stride 2 over 1 to 64 channels: no workspace for the 1-D and 2-D forwards nor for any data
    gradient; twice input and output for the 3-D forward; the weight gradient transposes the
    input and the output's gradient, as the 2-D rules say, and keeps 0.3 to 0.65 MiB of
    partial sums besides (taken as 512 KiB)."""
    if forward:
        return 2 * (_storage_bytes(x) + _storage_bytes(out)) if x.dim() == 5 else 0
    if gradient == "weight":
        return _storage_bytes(x) + _storage_bytes(out) + _TRANSPOSED_PARTIALS
    return 0


_TRANSPOSED_PARTIALS = 512 * 1024


def _strided_pointwise_fp32(
    x: Any, w: Any, out: Any, channels: int, forward: bool, gradient: str | None
) -> int | None:
    """A float32 1x1 stride-2 convolution (a ResNet's downsampling), recorded on an H200
    (cuDNN 9.19) at batch 32 to 512 for ResNet-18's three (64, 128 and 256 input channels,
    doubling them, over 56x56, 28x28 and 14x14); ``None``: the general rule. cuDNN's
    heuristics pick these engines by the batch size too: the thresholds are the first
    recorded batch at which the engine changed (the change came after 128, resp. 192)."""
    batch, positions = int(x.shape[0]), int(x.shape[2]) * int(x.shape[3])
    if gradient == "weight" and channels <= 64 and batch >= 192:
        return 0  # 128 and below: input and output transposed (the general rule)
    if forward and batch >= 256 and channels <= 256 and positions < 56 * 56:
        # 192 and below: input and output (the general rule); from 256 on the engine of the
        # 56x56 one: nothing up to 128 channels, else the input and the weight
        if channels <= 128:
            return 0
        return _storage_bytes(x) + _storage_bytes(w) + _CUDNN_SLACK
    return None


# what cuDNN asked for beyond the operands it transposes: 147 bytes in 614 of the 733 forward
# convolutions recorded (16 in the rest), which the allocator's rounding turns into 512
_CUDNN_SLACK = 147


def _transform_operands(
    x: Any, w: Any, out: Any, kh: int, kw: int, channels: int, positions: int, forward: bool
) -> int:
    """Which of input, output and weight the engine transposes (see the module docstring)."""
    if (
        forward
        and x.dtype == torch.float32
        and kh * kw > 1
        and channels <= 64
        and int(w.shape[0]) >= 2 * channels
    ):
        return _storage_bytes(x) + _storage_bytes(w)
    if kh == kw == 1:  # a 1x1 weight is laid out alike in NCHW and NHWC: nothing to transpose
        if forward and x.dtype == torch.float32 and positions >= 56 * 56:
            # a strided float32 1x1 over a large image (ResNet-18/50's first downsampling,
            # recorded): its engine reads the input transposed and writes the output directly
            return 0 if channels <= 64 else _storage_bytes(x) + _storage_bytes(w)
        return _storage_bytes(x) + _storage_bytes(out)
    return _storage_bytes(x) + _storage_bytes(out) + _storage_bytes(w)


@functools.cache
def _recorded_table(name: str) -> dict[str, list[int]]:
    """The rows of a table recorded on the swept GPU, ``estimate/recorded/NAME.json.gz``
    (grouped 1-D convolutions: :func:`_recorded_grouped_1d`; depthwise 2-D ones:
    :func:`_recorded_depthwise_2d`)."""
    path = resources.files("vramscope.estimate") / f"recorded/{name}.json.gz"
    with path.open("rb") as raw, gzip.open(raw, "rt") as f:
        return json.load(f)["rows"]


def _recorded_grouped_1d(
    x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> tuple[int, int] | None:
    """What a grouped 1-D convolution's forward and backward allocate beyond their tensors,
    as recorded on an H200 (cuDNN 9.19) for this very shape, or None when it was not
    recorded (``recorded/grouped_conv1d_h200.json.gz``, ``tests/gpu/
    record_grouped_conv1d_sweep.py``: 1,944 convolutions, as many channels in as out, stride
    1, padding kernel // 2, their input a (batch, time, channels) tensor's transpose as
    speech models hand it over, or contiguous). cuDNN picks among engines whose workspaces
    differ a thousandfold, and no rule of the shape tells which: 64 channels a group over 4 ×
    49 positions took 1.04 GiB in the backward (data2vec-audio's positional convolution),
    the same over 1 × 49 or 8 × 49 under 1 MiB. Outside the recorded grid the rules of
    :func:`_conv_transform_bytes` apply."""
    if (
        not isinstance(x, torch.Tensor)
        or x.dim() != 3
        or groups <= 1
        or not isinstance(w, torch.Tensor)
        or int(w.shape[0]) != int(x.shape[1])
        or groups == int(x.shape[1])
    ):
        return None
    k = int(w.shape[2])
    if [int(n) for n in stride] != [1] or [int(n) for n in dilation] != [1]:
        return None
    if [int(n) for n in padding] != [k // 2]:
        return None
    b, c, length = (int(n) for n in x.shape)
    if x.is_contiguous():
        layout = "contiguous"
    elif tuple(x.stride()) == (length * c, 1, c):
        layout = "transposed"
    else:
        return None
    row = _recorded_table("grouped_conv1d_h200").get(
        f"{layout},{b},{c},{length},{k},{groups},{_dtype_name(x.dtype)}"
    )
    return (int(row[0]), int(row[1])) if row is not None else None


def _recorded_depthwise_2d(
    x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> tuple[int, int] | None:
    """The workspaces cuDNN's data-gradient and weight-gradient passes took in the backward
    of a depthwise 2-D convolution over a channels-last input, as recorded on an H200 (torch
    2.11, cuDNN 9.19) for this very shape, each the pass's peak above its start; None when
    it was not recorded (``recorded/depthwise_conv2d_h200.json.gz``, built by
    ``tests/gpu/fit_depthwise_sweep.py --table`` from ``tests/gpu/record_depthwise_sweep.py``'s
    two sweeps: 856 7x7 layers with a bias, stride 1, padding 3, 8 to 768 channels over 5x5
    to 112x112, batch 1 to 64, float32 and bfloat16). cuDNN's heuristics pick among engines
    whose workspaces differ by orders of magnitude, and no rule of the shape tells which: in
    float32, 16x24x40x40 took 39,008,919 bytes for its weight gradient, 16x16x40x40
    22,793,891, 16x512x112x112 3.3 GB, where others take none; in bfloat16 about 49 KiB per
    image over few channels. An input whose strides are channels-last's with gaps (a slice of
    the channels) counts as channels-last: torch hands cuDNN a dense copy of it. Only
    recorded shapes are read; outside them nothing is added
    (the bias gradient's buffer is :func:`_depthwise_channels_last_backward_bytes`'s)."""
    if (
        not isinstance(x, torch.Tensor)
        or not isinstance(w, torch.Tensor)
        or x.dim() != 4
        or w.dim() != 4
    ):
        return None
    c, k = int(x.shape[1]), int(w.shape[2])
    if groups != c or tuple(int(n) for n in w.shape) != (c, 1, k, k):
        return None
    if [int(n) for n in stride] != [1, 1] or [int(n) for n in dilation] != [1, 1]:
        return None
    if [int(n) for n in padding] != [k // 2, k // 2]:
        return None
    # strides in channels-last order, gaps allowed (MambaOut's depthwise convolution reads a
    # slice of its channels): torch hands cuDNN a dense channels-last copy of the same shape
    if x.is_contiguous() or suggest_memory_format(x) != torch.channels_last:
        return None
    key = depthwise_key("channels_last", x.shape, k, x.dtype)
    row = _recorded_table("depthwise_conv2d_h200").get(key)
    return (int(row[0]), int(row[1])) if row is not None else None


def depthwise_key(layout: str, shape: Any, kernel: int, dtype: torch.dtype) -> str:
    """A row's key in the recorded depthwise table: layout, the input's shape, the kernel
    and the dtype (as torch names it), comma-separated."""
    return ",".join([layout, *(str(int(n)) for n in shape), str(kernel), _dtype_name(dtype)])


def first_layer_key(
    x_shape: Any, w_shape: Any, stride: Any, padding: Any, dilation: Any, groups: int,
    dtype: torch.dtype,
) -> str:  # fmt: skip
    """A row's key in the recorded first-layer table: the input's and the weight's shapes,
    stride, padding, dilation, groups and the dtype (as torch names it), comma-separated."""
    parts = [*x_shape, *w_shape, *stride, *padding, *dilation, groups]
    return ",".join(str(int(n)) for n in parts) + "," + _dtype_name(dtype)


def grouped_key(
    kind: str, cin: int, cout: int, kernel: int, stride: int, padding: int, dtype: torch.dtype
) -> str:
    """A row's key in the recorded grouped table: the pass (``forward``, ``data``,
    ``weight``), channels a group in and out, kernel, stride, padding and the dtype (as torch
    names it), comma-separated."""
    return ",".join(
        [kind, *(str(int(n)) for n in (cin, cout, kernel, stride, padding)), _dtype_name(dtype)]
    )


def _recorded_grouped_2d(
    kind: str, x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> int | None:
    """What a pass of a grouped 2-D convolution (not depthwise) takes beyond its tensors on
    an H200, for a configuration whose recorded layers took the same bytes per input byte at
    every size (``recorded/grouped_conv2d_h200.json.gz``, ``tests/gpu/fit_grouped_grid.py
    --table`` from the grid of :func:`_grouped_padded_bytes`): ``a * input bytes + c``. None
    for any other configuration: square kernels with the same stride and padding both ways,
    no dilation, channels-first, a 4-D input. The steady configurations are where cuDNN keeps
    one engine over the grid's batches, sizes and group counts (float32 data gradients: 38 of
    96, half of their bytes; 2 to 25 of 96 elsewhere): a 2-group 3x3 stride-2 float32 layer
    of 6 channels a group into 24 takes 6.7 times its input for the data gradient at every
    size, where the padded transposes give 2.3."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or groups <= 1:
        return None
    if groups == int(x.shape[1]) or not x.is_contiguous() or _channels_last_weight(w):
        return None
    kh, kw = int(w.shape[2]), int(w.shape[3])
    sh, sw = (int(n) for n in stride)
    ph, pw = (int(n) for n in padding)
    if kh != kw or sh != sw or ph != pw or any(int(d) != 1 for d in dilation):
        return None
    key = grouped_key(kind, int(w.shape[1]), int(w.shape[0]) // groups, kh, sh, ph, x.dtype)
    row = _recorded_table("grouped_conv2d_h200").get(key)
    if row is None:
        return None
    size = x.numel() * x.element_size()
    return max(0, row[0] * size // 1_000_000 + row[1])


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def _recorded_first_layer_wgrad(
    x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> int | None:
    """What the backward of a first layer (its input needs no gradient) allocated beyond its
    gradients, as recorded on an H200 (torch 2.11, cuDNN 9.19) for this very shape over a
    channels-first input; None when it was not recorded
    (``recorded/first_layer_wgrad_h200.json.gz``, built by ``tests/gpu/first_layer_table.py``
    from ``tests/gpu/record_conv_workspace_sweep.py``'s 4,027 shapes: a seeded draw of 1 to 4
    channels, kernels of 2x2 to 16x16, batch 1 to 128, 32x32 to 896x896, and a grid of patch
    embeddings (4x4, 14x14, 16x16) and 7x7 stride-2 stems into 32 to 1024 channels over 160
    to 384 pixels, batch 1 to 64; float32 and bfloat16). The same shape recorded twice took
    the same engine within 2 % mostly, up to 11 % apart for a few 4x4 patches: the larger is
    kept. cuDNN's weight-gradient engines for such layers pad the input's
    channels and keep split-K partial sums of the (padded) weight in numbers no rule of the
    shape gives: from none to 274 float32 copies (16x16 patches of 160x160 images into 64
    channels: 57 copies at batch 16 and 32, 121 at 64, 1 at 96). Only recorded shapes are
    read; outside them :func:`_conv_transform_bytes`'s rules apply."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != 4:
        return None
    if not x.is_contiguous() or int(x.shape[1]) > 4:
        return None
    key = first_layer_key(x.shape, w.shape, stride, padding, dilation, groups, x.dtype)
    row = _recorded_table("first_layer_wgrad_h200").get(key)
    return int(row) if row is not None else None


def _conv_backward_workspaces(
    recorder: Recorder, args: tuple[Any, ...], out: Any, swept: bool = False
) -> None:
    """Data gradient, then weight gradient: each transposes its three operands; the weight
    gradient also keeps float32 split-K partial sums of the weight (14 slices, between about
    2 and 8 MiB in the engines recorded), and transposes for 1x1 convolutions up to 27x27."""
    grad_out, x, w = args[0], args[1], args[2]
    stride, transposed, groups, mask = args[4], args[7], args[9], args[10]
    if not isinstance(out, (tuple, list)):
        return
    recorded = _recorded_grouped_1d(x, w, stride, args[5], args[6], groups) if swept else None
    if recorded is not None and not transposed:
        # the whole backward's highest above its tensors, as recorded for this very shape
        key = _plan_key("weight", x, w, stride)
        recorder.transient(
            recorded[1], "temporary", "cuDNN convolution backward workspace", (key, (0,))
        )
        return
    # a gradient that is not laid out as the input (the output was permuted or flattened
    # after the convolution: ViT's and ConvNeXt's patch embeddings; a contiguous gradient of
    # a channels-last convolution: a loss's gradient, GroupNorm's) is copied first and kept
    # until the op ends (recorded on an H200); so is an input not laid out in the format
    # the convolution runs in, where the weight's gradient needs it (Convolution.cpp)
    copy = _conv_backward_copies(grad_out, x, w, bool(mask[1]))
    tables = swept and not transposed  # the swept GPU's recorded tables apply

    def grouped(kind: str) -> int | None:
        return _recorded_grouped_2d(kind, x, w, stride, args[5], args[6], groups)

    if mask[0] and isinstance(out[0], torch.Tensor):
        data = grouped("data") if tables else None
        if data is None:
            data = _conv_transform_bytes(
                x, w, grad_out, stride, groups, transposed, gradient="data", swept=swept
            )
        size = copy + data
        # recorded: the data gradient runs (and frees its workspace) before the weight
        # gradient is allocated
        later = out[1] if mask[1] and isinstance(out[1], torch.Tensor) else None
        key = _plan_key("data", x, w, stride)
        recorder.transient(
            size, "temporary", "cuDNN convolution backward (data) workspace", (key, (0,)), later
        )
    wgrad = None  # the weight gradient's workspace as recorded: a grouped configuration's,
    if tables and mask[1]:  # or a first layer's (its input needs no gradient) shape's
        wgrad = grouped("weight")
        if wgrad is None and not mask[0]:
            wgrad = _recorded_first_layer_wgrad(x, w, stride, args[5], args[6], groups)
    if wgrad is not None and isinstance(out[1], torch.Tensor):
        # (+ the copy, when no data gradient counted it)
        key = _plan_key("weight", x, w, stride)
        recorder.transient(
            wgrad + (0 if mask[0] else copy),
            "temporary",
            "cuDNN convolution backward (weight) workspace (recorded)",
            (key, (0,)),
        )
    elif mask[1] and isinstance(out[1], torch.Tensor):
        size = _conv_transform_bytes(
            x,
            out[1],
            grad_out,
            stride,
            groups,
            transposed,
            gemm_from=28 * 28,
            gradient="weight",
            swept=swept,
        )
        ladder: tuple[int, ...] = (0,)
        if size and x.dim() == 4 and not transposed:  # (3-D: 0 to 3.4 MiB recorded, not modelled)
            # the engine tried next splits K in 3 (recorded under a cap: 56.0 MiB for the
            # example CNN's 128-channel 3x3 layer at batch 215, where 14 slices took 62.2)
            ladder = (size + 3 * out[1].numel() * 4, 0)
            floor = _PARTIALS_FLOOR * (2 if any(int(s) > 1 for s in stride) else 1)
            size += min(max(14 * out[1].numel() * 4, floor), 8 * MiB)
        if copy and not mask[0]:  # (with a data gradient, the copy is counted with its own)
            size += copy
            ladder = tuple(n + copy for n in ladder)
        per_image = (
            _pointwise_wgrad_partials(x, w, stride, groups) if swept and not transposed else None
        )
        if per_image is not None:
            # the engine that keeps a weight per image, or the one that transposes: cuDNN's
            # pick among them follows no rule found (see the function), the larger is taken
            per_image += copy if not mask[0] else 0
            if per_image > size:
                size, ladder = per_image, (0,)
        key = _plan_key("weight", x, w, stride)
        recorder.transient(
            size, "temporary", "cuDNN convolution backward (weight) workspace", (key, ladder)
        )


# the most that the per-image partial sums of a 1x1 weight gradient were recorded to take,
# and the weight (elements) from which they were not taken
_PER_IMAGE_PARTIALS_MAX = 64 * MiB
_PER_IMAGE_PARTIALS_WEIGHT = 1 << 20


def _pointwise_wgrad_partials(x: Any, w: Any, stride: Any, groups: int) -> int | None:
    """The workspace of the weight gradient of a 1x1 stride-1 convolution (1-D or 2-D, not
    grouped, channels-first) over more than one position: one float32 partial weight
    gradient per image, reduced after (``batch x out x in x 4`` bytes; no transposes).
    Recorded on an H200 (torch 2.11, cuDNN 9.19, ``tests/data/op_trace_h200_*``, first
    steps): of the 157 such weight gradients of EfficientViM-M1 and PoolFormer-v2 (float32,
    batch 16), CPUBone-nano and Visformer-tiny (bfloat16, batch 16) and ResNet-50 (bfloat16,
    batch 128: 128 copies), 104 took exactly that, over 3x3 to 56x56 positions, 24 to 1,536
    channels, 0.1 to 64 MiB (taken below 28x28 positions only: 64 of the 96 there exact).
    Where it would be more than 64 MiB or the weight has 2**20 elements or more (PoolFormer's and ResNet-50's 2,048-channel ones, ResNet-50's 14x14
    ones at batch 128: 21) none did (other engines, the input and output transposed):
    ``None``, the general rule. Of the other 32 (not modelled), 20 took less (input and
    output transposed: 768 channels narrowed to 192 over 7x7, Visformer's 192 to 576 and
    768 over 14x14; up to 7.5 MiB less), two of 27 outputs none, and 10 more (PoolFormer's
    1,280 to 320 over 14x14: 1.6 MiB; Visformer's 192 to 192: 48 KiB). Which of the two
    engines runs follows no rule found, so the caller takes the larger of this and the
    transposes (never under what either engine takes)."""
    if x.dim() not in (3, 4) or groups != 1 or not isinstance(w, torch.Tensor):
        return None
    if any(int(n) != 1 for n in w.shape[2:]) or any(int(s) != 1 for s in stride):
        return None
    if not x.is_contiguous() or _channels_last_weight(w):
        return None
    positions = math.prod(int(n) for n in x.shape[2:])
    if positions <= 1:
        return None  # a linear layer over pooled features (1x1 positions): none recorded
    if positions >= 28 * 28:
        # the general rule's GEMM (none): recorded per image in half precision and over
        # permuted inputs up to 56x56, but a float32 one of 32 to 64 channels over 64x64
        # (op_trace_h200_layer-grouped_convolutions) took input and output transposed
        return None
    if w.numel() >= _PER_IMAGE_PARTIALS_WEIGHT:
        return None
    size = int(x.shape[0]) * w.numel() * 4
    return size if size <= _PER_IMAGE_PARTIALS_MAX else None


def _depthwise_channels_last_backward_bytes(
    x: Any, w: Any, groups: int, profile: GpuProfile, bias: bool = True
) -> int:
    """The bias gradient's reduction buffer in the backward of a depthwise 2-D convolution
    with a bias over a channels-last input (PVT's and SegFormer's feed-forward convolution,
    whose input is a transposed view of tokens; ConvNeXt's and MambaOut's 7x7 layers; a model
    run in channels-last): torch's sum of the output's gradient over batch and positions,
    after cuDNN's passes, takes two float32 values per input element, at most 1 MiB per
    multiprocessor, both scaled by (C/128)^2 below 128 channels; none over at most 28x28
    positions in all (batch included). Recorded on an H200 (cuDNN 9.19) for 3x3, 5x5 and
    7x7 kernels over 32 to 1024 channels in float32 and bfloat16
    (``benchmarks/results/conv_workspace_sweep_h200.json.gz``; the "bias" pass of
    ``tests/gpu/record_depthwise_sweep.py``'s rows matches it on 252 of 255 bfloat16 7x7
    layers), to the KiB where the rule holds. cuDNN's own workspaces are another matter
    (:func:`_recorded_depthwise_2d`). ``bias``: whether the layer has a bias whose gradient
    is asked for (else none); in the channels-first (NCHW) layout none is taken."""
    if (
        not bias
        or x.dim() != 4
        or groups == 1
        or groups != int(x.shape[1])
        or int(w.shape[0]) != groups
    ):
        return 0
    if x.is_contiguous() or not (
        x.is_contiguous(memory_format=torch.channels_last) or _channels_last_weight(w)
    ):
        return 0
    batch, channels, height, width = (int(n) for n in x.shape)
    if batch * height * width <= 28 * 28:
        return 0
    share = min(channels, 128) ** 2 / 128**2
    return int(min(8 * x.numel(), profile.multiprocessors * MiB) * share)


def _channels_last_weight(w: Any) -> bool:
    return (
        w.dim() == 4
        and not w.is_contiguous()
        and w.is_contiguous(memory_format=torch.channels_last)
    )


def _conv_backward_copies(grad: Any, x: Any, w: Any, weight_gradient: bool) -> int:
    """What a cuDNN convolution's backward copies before its passes, kept until it returns
    (``convolution_backward`` in ``Convolution.cpp``, ``ConvShared.cpp``): the input made
    contiguous in the format the convolution runs in (channels-last when the input or the
    weight is: ``cudnn_conv_suggest_memory_format``) where the weight's gradient needs it,
    and the output's gradient made dense in that input's format. Recorded on an H200 for a
    channels-last VAE (``op_trace_h200_zoo-vae_channels_last``): the contiguous gradient of
    its reconstruction loss was copied channels-last (25,165,824 bytes, its peak), and the
    channels-first output of GroupNorm, the input of a channels-last convolution, copied."""
    from vramscope.estimate.cuda_device import cudnn_conv_memory_format

    if x.dim() not in (4, 5) or not isinstance(w, torch.Tensor) or w.dim() != x.dim():
        # a 1-D one is viewed as 2-D first (its layout then is not modelled): only a gradient
        # that is not contiguous is copied
        return 0 if grad.is_contiguous() else _storage_bytes(grad)
    fmt = cudnn_conv_memory_format(x, w)
    copy = 0
    if not x.is_contiguous(memory_format=fmt):
        if weight_gradient:
            copy += _storage_bytes(x)
        else:  # the input stays as it is: the gradient follows its own suggested format
            fmt = suggest_memory_format(x)
    if not grad.is_contiguous(memory_format=fmt):
        copy += _storage_bytes(grad)
    return copy


# the least the weight gradient's split-K partials took: 14 float32 slices of a 64x64x3x3
# weight, also for smaller weights (recorded for 32x32x3x3 at batch 215 and up); twice that
# for a strided convolution (3.8 and 4.1 MiB recorded for 64x32x3x3 and 128x64x3x3)
_PARTIALS_FLOOR = 14 * 64 * 64 * 9 * 4

# the GPUs whose sweep of batch sizes (tests/gpu/record_conv_batch_sweep.py) showed the rules
# that depend on the batch (cuDNN 9.19's heuristics on an H200; other GPUs keep the rules above)
_SWEPT_GPUS = ("h200",)


def _plan_key(kind: str, x: Any, w: Any, stride: Any) -> tuple[Any, ...]:
    """What torch's cache of cuDNN plans tells convolutions apart by (enough of it)."""
    return (kind, tuple(x.shape), tuple(w.shape), x.dtype, tuple(int(s) for s in stride))


def _on_cuda(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    # a DTensor (context parallel's query, key and value) is on the device of its shard
    t = getattr(t, "_local_tensor", t)
    return isinstance(t, FakeTensor) and t.fake_device.type == "cuda"


def _flash_backward(recorder: Recorder, args: tuple[Any, ...]) -> None:
    q, k = args[1], args[2]
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    lq_r = _round(lq, 128)
    d_r = _round(d, 32 if d <= 128 else 64)
    size = _nbytes((b, h, lq_r), 4) + _nbytes((b, lq_r, h, d_r), 4)
    if hk != h:  # grouped-query attention: dK, dV for every query head, then summed
        size += 2 * _nbytes((b, lk, h, d), q.element_size())
    recorder.transient(size, "temporary", "flash attention bwd")


# ---- ops that CUDA runs as one kernel ---------------------------------------------------------

# Ops with a CPU and a CUDA kernel and also a CompositeImplicitAutograd formula (found by
# asking the dispatcher which aten ops have both). In a build without CUDA kernels, a tensor
# on the emulated CUDA device finds no CUDA kernel, so the autograd layer falls back to the
# formula and runs its pieces (silu_backward: sigmoid, sub, add and three muls, each a
# temporary) where the GPU runs one kernel that allocates only the result. Also
# ``_fused_rms_norm`` (a CUDA kernel and the formula, no CPU kernel): torch's RMSNorm calls
# it, and its formula (pow, mean, rsqrt, two muls) keeps one more activation of the input's
# size for backward than the kernel (its output and the float32 reciprocal RMS): a llama
# estimated on a CPU-only torch 2.13 was 25-34 MB per pipeline stage over the same estimate
# on torch 2.11's CUDA build.
FUSED_ON_CUDA = ("silu_backward", "mish_backward", "native_channel_shuffle", "_fused_rms_norm")
_placeholders: list[Any] = []


def register_cuda_placeholders() -> None:
    """Give those ops a CUDA kernel that only exists to route dispatch to the fake-tensor
    mode, as on a GPU. Never done where torch has CUDA kernels (nothing of torch's is
    replaced), and done once per process; the placeholder raises if it ever runs."""
    if _placeholders:
        return
    missing = [
        op
        for op in FUSED_ON_CUDA
        if hasattr(torch.ops.aten, op)
        and not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA")
    ]
    if not missing:
        return
    lib = torch.library.Library("aten", "IMPL")  # kept for the life of the process

    def placeholder(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("vramscope's CUDA placeholder ran outside an estimate")

    for op in missing:
        lib.impl(op, placeholder, "CUDA")
    _placeholders.append(lib)
