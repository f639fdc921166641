"""Attribution on a real GPU: the allocator trace joined with module markers."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.nn.modules import module as module_mod

import vramscope
from vramscope.examples import build_gpt
from vramscope.workload import StepRunner

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _round(n: int) -> int:
    return -(-n // 512) * 512


def _warm_runner(checkpointed: bool = False, batch: int = 8) -> StepRunner:
    torch.manual_seed(0)
    w = build_gpt(batch, CUDA)
    if checkpointed:
        w.model.gradient_checkpointing_enable()
    runner = StepRunner(w, CUDA)
    runner()
    torch.cuda.synchronize()
    return runner


def _tracked(runner: StepRunner, steps: int = 2, **kwargs) -> tuple[vramscope.Session, int]:
    torch.cuda.reset_peak_memory_stats()
    with vramscope.track(detail="modules", **kwargs) as session:
        for _ in range(steps):
            runner()
            session.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    debug = os.environ.get("VRAMSCOPE_DEBUG_DIR")
    if debug:  # keep the event log for a CPU look at a failure (write to $OUT on the device)
        global _DUMPS
        _DUMPS += 1
        log = session._attribution.event_log()
        log.meta["max_memory_allocated"] = peak
        Path(debug).mkdir(parents=True, exist_ok=True)
        log.save(Path(debug) / f"gpu_test_log_{_DUMPS}.json.gz")
    return session, peak


_DUMPS = 0


def test_categories_sum_to_max_memory_allocated_within_one_percent():
    session, expected = _tracked(_warm_runner())
    report = session.report()
    attribution = report.extra["attribution"]
    assert attribution["peak_bytes"] == pytest.approx(expected, rel=0.01)
    assert report.categories_at_peak.total() == pytest.approx(expected, rel=0.01)
    assert "exact at the peak" in (report.categories_note or "")
    assert report.categories_at_peak.activations > 0
    assert not [n for n in report.extra["attribution_notes"] if "failed" in n]


def test_markers_join_the_trace_exactly_where_torch_allows():
    session, _ = _tracked(_warm_runner(), steps=1)
    log = session._attribution.event_log()
    join = log.meta["trace"]["join"]
    if hasattr(torch._C, "_cuda_setMemoryMetadata"):
        assert join == "metadata"
    else:
        assert join == "time"


def test_module_parameters_are_exact_and_blocks_hold_activations():
    runner = _warm_runner()
    session, _ = _tracked(runner)
    report = session.report()
    rows = {m["name"]: m for m in report.modules}
    model = runner.workload.model
    expected = sum(_round(p.numel() * p.element_size()) for p in model.parameters())
    assert rows[""]["parameters_bytes"] == expected
    blocks = [m for m in report.modules if m["name"].startswith("blocks.") and m["depth"] == 2]
    assert blocks and all(m["activations_bytes"] > 0 for m in blocks)
    assert all(m["backward_temporaries_peak_bytes"] > 0 for m in blocks)
    # modules records no stacks (cost): the line is the making module's forward
    assert any(t["line"] for t in report.extra["peak_tensors"])


def test_checkpointing_recomputes_at_backward_time():
    plain, _ = _tracked(_warm_runner())
    ckpt, expected = _tracked(_warm_runner(checkpointed=True))
    p = {m["name"]: m for m in plain.report().modules}
    c = {m["name"]: m for m in ckpt.report().modules}
    assert c["blocks.0"]["recomputed"] >= 1
    assert c["blocks.0"]["activations_bytes"] < p["blocks.0"]["activations_bytes"]
    assert ckpt.report().categories_at_peak.total() == pytest.approx(expected, rel=0.01)


def test_snapshot_is_written_with_module_names(tmp_path):
    target = tmp_path / "snap.pickle"
    session, _ = _tracked(_warm_runner(), steps=1, snapshot=str(target))
    session.report()
    snap = pickle.loads(target.read_bytes())
    trace = snap["device_traces"][torch.cuda.current_device()]
    allocs = [e for e in trace if e["action"] == "alloc"]
    labelled = [e for e in allocs if e["frames"] and e["frames"][0]["filename"] == "vramscope"]
    assert len(labelled) == len(allocs)
    assert any("blocks.0" in e["frames"][0]["name"] for e in labelled)


def test_history_and_hooks_are_off_after_an_exception():
    runner = _warm_runner()
    before = dict(module_mod._global_forward_pre_hooks)
    with pytest.raises(RuntimeError), vramscope.track(detail="modules"):
        runner()
        raise RuntimeError("on purpose")
    assert dict(module_mod._global_forward_pre_hooks) == before
    n = len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])
    x = torch.empty(1 << 20, device=CUDA)
    del x
    after = len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])
    assert after <= n  # nothing recorded any more


def test_line_table_on_gpu_matches_allocations():
    @vramscope.profile(lines=True, print_report=False)
    def work():
        a = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)  # 64 MiB
        b = torch.empty(32 << 20, dtype=torch.uint8, device=CUDA)
        del a
        return b

    torch.empty(1, device=CUDA)
    work()
    table = work.last_report.extra["lines"][0]
    rows = {r["contents"].strip(): r for r in table["lines"]}
    first = next(v for k, v in rows.items() if k.startswith("a = torch.empty"))
    assert first["increment_bytes"] == 64 << 20
    assert rows["del a"]["increment_bytes"] == -(64 << 20)


def test_default_detail_traces_the_first_steps_and_stops():
    """The default detail records the allocator's trace of the first steps (and of the step
    after a new peak), with no module marker, for what the peak is made of; the trace stops
    between those steps and when the session ends."""
    from vramscope.tracking.marking import FIRST_STEPS, expand

    runner = _warm_runner(batch=2)
    before = dict(module_mod._global_forward_pre_hooks)
    with vramscope.track() as session:
        for _ in range(8):
            runner()
    report = session.report()
    recorder = session._attribution
    assert recorder is not None and not recorder.markers
    marked = expand(recorder.schedule.summary()["marked_steps"])
    assert set(range(FIRST_STEPS)) <= marked and len(marked) < 8
    log = recorder.event_log()
    assert not {r[0] for r in log.records} & {"m", "x", "b"}  # no module markers
    # the steps traced, and the first of each run of steps that are not (its marker closes
    # the window before it)
    steps = {r[1] for r in log.records if r[0] == "s"}
    assert steps <= marked | {s + 1 for s in marked}
    assert log.meta["trace"]["windows"] >= 2  # the first steps', and the end's
    assert report.extra["categories_source"] == "allocator-trace"
    assert report.categories_at_peak.total() == pytest.approx(report.peak.allocated_bytes, rel=0.01)
    assert dict(module_mod._global_forward_pre_hooks) == before
    device = torch.cuda.current_device()
    n = len(torch.cuda.memory._snapshot()["device_traces"][device])
    x = torch.empty(1 << 20, device=CUDA)
    del x
    assert len(torch.cuda.memory._snapshot()["device_traces"][device]) <= n  # stopped
