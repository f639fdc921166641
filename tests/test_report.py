"""The Report model and the analysis over it, fed with reports recorded on an NVIDIA H200."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from vramscope.errors import VramscopeError
from vramscope.report.findings import add_findings
from vramscope.report.model import Report
from vramscope.report.terminal import render
from vramscope.tracking.sampler import SampleBuffer, Sampler

DATA = Path(__file__).parent / "data"


def load(name: str) -> Report:
    return Report.load(DATA / name)


def test_json_round_trip_is_lossless(tmp_path):
    report = load("report_h200_gpt.json")
    path = report.save(tmp_path / "again.json")
    again = Report.load(path)
    assert again == report
    assert again.save(tmp_path / "third.json").read_text() == path.read_text()


def test_unknown_sections_from_newer_versions_are_kept(tmp_path):
    data = json.loads((DATA / "report_h200_gpt.json").read_text())
    data["schema"] = "vramscope.report/1.7"
    data["future_section"] = {"x": 1}
    report = Report.from_dict(data)
    assert report.to_dict()["future_section"] == {"x": 1}


def test_another_major_schema_is_refused():
    with pytest.raises(VramscopeError, match="upgrade vramscope"):
        Report.from_dict({"schema": "vramscope.report/2"})


def test_recorded_gpu_report_has_the_contract_keys():
    data = json.loads((DATA / "report_h200_gpt.json").read_text())
    for key in (
        "schema",
        "kind",
        "workload",
        "device",
        "peak",
        "categories_at_peak",
        "phases",
        "modules",
        "steps",
    ):
        assert key in data
    assert set(data["peak"]) >= {"allocated_bytes", "reserved_bytes", "device_used_bytes"}
    assert data["device"]["name"] == "NVIDIA H200"


def test_categories_at_the_peak_sum_to_the_peak():
    report = load("report_h200_gpt.json")
    assert report.categories_at_peak.total() == report.peak.allocated_bytes
    assert report.peak.step == 1 and report.peak.phase == "backward"


def test_reconciliation_from_tensors_to_the_device_total():
    end = next(r for r in load("report_h200_gpt.json").reconciliation if r.moment == "end")
    assert end.tensors.total() == end.allocated_bytes
    assert (
        end.allocated_bytes + end.slack.cached_free_bytes + end.slack.fragmentation_bytes
        == end.reserved_bytes
    )
    assert end.reserved_bytes + end.context_and_libraries_bytes == end.device_used_bytes
    # the context and libraries on an H200 with torch 2.11: several hundred MiB
    assert 500 * 2**20 < end.context_and_libraries_bytes < 1200 * 2**20


def test_leak_is_found_with_its_rate_and_phase():
    report = add_findings(load("report_h200_leak.json"))
    leak = next(f for f in report.findings if f.kind == "leak")
    assert leak.data["growth_per_step_bytes"] == 2 * 2**20
    assert leak.data["phase"] == "optimizer"


def test_no_leak_in_a_steady_run():
    report = add_findings(load("report_h200_gpt.json"))
    kinds = {f.kind for f in report.findings}
    assert "leak" not in kinds
    assert "first_step" in kinds  # AdamW state is created in step 0's optimizer phase
    assert "empty_cache" in kinds


def test_terminal_rendering_answers_the_nvidia_smi_question():
    console = Console(record=True, width=120)
    console.print(render(load("report_h200_gpt.json")))
    text = console.export_text()
    assert "Why nvidia-smi shows more than max_memory_allocated" in text
    assert "context and libraries" in text and "NVIDIA H200" in text


def test_sample_buffer_is_bounded_and_keeps_every_peak():
    buffer = SampleBuffer(capacity=64)
    for i in range(10_000):
        value = 5000 if i == 7777 else i % 100
        buffer.add((float(i), value, value, None, value))
    samples = buffer.snapshot()
    assert len(samples) <= 65
    assert max(s[1] for s in samples) == 5000
    assert samples[-1][0] >= 9_900


def test_a_longer_interval_set_while_the_sampler_sleeps_holds_at_once():
    """The session slows the sampler on short steps while it sleeps: the tick already due
    on the old interval reads nothing; the next sample comes on the new one."""
    times: list[float] = []

    def read(t: float) -> tuple:
        times.append(t)
        return (t, None, None, None, None)

    sampler = Sampler(read, interval_s=0.2)
    sampler.start()
    try:
        time.sleep(0.05)
        sampler.interval_s = 3.0  # the tick due at 0.2 s reads nothing
        time.sleep(0.6)
        assert len(times) == 1
    finally:
        sampler.stop()
    kept = Sampler(read, interval_s=0.05)
    times.clear()
    kept.start()
    time.sleep(0.5)
    kept.stop()
    assert 5 <= len(times) <= 12  # every 0.05 s, none in a burst


def test_the_sampler_starts_its_grid_at_a_sample_just_taken():
    """The session takes its first sample before it starts the thread: the thread does not
    take the same sample again at once, and its next one comes an interval later."""
    times: list[float] = []

    def read(t: float) -> tuple:
        times.append(t)
        return (t, None, None, None, None)

    sampler = Sampler(read, interval_s=0.2)
    sampler.sample_now()
    sampler.start()
    try:
        time.sleep(0.1)
        assert len(times) == 1
        time.sleep(0.25)
        assert len(times) == 2 and 0.19 <= times[1] - times[0] <= 0.3
    finally:
        sampler.stop()


def _host_run(leak_bytes: int, workers: tuple[int, ...]) -> list:
    """A real CPU training run, its steps long enough for a host-memory reading each: each
    step keeps ``leak_bytes`` more (a list of tensors); an epoch per entry of ``workers``,
    over a DataLoader of that many workers."""
    import time

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import vramscope

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 16), torch.randint(0, 3, (96,)))
    model = torch.nn.Linear(16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    loaders = {
        n: DataLoader(data, batch_size=8, num_workers=n, persistent_workers=n > 0)
        for n in set(workers)
    }
    with vramscope.track(journal=None) as session:
        for n in workers:
            for x, y in loaders[n]:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                if leak_bytes:
                    kept.append(torch.ones(leak_bytes // 4))
                time.sleep(0.15)  # a sample of the host's memory in every step
    return session.report().findings


def test_host_memory_kept_by_every_step_is_found_with_its_rate():
    # 16 MiB a step, four times the finding's threshold: a loaded machine's sampler, late
    # for some steps, reads a lower slope (5.6 of 8 MiB seen under the test suite's load)
    findings = _host_run(16 * 2**20, workers=(0, 0))
    growth = next(f for f in findings if f.kind == "host_growth")
    assert 8 * 2**20 <= growth.data["growth_per_step_bytes"] <= 20 * 2**20


def test_dataloader_workers_started_midway_are_not_growth():
    """A first epoch without workers, then two over a loader of two workers: their memory
    joins the process tree's at one reading and stays flat, a jump and a plateau that a
    slope fitted over the steps reads as growth."""
    findings = _host_run(0, workers=(0, 2, 2))
    assert "host_growth" not in {f.kind for f in findings}


@pytest.mark.parametrize(
    ("schema", "said"),
    [("vramscope.demo/1", "vramscope demo's file"), ("vramscope.diff/1", "--diff B")],
)
def test_another_vramscope_file_is_named_when_a_report_is_expected(schema, said):
    from vramscope.errors import VramscopeError

    with pytest.raises(VramscopeError, match="not a vramscope report: this is") as raised:
        Report.from_dict({"schema": schema})
    assert said in str(raised.value)
