"""The demo: the built-in examples measured on this machine and estimated for named GPUs.

Without a GPU, each example runs a few steps on the CPU, which shows what a CPU can: host
memory, the exact bytes of parameters, gradients and optimizer state, the steps and their
phases. The same examples are then estimated, at the batch size a GPU would run, for named
GPUs (fake tensors on an emulated GPU: no GPU needed), with the largest batch that fits on
each. With a GPU, each example is measured there in a fresh process (a clean allocator and
CUDA context) and the estimate for that GPU stands beside it, with its error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramscope.errors import VramscopeError
from vramscope.report.model import Report

# an H100 80GB and a 24 GB card: a data-centre GPU and what a desk has
DEFAULT_GPUS = ("h100-80gb", "rtx4090")
# the largest batch searched for (no search stops at the default 1024 of `vramscope fit`:
# the example CNN fits thousands on an 80 GB GPU)
FIT_MAX_BATCH = 65536
# batch sizes: small on a CPU (a few steps in about a second), a real load on a GPU; the
# estimates use the GPU's, so that the CPU and GPU demos predict the same thing
BATCH = {"cnn": {"cpu": 8, "cuda": 256}, "gpt": {"cpu": 4, "cuda": 32}}
DESCRIPTIONS = {
    "cnn": "a small ResNet on 64×64 images, SGD with momentum",
    "gpt": "a GPT-2-shaped model, 4 layers, 256 tokens, AdamW",
}

Progress = Callable[[str], None]


@dataclass
class ExampleResult:
    """One example: measured here, and estimated for each GPU (``estimates[gpu]`` is the
    estimated Report at ``estimate_batch``; its ``extra["fit"]`` holds the largest batch
    that fits, and on a GPU machine, the estimate for that GPU has ``extra["validation"]``:
    estimated against measured)."""

    spec: str
    description: str
    measured: Report
    estimates: dict[str, Report] = field(default_factory=dict)

    @property
    def measured_batch(self) -> int:
        return int(self.measured.workload.get("batch_size") or 0)


@dataclass
class DemoResult:
    """What the demo found: the device it measured on, the GPUs it estimated for, and one
    entry per example."""

    device: str  # "cpu" or "cuda"
    device_name: str
    gpus: list[str]  # profile names, this machine's GPU first when it has one
    examples: list[ExampleResult]
    steps: int
    local_gpu: str | None = None  # the profile of this machine's GPU, when it has one
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON payload: ``{"schema": "vramscope.demo/1", "reports": {spec: measured},
        "estimates": {spec: {gpu: estimated}}}``; for one example, its measured report with
        ``estimates`` added (so ``vramscope report`` reads it)."""
        if len(self.examples) == 1:
            only = self.examples[0]
            data = only.measured.to_dict()
            data["estimates"] = {gpu: r.to_dict() for gpu, r in only.estimates.items()}
            return data
        return {
            "schema": "vramscope.demo/1",
            "device": self.device,
            "reports": {ex.spec: ex.measured.to_dict() for ex in self.examples},
            "estimates": {
                ex.spec: {gpu: r.to_dict() for gpu, r in ex.estimates.items()}
                for ex in self.examples
            },
        }

    def html_report(self, example: ExampleResult) -> Report:
        """The report an example's HTML page shows: on a GPU machine the measured one (with
        the estimate beside it and the largest batch), else the estimate for the first GPU
        (with the largest batch that fits)."""
        if self.device == "cuda":
            local = example.estimates.get(self.local_gpu or "")
            extra = dict(example.measured.extra)
            if local is not None:
                extra.update({k: local.extra[k] for k in ("validation", "fit") if k in local.extra})
            return dataclasses.replace(example.measured, extra=extra)
        return example.estimates[self.gpus[0]]


def run_demo(
    examples: Sequence[str] = ("cnn", "gpt"),
    gpus: Sequence[str] = DEFAULT_GPUS,
    steps: int = 3,
    device: str | None = None,
    progress: Progress | None = None,
) -> DemoResult:
    """Measure each example here (CUDA when present, else the CPU) and estimate it for
    ``gpus`` (profile names, see ``vramscope estimate --list-gpus``)."""
    import torch

    from vramscope.estimate.profiles import get_profile

    started = time.perf_counter()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    names = [get_profile(g).name for g in gpus]  # unknown names fail here, before any work
    local = local_profile() if device == "cuda" else None
    if local is not None:  # this machine's GPU first
        names = [local.name] + [n for n in names if n != local.name]
    results = []
    for name in examples:
        if name not in BATCH:
            raise VramscopeError(f"unknown example {name!r}; the demo has {', '.join(BATCH)}")
        spec = f"example:{name}"
        batch = BATCH[name][device]
        if progress:
            progress(f"measuring {spec} at batch {batch} on the {device.upper()}")
        result = ExampleResult(spec, DESCRIPTIONS[name], _measure(spec, batch, steps, device))
        add_estimates(result, names, BATCH[name]["cuda"], local, progress)
        results.append(result)
    return DemoResult(
        device=device,
        device_name=_device_name(results, device),
        gpus=names,
        examples=results,
        steps=steps,
        local_gpu=local.name if local is not None else None,
        seconds=time.perf_counter() - started,
    )


def add_estimates(
    result: ExampleResult,
    gpus: Sequence[str],
    batch_size: int,
    local: Any = None,
    progress: Progress | None = None,
) -> None:
    """Estimate ``result``'s example at ``batch_size`` for each of ``gpus`` (profile names),
    with the largest batch that fits. ``local``: the profile of the GPU the example was
    measured on; its estimate gets the ``validation`` section (estimated against measured)."""
    from vramscope.estimate.profiles import get_profile
    from vramscope.report.validation import validation

    for gpu in gpus:
        if progress:
            progress(f"estimating {result.spec} for {gpu}, and the largest batch that fits")
        profile = local if local is not None and gpu == local.name else get_profile(gpu)
        result.estimates[gpu] = estimate_with_fit(result.spec, batch_size, profile)
    if local is not None and local.name in result.estimates:
        own = result.estimates[local.name]
        steps = len(result.measured.steps)
        own.extra["validation"] = validation(own, result.measured.to_dict(), steps)


def estimate_with_fit(spec: str, batch_size: int, profile: Any) -> Report:
    """The estimate at ``batch_size`` on ``profile``, with the largest batch that fits (the
    ``fit`` section that ``vramscope fit --gpu`` writes, without its answer at the full
    memory). The search starts at ``batch_size``, whose estimate it reuses."""
    from vramscope.estimate.profiles import PROFILES
    from vramscope.fit.answer import final_answer
    from vramscope.fit.search import Estimator, fit_section, make_target, search_batches
    from vramscope.fit.strategies import get_strategy

    if profile not in PROFILES:  # this machine's GPU, known by no profile: no search
        from vramscope.estimate.estimator import estimate

        return estimate(spec, batch_size=batch_size, gpu=profile)
    est = Estimator(
        spec, make_target(profile.name, None, None), get_strategy("baseline"), *[None] * 3
    )
    report = est.report(batch_size)
    found = search_batches(est, FIT_MAX_BATCH, start=batch_size, without_margin=False)
    section = fit_section(est, found, FIT_MAX_BATCH)
    section["answer"] = final_answer(section)
    report.extra["fit"] = section
    return report


def local_profile() -> Any:
    """The profile of this machine's first GPU: a named profile when it is one of them,
    else the profile of its architecture with this GPU's name, memory and multiprocessors."""
    import torch

    from vramscope.estimate.profiles import PROFILES

    props = torch.cuda.get_device_properties(0)
    for profile in PROFILES:
        if profile.display_name == props.name:
            return profile
    capability = (props.major, props.minor)
    nearest = min(
        PROFILES,
        key=lambda p: (
            abs(p.sm - props.major * 10 - props.minor),
            abs(p.total_bytes - props.total_memory),
        ),
    )
    return dataclasses.replace(
        nearest,
        name="this-gpu",
        display_name=props.name,
        total_bytes=props.total_memory,
        capability=capability,
        multiprocessors=props.multi_processor_count,
        calibrated=False,
        aliases=(),
    )


def _measure(spec: str, batch_size: int, steps: int, device: str) -> Report:
    if device == "cuda":  # a fresh process: a clean allocator and CUDA context per example
        from vramscope.fit.trial import run_trial

        trial = run_trial(spec, batch_size, steps=steps)
        if trial.report is None:
            raise VramscopeError(f"measuring {spec} on the GPU failed: {trial.error}")
        return Report.from_dict(trial.report)
    from vramscope.tracking.runner import measure

    with _one_thread():
        return measure(spec, batch_size=batch_size, steps=steps, device=device)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The examples' CPU steps on one thread: they are small, and on a busy two-core machine
    two threads made each step about five times slower than one (the memory is the same)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _device_name(results: list[ExampleResult], device: str) -> str:
    if results:
        return str(results[0].measured.device.get("name") or device)
    return device
