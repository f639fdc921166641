"""The upper bound of an estimate's device used: the point estimate and what can come on top.

An estimate gives device used as a point (the simulated reserved memory and the profile's
context), which on most models is the measurement within a few MiB. Under-estimating device
used is the worst error an estimate can make, though: the user trusts the figure and runs out
of memory. Two parts of it are not knowable from a fake-tensor trace, and for those the
estimate states an upper bound beside the point, with allowances derived from measurements
instead of pretending precision:

* **Lazily loaded kernels** (a part of the profile's context, :class:`GpuProfile`
  ``lazy_kernels_bytes``): CUDA loads a kernel's module on its first launch
  (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7), in 2 MiB pages, so the
  context grows with the set of kernels the step runs. Over the zoo sweep on an H200
  (``benchmarks/results/zoo_accuracy_h200.json``), the measured context exceeded the
  calibrated one by 0 MiB (52 %), 2 MiB (41 %), 4 MiB (6 %) or more (two models); the 95th
  percentile, 4 MiB, is in every upper bound.
* **cuDNN convolutions in training** (:func:`reserved_allowance`): with
  ``torch.backends.cudnn.benchmark`` off, cuDNN's heuristics pick each convolution's engine,
  and with it the size of the workspace the engine asks the caching allocator for; the
  estimate models the engines recorded on an H200 (:mod:`vramscope.estimate.kernels`), but
  other shapes take other engines, and a workspace of another size frees and splits other
  blocks, so the reserved memory of a training step with cuDNN convolutions drifts from the
  simulation (it grew over the 3 measured steps in 315 of 409 such models). Over the zoo,
  the simulation under-estimated their reserved memory in 42 % of those models, by a
  median of 0.1 % and by up to 90 %; models without cuDNN convolutions, or not training,
  were within 4 MiB in 97 %. The allowance is the 95th percentile of the shortfall, in
  percent of the simulated reserved memory, over half the models (chosen by a hash of the
  workload's id; the other half checks it, ``benchmarks/device_used_allowance.py``): 18 % for
  float32 convolutions, 5 % for bfloat16 and float16 ones (their workspaces and the
  engines' choice vary less).

Both were derived on an H200 with torch 2.11 and cuDNN 9.19; other profiles use the same
figures (uncalibrated). The point estimate (``peak.device_used_bytes``) and the verdict's
"fits" use neither; the upper bound (``verdict.device_used_upper_bytes``, labelled parts in
``estimate.device_used_allowance``) adds both, and the verdict says so when the point fits
and the bound does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramscope.estimate.profiles import GpuProfile
    from vramscope.estimate.trace import Trace

# per cent of the simulated peak reserved memory, by the precision of the convolutions cuDNN
# trained (the ``cudnn_conv_backward:<precision>`` libraries the trace records)
CUDNN_CONV_TRAINING_PCT = {"float32": 18.0, "half": 5.0}


def device_used_allowance(
    profile: GpuProfile, trace: Trace, peak_reserved: int
) -> list[tuple[str, int]]:
    """What the upper bound of device used adds to the point estimate, labelled: the lazily
    loaded kernels' pages, and :func:`reserved_allowance`."""
    parts = []
    if profile.lazy_kernels_bytes:
        parts.append(("lazily loaded kernels", profile.lazy_kernels_bytes))
    return parts + reserved_allowance(profile, trace, peak_reserved)


def reserved_allowance(
    profile: GpuProfile, trace: Trace, peak_reserved: int
) -> list[tuple[str, int]]:
    """What device used adds above the simulated reserved memory, labelled: for a step whose
    backward ran cuDNN convolutions, a share of the peak reserved memory by their precision
    (the larger share when both ran); nothing otherwise."""
    shares = [
        pct
        for precision, pct in CUDNN_CONV_TRAINING_PCT.items()
        if f"cudnn_conv_backward:{precision}" in trace.libraries
    ]
    if not shares or peak_reserved <= 0:
        return []
    pct = max(shares)
    return [
        (
            f"cuDNN convolutions' engines (allowance: {pct:g} % of reserved)",
            int(peak_reserved * pct / 100),
        )
    ]
