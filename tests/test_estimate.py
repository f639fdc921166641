"""`vramscope.estimate`: predictions made on this CPU against peaks measured on an H200.

The measured numbers come from ``tests/data/report_h200_gpt.json`` (``vramscope measure
example:gpt -b 16 --steps 6``) and ``benchmarks/results/accuracy_measured_h200.json``
(``benchmarks/measure_suite.py``, 3 steps per case), both torch 2.11.0+cu130 on an H200.
Accuracy targets: allocated within 2 %, reserved within 3 %, device used within 3 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vramscope.errors import VramscopeError, WorkloadError
from vramscope.estimate.estimator import estimate
from vramscope.report.model import CATEGORY_NAMES, Report

ROOT = Path(__file__).resolve().parents[1]
GPT_REPORT = json.loads((ROOT / "tests" / "data" / "report_h200_gpt.json").read_text())
SUITE = {
    c["name"]: c
    for c in json.loads(
        (ROOT / "benchmarks" / "results" / "accuracy_measured_h200.json").read_text()
    )["cases"]
}


# one worker runs this module (`--dist loadgroup`): the GPT is estimated once
pytestmark = pytest.mark.xdist_group("estimate")


def error(estimated: int, measured: int) -> float:
    return abs(estimated / measured - 1)


@pytest.fixture(scope="module")
def gpt() -> Report:
    return estimate("example:gpt", 16, gpu="h200")


def test_example_gpt_matches_the_h200_measurement(gpt):
    measured = GPT_REPORT["peak"]
    assert error(gpt.peak.allocated_bytes, measured["allocated_bytes"]) <= 0.02
    assert error(gpt.peak.reserved_bytes, measured["reserved_bytes"]) <= 0.03
    assert error(gpt.peak.device_used_bytes, measured["device_used_bytes"]) <= 0.03


def test_example_gpt_peak_is_in_the_steady_backward_like_the_measurement(gpt):
    assert (gpt.peak.step, gpt.peak.phase) == (1, "backward")
    first, steady = gpt.steps[0], gpt.steps[1]
    measured = {s["index"]: s for s in GPT_REPORT["steps"]}
    assert error(first.peak_allocated_bytes, measured[0]["peak_allocated_bytes"]) <= 0.02
    assert error(steady.peak_allocated_bytes, measured[1]["peak_allocated_bytes"]) <= 0.02
    # what outlives a step: parameters, AdamW state and the two cuBLAS workspaces
    assert steady.end_allocated_bytes == measured[1]["end_allocated_bytes"]


def test_the_estimate_has_the_shape_of_a_measured_report(gpt):
    data = json.loads(gpt.to_json())
    again = Report.from_dict(data)
    assert again.kind == "estimated" and data["schema"] == GPT_REPORT["schema"]
    for key in ("workload", "device", "peak", "categories_at_peak", "phases", "steps"):
        assert key in data
    assert [p.name for p in gpt.phases] == ["data", "zero_grad", "forward", "backward", "optimizer"]
    assert len(gpt.steps) >= 3
    cats = gpt.categories_at_peak
    assert cats.total() == gpt.peak.allocated_bytes
    assert cats.parameters == GPT_REPORT["categories_at_peak"]["parameters"]
    assert cats.optimizer_state == GPT_REPORT["categories_at_peak"]["optimizer_state"]
    assert all(getattr(cats, name) is not None for name in CATEGORY_NAMES)
    assert gpt.modules[0]["name"] == "" and gpt.modules[0]["parameters_bytes"] > 0
    # the module table holds what the categories hold at the same peak (the model's row is
    # the whole model): a peak with no gradient alive shows none in either table
    for name in ("parameters", "buffers", "gradients", "optimizer_state"):
        assert gpt.modules[0][f"{name}_bytes"] == getattr(cats, name), name
    verdict = gpt.extra["verdict"]
    assert verdict["fits"] is True and verdict["gpu"] == "h200"
    assert verdict["headroom_bytes"] == verdict["total_bytes"] - gpt.peak.device_used_bytes
    assert 98 < verdict["headroom_pct"] < 99.5


def test_attention_uses_the_kernel_the_h200_runs(gpt):
    # fp32 on sm90: not flash (needs fp16/bf16), not cuDNN (same), so memory-efficient
    assert gpt.extra["estimate"]["sdpa_kernels"] == {"efficient": 8}
    assert gpt.extra["estimate"]["workspaces_bytes"] == {"cublaslt": 1 << 20, "cublas": 64 << 20}


def test_example_cnn_allocated_within_five_percent_of_the_h200():
    measured = SUITE["example-cnn-fp32"]["peak"]
    report = estimate("example:cnn", 256, gpu="h200")
    assert error(report.peak.allocated_bytes, measured["allocated_bytes"]) <= 0.05
    # cuDNN convolution workspaces are not modelled: reserved is under-predicted on CNNs
    # (-32 % here; see benchmarks/results/accuracy_h200.txt and the README)
    assert report.peak.reserved_bytes < measured["reserved_bytes"]


def test_bf16_gpt2_from_transformers_matches_the_h200():
    pytest.importorskip("transformers", reason="hf: workloads need transformers")
    case = SUITE["gpt2-adamw-bf16"]
    report = estimate("hf:gpt2/seq=1024", 16, gpu="h200", precision="bf16-mixed")
    assert error(report.peak.allocated_bytes, case["peak"]["allocated_bytes"]) <= 0.02
    assert error(report.peak.reserved_bytes, case["peak"]["reserved_bytes"]) <= 0.03
    assert error(report.peak.device_used_bytes, case["peak"]["device_used_bytes"]) <= 0.03
    assert set(report.extra["estimate"]["sdpa_kernels"]) == {"cudnn"}


def test_torchvision_and_timm_cases_need_their_packages():
    pytest.importorskip(
        "torchvision",
        reason="PyPI torchvision does not work with this torch; run benchmarks/accuracy.py "
        "in an environment with torchvision and timm for those cases",
    )
    report = estimate("torchvision:resnet18@sgd", 8, gpu="h200")
    assert report.peak.allocated_bytes > 11_000_000 * 4


def test_gpu_profiles_change_kernels_and_the_verdict():
    small = estimate("example:gpt", 16, gpu="t4", memory="1GiB")
    assert small.extra["verdict"]["fits"] is False
    assert small.extra["verdict"]["total_bytes"] == 1 << 30
    assert small.device["name"] == "Tesla T4"
    assert any(f.kind == "uncalibrated" for f in small.findings)


def test_allocator_options_change_reserved_not_allocated(gpt):
    report = estimate("example:gpt", 16, gpu="h200", allocator_config="max_split_size_mb:20")
    assert report.peak.allocated_bytes == gpt.peak.allocated_bytes
    assert report.peak.reserved_bytes != gpt.peak.reserved_bytes
    assert report.extra["allocator"]["config"] == "max_split_size_mb:20"
    expandable = estimate("example:gpt", 16, allocator_config="expandable_segments:True")
    assert expandable.peak.allocated_bytes == gpt.peak.allocated_bytes
    assert expandable.peak.reserved_bytes % (2 << 20) == 0  # mapped in 2 MiB / 20 MiB pages


def test_accumulation_traces_every_micro_batch():
    report = estimate("example:gpt", 4, gpu="h200", accumulate=3)
    assert report.workload["accumulate"] == 3
    backward = next(p for p in report.steps[1].phases if p.name == "backward")
    assert backward.count == 3


WORKLOADS = """
import torch, vramscope

class Net(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, 10)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

def _workload(model, batch, loss, optimizer=True, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
    return vramscope.Workload(model=model, optimizer=opt, batch=batch, loss=loss, **kw)

def fixed_device(batch_size, device):
    model = Net().to("cpu")
    return _workload(model, lambda: torch.randn(batch_size, 64), lambda m, x: m(x).sum())

def data_dependent_shape(batch_size, device):
    model = Net().to(device)
    def loss(m, x):
        y = m(x)
        return torch.unique(y.argmax(-1)).float().sum() + y.sum()
    return _workload(model, lambda: torch.randn(batch_size, 64, device=device), loss)

def item_in_loss(batch_size, device):
    model = Net().to(device)
    def loss(m, x):
        y = m(x)
        scale = float(y.abs().max().item())
        return y.sum() / max(scale, 1.0)
    return _workload(model, lambda: torch.randn(batch_size, 64, device=device), loss)

def inference(batch_size, device):
    model = Net().to(device).to(torch.bfloat16)
    return _workload(model, lambda: torch.randn(batch_size, 64, device=device),
                     lambda m, x: m(x), optimizer=False, precision="bf16-true")

def big(batch_size, device):
    layers = [torch.nn.Linear(16384, 16384, bias=False) for _ in range(8)]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters())
    return vramscope.Workload(model=model, optimizer=opt,
                              batch=lambda: torch.randn(batch_size, 16384, device=device),
                              loss=lambda m, x: m(x).float().pow(2).mean(),
                              precision="bf16-mixed")
"""


@pytest.fixture(scope="module")
def workloads(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wl") / "workloads.py"
    path.write_text(WORKLOADS)
    return path


def test_a_build_on_a_fixed_device_is_named(workloads):
    with pytest.raises(
        WorkloadError, match=r"built its model on cpu \(parameter a.weight\), ignoring the device"
    ):
        estimate(f"{workloads}:fixed_device", 4)


def test_a_size_from_values_the_estimate_lacks_is_assumed_and_said_where(workloads):
    report = estimate(f"{workloads}:data_dependent_shape", 4)
    (assumed,) = report.extra["estimate"]["assumptions"]
    assert assumed["op"] == "argmax" and "workloads.py" in assumed["where"]
    assert any(f.kind == "assumption" for f in report.findings)


def test_item_is_traced_with_a_plausible_value_and_reported(workloads):
    report = estimate(f"{workloads}:item_in_loss", 4)
    found = report.extra["estimate"]["data_dependent"]
    assert len(found) == 1 and "Tensor.item()" in found[0] and "workloads.py" in found[0]
    assert any(f.kind == "data_dependent" for f in report.findings)


def test_inference_has_no_backward_and_a_smaller_context(workloads, gpt):
    report = estimate(f"{workloads}:inference", 4)
    assert [p.name for p in report.phases] == ["data", "forward"]
    assert all(s.mode == "eval" for s in report.steps)
    assert report.startup.context_and_libraries_bytes < gpt.startup.context_and_libraries_bytes
    assert report.categories_at_peak.gradients == 0


def test_unknown_gpu_and_bad_sizes_are_one_line_errors():
    with pytest.raises(VramscopeError, match="unknown GPU 'h900'; known: h200, h100-80gb"):
        estimate("example:gpt", 2, gpu="h900")
    with pytest.raises(VramscopeError, match="cannot read 'garbage' as a size"):
        estimate("example:gpt", 2, memory="garbage")
    with pytest.raises(VramscopeError, match="batch size"):
        estimate("example:gpt", 0)


def test_a_big_model_allocates_nothing_proportional_to_it(workloads):
    psutil = pytest.importorskip("psutil")
    process = psutil.Process()
    before = process.memory_info().rss
    report = estimate(f"{workloads}:big", 8)
    grown = process.memory_info().rss - before
    params = 8 * 16384 * 16384  # 2.1 billion parameters: 8.6 GB in float32
    assert report.workload["parameters"] == params
    assert report.categories_at_peak.parameters == params * 4
    assert grown < 300 * 2**20


def test_the_process_is_left_as_it_was(gpt):
    import torch.nn.functional as F

    assert not torch.cuda.is_available()
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()  # the CPU autograd engine still works
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_an_estimate_works_after_the_process_ran_backward_on_the_cpu(gpt):
    # autograd sizes its per-device threads once, at the first backward of the process
    x = torch.randn(4, requires_grad=True)
    (x * x).sum().backward()
    again = estimate("example:gpt", 16, gpu="h200")
    assert again.peak.allocated_bytes == gpt.peak.allocated_bytes


def test_estimates_are_deterministic(gpt):
    again = estimate("example:gpt", 16, gpu="h200")
    assert again.peak == gpt.peak


def test_a_trace_is_closed_when_it_is_made():
    """Fake tensors of the step freed after the trace was made (when the tracer's frame
    lets them go, or the garbage collector finds them in a cycle) are no events of it: the
    estimate is made of the trace as returned, whatever runs in the process meanwhile."""
    import gc

    from vramscope.estimate.profiles import get_profile
    from vramscope.estimate.trace import trace_workload
    from vramscope.workload import resolve

    traced = trace_workload(resolve("example:gpt"), 16, get_profile("h200"))
    events = len(traced.events)
    gc.collect()
    assert len(traced.events) == events
    assert estimate("example:gpt", 16, gpu="h200").extra["estimate"]["events"] == events


@pytest.mark.parametrize(("spec", "batch"), [("example:gpt", 16), ("example:cnn", 64)])
def test_the_metadata_fast_path_changes_no_number(monkeypatch, spec, batch):
    """``prim.device`` and other metadata queries are answered before the fake mode's own
    dispatch; sending them through it instead gives the same trace and the same peaks."""
    from vramscope.estimate import trace

    fast = estimate(spec, batch, gpu="h200")
    monkeypatch.setattr(trace, "_META_HANDLERS", {})
    slow = estimate(spec, batch, gpu="h200")
    assert slow.peak == fast.peak
    assert slow.extra["estimate"]["events"] == fast.extra["estimate"]["events"]
