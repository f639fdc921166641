"""GPU profiles for estimates: memory size, architecture and the memory outside the allocator.

A profile says what an estimate needs to know about a GPU it does not have: the memory
``torch.cuda.get_device_properties().total_memory`` reports, the compute capability (which
decides the scaled-dot-product-attention kernels, bfloat16 support and the cuBLAS workspace
size), and the memory the process takes outside the caching allocator -- the CUDA context,
loaded kernels and library handles -- which nvidia-smi counts as the process's memory.

Only ``h200`` is calibrated by measurement (torch 2.11.0+cu130, driver 580). The others use
the datasheet size (nvidia-smi MiB x 2**20, minus nothing) and a documented guess for the
context, and say so: ``profile.calibrated`` is False and ``profile.note`` explains.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from vramscope.errors import VramscopeError
from vramscope.units import format_bytes

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GpuProfile:
    name: str  # the name --gpu takes
    display_name: str  # as torch.cuda.get_device_name() prints it
    total_bytes: int  # total_memory as torch reports it
    capability: tuple[int, int]  # compute capability (major, minor)
    context_and_libraries_bytes: int  # device used - reserved, training with cuBLAS only
    calibrated: bool = False
    note: str = ""
    aliases: tuple[str, ...] = ()
    # what the context and libraries take besides, by what the step uses (see context_bytes)
    inference_delta_bytes: int = -66 * MiB
    cudnn_bytes: int = 10 * MiB
    cudnn_backward_bytes: int = 6 * MiB
    # a cuBLAS handle (and its stream) on a thread that runs a GEMM: training sets one up on
    # the main thread and one on autograd's device thread, inference one
    cublas_handle_bytes: int = 64 * MiB
    # kernels loaded lazily on first launch, in 2 MiB pages, beyond the calibration's: part
    # of the upper bound of device used, not of the context (the 95th percentile over the
    # H200 zoo sweep; see vramscope.estimate.allowance)
    lazy_kernels_bytes: int = 4 * MiB
    # streaming multiprocessors: CUDA reductions size their grid, and so their float32
    # staging buffers, by them and the threads each can hold
    multiprocessors: int = 132

    def context_bytes(
        self,
        training: bool = True,
        cudnn: bool = False,
        cudnn_backward: bool = False,
        cublas_threads: int | None = None,
    ) -> int:
        """Device used minus reserved: the CUDA context and loaded kernels, plus the library
        handles the step creates. On the H200 (CUDA 13, lazy module loading) a training step
        with cuBLAS alone measured 742 MiB; inference, which has no autograd device thread and
        so no second cuBLAS handle and stream, 66 MiB less; cuDNN (convolutions, cuDNN
        attention) loads its kernels: 10 MiB for forward kernels, 6 MiB more for backward.
        ``cublas_threads``: the threads that ran a GEMM (``None``: as many as the step has);
        a thread without one sets up no cuBLAS handle (measured over the zoo sweep: training
        steps without any GEMM, FCN, DeepLab, SqueezeNet, used 126 to 128 MiB less). Kernels
        load lazily, in 2 MiB pages: the pages a step's kernels take beyond the calibration
        workload's are in the upper bound (:mod:`vramscope.estimate.allowance`), not here."""
        return sum(
            n for _, n in self.context_parts(training, cudnn, cudnn_backward, cublas_threads)
        )

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]

    @property
    def threads_per_multiprocessor(self) -> int:
        """Resident threads per SM (CUDA's compute-capability tables): 1024 on sm75, 1536
        on sm86/sm89, 2048 on sm70, sm80 and sm90."""
        return {75: 1024, 86: 1536, 87: 1536, 89: 1536}.get(self.sm, 2048)

    @property
    def supports_bf16(self) -> bool:
        return self.capability[0] >= 8

    @property
    def flash_attention(self) -> bool:
        """FlashAttention-2 kernels exist for sm80 … sm121 (sdp_utils.cpp, check_sm_version)."""
        return 80 <= self.sm <= 121

    @property
    def efficient_attention(self) -> bool:
        """Memory-efficient (CUTLASS) attention exists for sm50 … sm121."""
        return 50 <= self.sm <= 121

    @property
    def prefers_cudnn_attention(self) -> bool:
        """torch ≥ 2.9 puts cuDNN attention first on sm90/sm100 (``check_prefer_cudnn_attention``:
        major 9 or 10, minor 0, cuDNN ≥ 9.9); ``TORCH_CUDNN_SDPA_PREFERRED=0`` turns it off."""
        return self.capability in ((9, 0), (10, 0))

    @property
    def cublas_workspace_bytes(self) -> int:
        """cuBLAS workspace per (handle, stream) when CUBLAS_WORKSPACE_CONFIG is unset:
        32 MiB on sm90 and newer, else ``:4096:2:16:8`` = 8 MiB + 128 KiB
        (``parseChosenWorkspaceSize`` in aten/src/ATen/cuda/CublasHandlePool.cpp)."""
        if self.capability[0] >= 9:
            return 4096 * 8 * 1024
        return 4096 * 1024 * 2 + 16 * 1024 * 8

    def describe(self) -> str:
        """A line of ``estimate --list-gpus``: name, memory, architecture and the context a
        training step's estimate adds, in the figures an estimate's report shows."""
        cal = "calibrated" if self.calibrated else "uncalibrated"
        return (
            f"{self.name:<11} {self.display_name:<25} {format_bytes(self.total_bytes):>10}  "
            f"sm{self.sm:<4} {format_bytes(self.context_and_libraries_bytes):>10}  {cal}"
        )

    def context_parts(
        self,
        training: bool = True,
        cudnn: bool = False,
        cudnn_backward: bool = False,
        cublas_threads: int | None = None,
    ) -> list[tuple[str, int]]:
        """What :meth:`context_bytes` adds up, labelled: the base (a training step with
        cuBLAS), then what inference takes off, threads without a GEMM take off and cuDNN's
        kernels add."""
        parts = [("a training step with cuBLAS", self.context_and_libraries_bytes)]
        if not training:
            parts.append(("inference", self.inference_delta_bytes))
        threads = 2 if training else 1
        if cublas_threads is not None and cublas_threads < threads:
            missing = threads - cublas_threads
            label = "thread" if missing == 1 else "threads"
            parts.append(
                (
                    f"no cuBLAS handle on {missing} {label} (no GEMM)",
                    -missing * self.cublas_handle_bytes,
                )
            )
        if cudnn:
            parts.append(("cuDNN's kernels", self.cudnn_bytes))
        if cudnn_backward:
            parts.append(("cuDNN's backward kernels", self.cudnn_backward_bytes))
        return parts

    def describe_context(
        self,
        training: bool = True,
        cudnn: bool = False,
        cudnn_backward: bool = False,
        cublas_threads: int | None = None,
    ) -> str:
        """``496.00 MiB (480.00 MiB a training step with cuBLAS, +10.00 MiB cuDNN's kernels,
        +6.00 MiB cuDNN's backward kernels)``: the figure and how it is made."""
        parts = self.context_parts(training, cudnn, cudnn_backward, cublas_threads)
        total = format_bytes(sum(n for _, n in parts))
        if len(parts) == 1:
            return f"{total} ({parts[0][0]})"
        shown = [f"{format_bytes(parts[0][1])} {parts[0][0]}"]
        shown += [f"{format_bytes(n, signed=True)} {label}" for label, n in parts[1:]]
        return f"{total} ({', '.join(shown)})"


def list_text() -> str:
    """What ``estimate --list-gpus`` prints: a line per profile, and how the context column
    becomes the figure an estimate adds (cuDNN's kernels, inference)."""
    head = f"{'--gpu':<11} {'device':<25} {'memory':>10}  {'arch':<6} {'context':>10}"
    lines = [head, *(p.describe() for p in PROFILES)]
    adds = {(p.cudnn_bytes + p.cudnn_backward_bytes, p.inference_delta_bytes) for p in PROFILES}
    if len(adds) == 1:
        ((cudnn, inference),) = adds
        note = (
            "context: the CUDA context and libraries a training step's estimate adds to "
            f"reserved memory (cuBLAS); cuDNN's kernels add {format_bytes(cudnn)} (their "
            f"backward kernels included), inference takes {format_bytes(-inference)} off"
        )
        lines += textwrap.wrap(note, 80)
    return "\n".join(lines)


_GUESS = (
    "uncalibrated: total from the datasheet (nvidia-smi MiB); context and libraries guessed "
    "from the H200 measurement, scaled for the architecture; measure once with "
    "`vramscope estimate ... --validate` on that GPU to check"
)

# Measured on one H200: device used (NVML, this process) - reserved at the end of
# `vramscope measure example:gpt -b 16 --steps 6` (tests/data/report_h200_gpt.json); the same
# in every transformer trained in fp32 of benchmarks/results/accuracy_measured_h200.json.
# Inference without cuDNN measured 708_837_376 (bert-base), with cuDNN 719_323_136
# (resnet50); training with cuDNN 794_820_608 … 799_014_912.
H200_CONTEXT = 778_043_392

PROFILES: tuple[GpuProfile, ...] = (
    GpuProfile(
        "h200",
        "NVIDIA H200",
        150_109_880_320,
        (9, 0),
        H200_CONTEXT,
        calibrated=True,
        multiprocessors=132,
        note="calibrated: torch 2.11.0+cu130, driver 580.159.04, measured 2026-11-29",
        aliases=("h200-141gb", "h200-sxm"),
    ),
    GpuProfile(
        "h100-80gb",
        "NVIDIA H100 80GB HBM3",
        81_559 * MiB,
        (9, 0),
        H200_CONTEXT,
        multiprocessors=132,
        note=_GUESS + " (same architecture as the H200: the same context assumed)",
        aliases=("h100", "h100-sxm", "h100-pcie", "h100-sxm5"),
    ),
    GpuProfile(
        "a100-80gb",
        "NVIDIA A100-SXM4-80GB",
        81_920 * MiB,
        (8, 0),
        600 * MiB,
        multiprocessors=108,
        note=_GUESS,
        aliases=("a100", "a100-sxm4-80gb", "a100-pcie-80gb"),
    ),
    GpuProfile(
        "a100-40gb",
        "NVIDIA A100-SXM4-40GB",
        40_960 * MiB,
        (8, 0),
        600 * MiB,
        multiprocessors=108,
        note=_GUESS,
        aliases=("a100-sxm4-40gb", "a100-pcie-40gb"),
    ),
    GpuProfile(
        "l40s",
        "NVIDIA L40S",
        46_068 * MiB,
        (8, 9),
        520 * MiB,
        multiprocessors=142,
        note=_GUESS,
        aliases=("l40",),
    ),
    GpuProfile(
        "a10g",
        "NVIDIA A10G",
        23_028 * MiB,
        (8, 6),
        480 * MiB,
        multiprocessors=80,
        note=_GUESS,
    ),
    GpuProfile("l4", "NVIDIA L4", 23_034 * MiB, (8, 9), 480 * MiB, multiprocessors=58, note=_GUESS),
    GpuProfile(
        "rtx4090",
        "NVIDIA GeForce RTX 4090",
        24_564 * MiB,
        (8, 9),
        480 * MiB,
        multiprocessors=128,
        note=_GUESS,
        aliases=("4090", "rtx-4090"),
    ),
    GpuProfile(
        "rtx3090",
        "NVIDIA GeForce RTX 3090",
        24_576 * MiB,
        (8, 6),
        480 * MiB,
        multiprocessors=82,
        note=_GUESS,
        aliases=("3090", "rtx-3090"),
    ),
    GpuProfile(
        "v100-32gb",
        "Tesla V100-SXM2-32GB",
        32_768 * MiB,
        (7, 0),
        420 * MiB,
        multiprocessors=80,
        note=_GUESS,
        aliases=("v100", "v100-sxm2-32gb"),
    ),
    GpuProfile("t4", "Tesla T4", 15_360 * MiB, (7, 5), 380 * MiB, multiprocessors=40, note=_GUESS),
)

_BY_NAME = {name: p for p in PROFILES for name in (p.name, *p.aliases)}


def names() -> list[str]:
    return [p.name for p in PROFILES]


def get_profile(name: str | GpuProfile) -> GpuProfile:
    """The profile for ``name`` (case and ``_``/space insensitive); VramscopeError listing the
    known names otherwise."""
    if isinstance(name, GpuProfile):
        return name
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = key.removeprefix("nvidia-")
    profile = _BY_NAME.get(key)
    if profile is None:
        raise VramscopeError(
            f"unknown GPU {name!r}; known: {', '.join(names())} "
            "(estimate --memory SIZE gives one of them another total; fit and compare take "
            "--budget SIZE)"
        )
    return profile
