"""fit and compare from the estimator alone, on real workloads; the search logic itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from test_cli import vramscope_here
from vramscope.examples import ExampleCNN, ExampleGPT
from vramscope.fit.compare import compare
from vramscope.fit.search import (
    Estimator,
    _search_from,
    fit,
    largest_fitting,
    make_target,
)
from vramscope.fit.strategies import (
    NotApplicable,
    apply_checkpointing,
    get_strategy,
    repeated_blocks,
)

MiB = 2**20
# one worker runs this module (`--dist loadgroup`): the fit of the CNN is made once
pytestmark = pytest.mark.xdist_group("fit")


def test_interpolation_search_finds_the_boundary_in_few_evaluations():
    calls = []

    def value(b: int) -> int:
        calls.append(b)
        return 500 * MiB + 37 * MiB * b

    limit = 20 * 1024 * MiB
    best = largest_fitting(lambda b: value(b) <= limit, value, limit, 4096)
    assert best == (limit - 500 * MiB) // (37 * MiB)
    assert len(set(calls)) <= 6


def test_search_extrapolates_until_it_finds_an_upper_bound_however_large_the_cap():
    calls = []

    def value(b: int) -> int:
        calls.append(b)
        return 800 * MiB + 13 * MiB * b

    limit = 75 * 1024 * MiB
    best = largest_fitting(lambda b: value(b) <= limit, value, limit, 1 << 20, start=256)
    assert best == (limit - 800 * MiB) // (13 * MiB)
    # no bisection towards the cap (it probed (5850 + 1048577) // 2 before)
    assert max(calls) <= best + 1
    assert len(set(calls)) <= 5


def test_an_estimate_that_runs_out_of_the_gpu_does_not_fit():
    # a huge batch runs out on its first large tensor, with little reserved: its device
    # used is below the GPU's memory, yet it does not fit
    est = Estimator(
        "example:cnn",
        make_target("rtx4090", None, "0%"),
        get_strategy("baseline"),
        None,
        None,
        None,
    )
    verdict = est.report(8192).extra["verdict"]
    assert verdict["oom_at"] is not None
    assert verdict["device_used_bytes"] <= verdict["total_bytes"]
    assert not est.fits(8192)


def test_search_handles_a_staircase_and_the_cap():
    def value(b: int) -> int:
        return ((b + 7) // 8) * 100  # memory in steps, as the allocator's segments grow

    assert largest_fitting(lambda b: value(b) <= 1000, value, 1000, 4096) == 80
    assert largest_fitting(lambda b: value(b) <= 10**9, value, 10**9, 64) == 64
    assert largest_fitting(lambda b: value(b) <= 50, value, 50, 64) == 0


def test_verify_search_needs_two_trials_when_the_estimate_is_exact():
    trials = []

    def fits(b: int) -> bool:
        trials.append(b)
        return b <= 37

    assert _search_from(fits, 37, 1024) == 37
    assert trials == [37, 38]
    trials.clear()
    assert _search_from(fits, 40, 1024) == 37 and len(trials) <= 4


@pytest.fixture(scope="module")
def cnn_fit():
    """One fit of the example CNN under a 512 MiB budget, with the plans for an effective
    batch of 128 (estimated after the search, which they leave as it was)."""
    return fit("example:cnn", budget="512MiB", margin="5%", max_batch_size=512, effective_batch=128)


def test_fit_from_the_estimator_alone(cnn_fit):
    report = cnn_fit
    section = report.extra["fit"]
    best = section["max_batch_size"]
    assert 10 < best < 512
    # under a budget the simulated allocator is capped, as set_per_process_memory_fraction
    # caps the real one: reserved never passes the cap, and a batch that does not fit runs out
    curve = {p["batch_size"]: p for p in section["curve"]}
    assert curve[best]["fits"] and curve[best]["peak"]["reserved_bytes"] <= 0.95 * 512 * MiB
    assert any(b > best and not p["fits"] for b, p in curve.items())
    assert section["max_batch_size_without_margin"] >= best
    data = report.to_dict()
    assert isinstance(data["fit"]["max_batch_size"], int)


def test_a_budget_below_the_parameters_says_what_is_needed():
    report = fit("example:gpt", budget="16MiB")
    section = report.extra["fit"]
    assert section["max_batch_size"] == 0
    assert section["needed_at_batch_1_bytes"] > 16 * MiB
    message = report.findings[0].message
    assert "Does not fit, even at batch size 1" in message and "parameters alone" in message


def test_effective_batch_plans(cnn_fit):
    report = cnn_fit
    plans = report.extra["fit"]["plans"]
    assert all(p["micro_batch"] * p["accumulate"] == 128 for p in plans)
    assert not plans[0]["fits"] and len(plans) > 1  # from the largest micro-batch down
    rec = report.extra["fit"]["recommended_plan"]
    assert rec["fits"] and rec["micro_batch"] <= report.extra["fit"]["max_batch_size"]


def test_compare_strategies_estimated():
    report = compare(
        ["example:gpt"],
        batch_size=8,
        gpu="h200",
        strategies=["baseline", "bf16-mixed", "sgd", "accumulate-x2"],
        measured=False,
    )
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    base = rows["baseline"]["peak"]["allocated_bytes"]
    assert rows["bf16-mixed"]["peak"]["allocated_bytes"] < base
    assert rows["sgd"]["peak"]["allocated_bytes"] < base  # no AdamW state
    assert rows["accumulate-x2"]["peak"]["allocated_bytes"] < base
    for row in rows.values():
        assert set(row["peak"]) >= {"allocated_bytes", "reserved_bytes", "device_used_bytes"}
    assert report.extra["fit"]["recommendation"]["message"]


def test_rows_that_run_out_are_compared_by_what_they_need():
    """Under a budget no row fits: each row's figures, its saving and the closest row are
    what it needs uncapped (as estimate's verdict says), not the bytes where the capped
    allocator ran out, which are all about the budget."""
    from vramscope.estimate.estimator import estimate

    report = compare(
        ["example:gpt"],
        batch_size=16,
        budget="100MiB",
        strategies=["baseline", "accumulate-x4"],
        measured=False,
    )
    fit = report.extra["fit"]
    rows = {r["name"]: r for r in fit["strategies"]}
    assert all(r["runs_out"] and not r["fits"] for r in rows.values())
    alone = estimate("example:gpt", 16)
    assert rows["baseline"]["peak"]["reserved_bytes"] == alone.peak.reserved_bytes
    assert (
        rows["accumulate-x4"]["peak"]["reserved_bytes"] < rows["baseline"]["peak"]["reserved_bytes"]
    )
    assert rows["accumulate-x4"]["saving_pct"]["reserved_bytes"] > 0
    assert fit["recommendation"]["closest"] == "accumulate-x4"


def test_checkpointing_strategy_saves_activations_estimated():
    report = compare(["example:cnn"], batch_size=32, strategies=["checkpointing"], measured=False)
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    assert (
        rows["checkpointing"]["peak"]["allocated_bytes"]
        < 0.8 * rows["baseline"]["peak"]["allocated_bytes"]
    )


def test_strategy_that_does_not_apply_is_skipped_with_its_reason(tmp_path):
    wl = tmp_path / "infer.py"
    wl.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    m = torch.nn.Linear(64, 64).to(device)\n"
        "    return vramscope.Workload(model=m, batch=lambda: torch.randn(batch_size, 64, device=device),\n"
        "                              loss=lambda m, x: m(x))\n"
    )
    report = compare([f"{wl}:build"], batch_size=4, strategies=["baseline", "sgd"], measured=False)
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    assert "inference has no optimizer" in rows["sgd"]["skipped"]


def test_a_list_of_one_optimizer_is_that_optimizer_and_of_two_is_skipped(tmp_path):
    """``optimizer=[opt]`` is one optimizer to a strategy that rebuilds it; a GAN's two
    are not, and the row says so."""
    wl = tmp_path / "lists.py"
    wl.write_text(
        "import torch, vramscope\n"
        "def build(n, batch_size, device):\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)).to(device)\n"
        "    opts = [torch.optim.AdamW(m[i].parameters()) for i in range(n)] if n == 2 else\\\n"
        "        [torch.optim.AdamW(m.parameters())]\n"
        "    return vramscope.Workload(model=m, optimizer=opts, batch=lambda: torch.randn(\n"
        "        batch_size, 64, device=device), loss=lambda m, x: m(x).sum())\n"
        "def one(batch_size, device):\n"
        "    return build(1, batch_size, device)\n"
        "def two(batch_size, device):\n"
        "    return build(2, batch_size, device)\n"
    )
    for name, applies in (("one", True), ("two", False)):
        report = compare([f"{wl}:{name}"], batch_size=4, strategies=["baseline", "sgd"],
                         measured=False)  # fmt: skip
        sgd = {r["name"]: r for r in report.extra["fit"]["strategies"]}["sgd"]
        assert ("skipped" not in sgd) is applies, sgd
        if not applies:
            assert (
                "needs the workload's optimizer to be one torch.optim.Optimizer" in sgd["skipped"]
            )


def test_checkpointing_finds_the_repeated_blocks():
    gpt = ExampleGPT()
    assert len(repeated_blocks(gpt)) == 4
    assert "gradient_checkpointing_enable" in apply_checkpointing(gpt)
    cnn = ExampleCNN()
    assert "ResidualBlock" in apply_checkpointing(cnn)
    with pytest.raises(NotApplicable):
        apply_checkpointing(torch.nn.Linear(2, 2))


def test_checkpointing_keeps_the_loss():
    torch.manual_seed(0)
    cnn = ExampleCNN()
    x = torch.randn(2, 3, 32, 32)
    plain = cnn(x).sum()
    apply_checkpointing(cnn)
    assert torch.equal(cnn(x).sum(), plain)


def test_unknown_strategy():
    with pytest.raises(Exception, match="unknown strategy"):
        get_strategy("magic")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["fit", "example:cnn"], "--gpu NAME or --budget SIZE"),
        (["fit", "example:cnn", "--gpu", "gtx9999"], "unknown GPU"),
        (["fit", "example:cnn", "--budget", "24 parsecs"], "as a size"),
        (["compare", "example:cnn", "--strategies", "magic"], "unknown strategy"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle):
    proc = vramscope_here(*args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def test_bad_input_in_a_fresh_process_is_one_line_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "compare", "example:cnn", "--strategies", "magic"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "unknown strategy" in proc.stderr


def test_fit_cli_says_what_a_too_small_budget_would_need():
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "fit", "example:gpt", "--budget", "16MiB"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr  # answered: it does not fit
    assert proc.stdout.startswith("Does not fit, even at batch size 1: it needs ")
    out = " ".join(proc.stdout.split())
    assert "parameters alone" in out and "closest strategy" in out


def test_fit_cli_writes_the_fit_section(tmp_path):
    out = tmp_path / "fit.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramscope",
            "fit",
            "example:gpt",
            "--budget",
            "2GiB",
            "--max-batch-size",
            "8",  # holds less than half the budget: the answer after a few estimates
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Largest batch size: at least 8" in proc.stdout
    assert json.loads(out.read_text())["fit"]["max_batch_size"] == 8


def test_verify_jumps_to_where_the_measured_peak_says_the_limit_is():
    """An estimate 7% low (as for CNNs whose cuDNN workspaces the estimator misses)
    still needs three real trials: seed, the predicted boundary, its neighbour."""
    limit = 100 + 9 * 224.5
    trials: list[int] = []

    def fits(b: int) -> bool:
        trials.append(b)
        return 100 + 9 * b <= limit

    def predict(b: int) -> int:  # measured peak at b, the estimate's slope (3% off)
        return b + int((limit - (100 + 9 * b)) / 8.7)

    assert _search_from(fits, 208, 1024, predict) == 224
    assert len(trials) == 3


def test_a_workload_that_ignores_the_batch_size_is_called_out(tmp_path):
    wl = tmp_path / "fixed.py"
    wl.write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    m = torch.nn.Linear(256, 256).to(device)\n"
        "    opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "    return vramscope.Workload(model=m, optimizer=opt,\n"
        "        batch=lambda: torch.randn(32, 256, device=device),  # always 32: batch_size unused\n"
        "        loss=lambda m, x: m(x).square().mean())\n"
    )
    report = fit(f"{wl}:build", budget="1GiB", max_batch_size=64)
    section = report.extra["fit"]
    assert section["batch_size_has_no_effect"] and section["max_batch_size"] == 64
    assert any("does not grow with the batch size" in f.message for f in report.findings)


def test_verify_second_jump_uses_the_slope_between_two_measured_trials():
    """When the estimate's bytes per sample are off (here 15% high, and memory grows a
    little faster than linearly), the second jump uses the slope between the two fitting
    trials and lands on the limit."""
    trials: list[int] = []

    def peak(b: int) -> float:
        return 1000 + 10 * b + 0.002 * b * b

    limit = peak(300.4)

    def fits(b: int) -> bool:
        trials.append(b)
        return peak(b) <= limit

    measured: dict[int, float] = {}

    def predict(b: int) -> int:
        measured[b] = peak(b)
        others = [o for o in measured if o != b]
        slope = 12.5 if not others else (peak(b) - peak(others[-1])) / (b - others[-1])
        return b + int((limit - peak(b)) / slope)

    assert _search_from(fits, 200, 4096, predict) == 300
    assert len(trials) <= 4


def test_an_accumulation_of_thousands_is_estimated_as_its_first_micro_batches():
    """From the second micro-batch on each holds what the one before held: 4 traced stand
    for any number (the same peak as 4), so an effective batch of billions plans at once."""
    from vramscope.estimate.estimator import estimate

    four = estimate("example:gpt", 4, accumulate=4)
    many = estimate("example:gpt", 4, accumulate=5000)
    assert many.peak.allocated_bytes == four.peak.allocated_bytes
    assert many.peak.reserved_bytes == four.peak.reserved_bytes
    assert many.workload["accumulate"] == 5000
    assert any("accumulate 5000: 4 micro-batches" in n for n in many.extra["estimate"]["notes"])


def test_accumulation_rows_multiply_the_workloads_own_accumulation(tmp_path):
    """A workload that accumulates 4 itself: accumulate-x2 halves its micro-batch and
    accumulates 8, the same effective batch."""
    from vramscope.fit.search import Estimator, make_target
    from vramscope.fit.strategies import get_strategy

    (tmp_path / "acc.py").write_text(
        "import torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    model = torch.nn.Linear(16, 16).to(device)\n"
        "    return vramscope.Workload(model=model, optimizer=torch.optim.SGD(model.parameters()),\n"
        "        batch=lambda: (torch.randn(batch_size, 16, device=device),),\n"
        "        loss=lambda m, x: m(x).sum(), accumulate=4)\n"
    )
    target = make_target("l4", None, None)
    used = {}
    for name in ("baseline", "accumulate-x2"):
        est = Estimator(f"{tmp_path}/acc.py:build", target, get_strategy(name), None, None, None)
        used[name] = est.report(8).workload["accumulate"]
    assert used == {"baseline": 4, "accumulate-x2": 8}
