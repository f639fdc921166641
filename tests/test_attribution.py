"""Per-module and per-category attribution on real CPU runs, and on a trace recorded on a GPU."""

from __future__ import annotations

import gc
import json
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.utils.checkpoint import checkpoint

import vramscope
from vramscope.report.modules import CATEGORIES, analyze
from vramscope.tracking.events import (
    EventLog,
    merge_allocator_trace,
    merge_trace_windows,
    trim_records,
)
from vramscope.workload import StepRunner

DATA = Path(__file__).parent / "data"
F32 = 4


class Block(nn.Module):
    def __init__(self, dim: int, checkpointed: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.checkpointed = checkpointed

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed:
            return x + checkpoint(self.inner, x, use_reentrant=False)
        return x + self.inner(x)


class TinyLM(nn.Module):
    """Embedding, two blocks, a head tied to the embedding."""

    def __init__(self, vocab: int = 50, dim: int = 32, checkpointed: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, checkpointed) for _ in range(2))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train(model: nn.Module, steps: int = 2, batch: int = 8, seq: int = 16) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, 50, (batch, seq))
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def tracked(model: nn.Module, detail: str = "modules", **kwargs) -> vramscope.Session:
    torch.manual_seed(0)
    with vramscope.track(detail=detail, device="cpu") as session:
        train(model, **kwargs)
    return session


def rows_by_name(report) -> dict[str, dict]:
    return {m["name"]: m for m in report.modules}


def test_categories_at_peak_sum_to_the_tracked_peak():
    report = tracked(TinyLM()).report()
    cats = report.categories_at_peak
    peak = report.extra["attribution"]["peak_bytes"]
    assert peak > 0
    assert cats.total() == pytest.approx(peak, rel=0.01)
    assert set(report.extra["attribution"]["categories"]) == set(CATEGORIES)
    assert report.extra["attribution_notes"] == []  # nothing failed on the way


def test_tied_weights_are_counted_once():
    model = TinyLM()
    report = tracked(model).report()
    unique = sum(p.numel() * F32 for p in model.parameters())  # parameters() dedups
    assert report.categories_at_peak.parameters == unique
    rows = rows_by_name(report)
    assert rows[""]["parameters_bytes"] == unique
    assert rows["head"]["parameters_bytes"] == 0  # the shared weight belongs to emb
    assert rows["emb"]["parameters_bytes"] == 50 * 32 * F32


def test_module_tree_names_depth_and_optimizer_state():
    model = TinyLM()
    report = tracked(model).report()
    rows = rows_by_name(report)
    assert rows[""]["class"] == "TinyLM" and rows[""]["depth"] == 0
    assert rows["blocks.0.fc1"]["depth"] == 3
    fc1 = model.blocks[0].fc1
    fc1_bytes = (fc1.weight.numel() + fc1.bias.numel()) * F32
    assert rows["blocks.0.fc1"]["parameters_bytes"] == fc1_bytes
    # AdamW: two moments per parameter, and a scalar step count each
    assert rows["blocks.0.fc1"]["optimizer_state_bytes"] == 2 * fc1_bytes + 2 * F32
    # the peak is in step 1's backward, before the gradient reached blocks.0: what each
    # module holds is what it holds at the peak, and the tree adds up to the categories
    assert report.extra["attribution"]["peak_phase"] == "backward"
    assert rows["blocks.0.fc1"]["gradients_bytes"] == 0
    assert 0 < rows[""]["gradients_bytes"] == report.categories_at_peak.gradients < fc1_bytes
    assert rows["blocks.0"]["parameters_bytes"] == sum(
        p.numel() * F32 for p in model.blocks[0].parameters()
    )
    assert all(rows[n]["calls"] == 1 for n in ("blocks.0", "blocks.1.fc2", "head"))


def test_activations_are_what_a_forward_saves_for_backward():
    batch, seq, dim = 8, 16, 32
    report = tracked(TinyLM(), batch=batch, seq=seq).report()
    rows = rows_by_name(report)
    # ReLU saves its output (tokens x 4*dim floats); fc2 saves its input, the same tensor
    tokens = batch * seq
    assert rows["blocks.0.act"]["activations_bytes"] == tokens * 4 * dim * F32
    assert rows["blocks.0.fc2"]["activations_bytes"] == 0
    # fc1's output is freed by the ReLU (not in place): a forward temporary, not saved
    assert rows["blocks.0.fc1"]["activations_bytes"] == 0
    assert rows["blocks.0"]["forward_temporaries_peak_bytes"] >= tokens * 4 * dim * F32


def test_peak_tensors_say_what_where_and_which_line():
    report = tracked(TinyLM()).report()
    tensors = report.extra["peak_tensors"]
    assert 0 < len(tensors) <= 20
    assert tensors == sorted(tensors, key=lambda t: -t["bytes"])
    first = tensors[0]
    assert {"bytes", "category", "module", "phase", "shape", "dtype", "line"} <= set(first)
    made_here = [t for t in tensors if t["line"] and Path(__file__).name in t["line"]]
    assert made_here, tensors
    optimizer_state = [t for t in tensors if t["category"] == "optimizer_state"]
    assert all(t["name"].endswith(("exp_avg", "exp_avg_sq", "step")) for t in optimizer_state)


def test_module_called_twice_per_step_counts_two_calls():
    shared = nn.Linear(16, 16)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = shared

        def forward(self, x):
            return self.shared(torch.relu(self.shared(x)))

    model = Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with vramscope.track(detail="modules", device="cpu") as session:
        for _ in range(2):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    rows = rows_by_name(session.report())
    assert rows["shared"]["calls"] == 2
    assert rows["shared"]["calls_total"] == 4


def test_checkpointed_recomputation_is_backward_time_and_not_double_counted():
    plain = rows_by_name(tracked(TinyLM()).report())
    ckpt_report = tracked(TinyLM(checkpointed=True)).report()
    ckpt = rows_by_name(ckpt_report)
    assert ckpt["blocks.0.fc1"]["calls"] == 1  # the forward call; not the recomputation
    assert ckpt["blocks.0.fc1"]["recomputed"] == 1
    # inside the checkpoint nothing is saved: the block keeps only its input
    assert ckpt["blocks.0.act"]["activations_bytes"] == 0
    assert ckpt["blocks.0"]["activations_bytes"] < plain["blocks.0"]["activations_bytes"]
    # the recomputed activations show up as backward temporaries of the block
    assert ckpt["blocks.0"]["backward_temporaries_peak_bytes"] >= 8 * 16 * 4 * 32 * F32


def test_in_place_ops_make_no_new_block():
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x):
            y = self.fc(x)
            y.mul_(2).add_(1).relu_()
            return y

    model = InPlace()
    with vramscope.track(detail="modules", device="cpu") as session, torch.no_grad():
        model(torch.randn(128, 64))
    rows = rows_by_name(session.report())
    assert rows[""]["forward_temporaries_peak_bytes"] == 0  # y is the only block it made
    assert session.report().extra["attribution"]["stats"]["allocations"] == 2  # x and y


def test_user_hooks_keep_working_and_all_hooks_are_removed():
    model = TinyLM()
    seen = []
    handle = model.blocks[0].register_forward_hook(lambda m, a, o: seen.append(o.shape))
    before_pre = dict(module_mod._global_forward_pre_hooks)
    before_post = dict(module_mod._global_forward_hooks)
    tracked(model)
    assert len(seen) == 2
    handle.remove()
    assert dict(module_mod._global_forward_pre_hooks) == before_pre
    assert dict(module_mod._global_forward_hooks) == before_post
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None


def test_an_exception_removes_every_hook_and_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model = TinyLM()
    before_pre = dict(module_mod._global_forward_pre_hooks)
    with (
        pytest.raises(RuntimeError, match="on purpose"),
        vramscope.track(detail="lines", device="cpu", lines_of=[train]),
    ):
        model(torch.randint(0, 50, (2, 4))).sum().backward()
        raise RuntimeError("on purpose")
    assert dict(module_mod._global_forward_pre_hooks) == before_pre
    assert _get_current_dispatch_mode() is None
    import sys

    assert sys.gettrace() is None or "LineTracer" not in repr(sys.gettrace())


def test_failed_session_still_reports_the_partial_attribution():
    model = TinyLM()
    session = vramscope.track(detail="modules", device="cpu")
    with pytest.raises(ValueError), session:
        model(torch.randint(0, 50, (2, 4))).sum().backward()
        raise ValueError("boom")
    report = session.report()
    assert report.exit.status == "error"
    assert rows_by_name(report)[""]["calls"] == 1


def test_measure_with_modules_detail_on_an_example_workload():
    report = vramscope.measure(
        "example:gpt", batch_size=2, steps=2, device="cpu", detail="modules", depth=2
    )
    rows = report.modules
    assert rows[0]["name"] == "" and rows[0]["class"] == "ExampleGPT"
    assert max(r["depth"] for r in rows) <= 2
    assert report.categories_at_peak.total() == pytest.approx(
        report.extra["attribution"]["peak_bytes"], rel=0.01
    )
    # top modules first: siblings in order of their share of the peak
    blocks = [r for r in rows if r["depth"] == 1]
    shares = [r["share_of_peak"] for r in blocks]
    assert shares == sorted(shares, reverse=True)


def test_standard_step_categories_match_the_objects():
    torch.manual_seed(0)
    from vramscope.examples import build_cnn

    w = build_cnn(4, torch.device("cpu"))
    runner = StepRunner(w, torch.device("cpu"))
    with vramscope.track(detail="modules", device="cpu") as session:
        for _ in range(2):
            runner()
            session.step()
    cats = session.report().categories_at_peak
    params = sum(p.numel() * p.element_size() for p in w.model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in w.model.buffers())
    assert cats.parameters == params
    assert cats.buffers == buffers


def test_report_round_trips_through_json(tmp_path):
    report = tracked(TinyLM()).report()
    path = report.save(tmp_path / "r.json")
    again = vramscope.Report.load(path) if hasattr(vramscope, "Report") else None
    data = json.loads(path.read_text())
    assert data["modules"][0]["name"] == ""
    assert "peak_tensors" in data
    if again is not None:
        assert again.modules == report.modules


def test_snapshot_opens_as_a_memory_viz_pickle_with_module_names(tmp_path):
    target = tmp_path / "snap.pickle"
    with vramscope.track(detail="modules", device="cpu", snapshot=str(target)) as session:
        train(TinyLM(), steps=1)
    session.report()
    snap = pickle.loads(target.read_bytes())
    trace = snap["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert allocs and all("category" in e for e in allocs)
    names = {e["frames"][0]["name"] for e in allocs if e["frames"]}
    assert any(n.startswith("blocks.0.act · forward · activations") for n in names), names
    assert "unknown" in {e.get("category") for e in trace}  # the viewer needs it
    with target.open("rb") as f:  # protocol 4: what the viewer's unpickler reads
        assert f.read(2) == b"\x80\x04"


def test_compiled_module_is_attributed_or_explained():
    model = TinyLM()
    try:
        compiled = torch.compile(model, backend="eager")
        compiled(torch.randint(0, 50, (2, 4)))
    except Exception as exc:  # pragma: no cover - depends on the platform
        pytest.skip(f"torch.compile does not run here: {exc}")
    with vramscope.track(detail="modules", device="cpu") as session:
        out = compiled(torch.randint(0, 50, (2, 4)))
        out.sum().backward()
    report = session.report()
    names = {m["name"] for m in report.modules}
    assert {"", "_orig_mod", "blocks.0"} <= names  # the model's own names, not _orig_mod.*
    assert any("torch.compile" in n for n in report.extra["attribution_notes"])
    total = report.extra["attribution"]["peak_bytes"]
    assert report.categories_at_peak.total() == pytest.approx(total, rel=0.01)


# ---- the pure parts: trimming a long log, merging a CUDA trace ----------------------------------


def test_trimming_keeps_blocks_still_live_as_baseline():
    records = [["a", 0, 100, 10, -1, None, None], ["a", 1, 200, 20, -1, None, None], ["f", 0]]
    records += [["s", 1], ["a", 2, 300, 30, -1, None, None]]
    kept, baseline = trim_records(records, [], 3)
    assert kept[0] == ["s", 1]
    assert baseline == [[1, 200, 20]]


def test_merge_orders_markers_by_allocator_metadata():
    trace = [
        {"action": "alloc", "addr": 1, "size": 512, "user_metadata": "1"},
        {"action": "alloc", "addr": 2, "size": 1024, "user_metadata": "2"},
        {"action": "free_requested", "addr": 1, "size": 512, "user_metadata": "3"},
        {"action": "free_completed", "addr": 1, "size": 512, "user_metadata": "3"},
        {"action": "free_requested", "addr": 9, "size": 2048, "user_metadata": "3"},
    ]
    markers = [["p", "forward"], ["m", 0], ["x", 0]]
    records, baseline, _, info = merge_allocator_trace(
        trace, [{"address": 2, "size": 1024}, {"address": 7, "size": 4096}], markers
    )
    kinds = [r[0] + (str(r[1]) if r[0] in "mx" else "") for r in records]
    assert kinds == ["p", "a", "m0", "a", "x0", "f", "f"]
    assert info["join"] == "metadata"
    assert sorted(b[2] for b in baseline) == [2048, 4096]  # freed unseen; live unseen


def test_a_block_freed_unseen_takes_the_whole_free_block_as_the_allocator_gave_it():
    """What an H200 run of an HF Trainer script under --detail lines showed: the trace ran
    from the start, the model was freed at the script's end, and one 4 MiB weight had been
    placed at the tail of a 20 MiB segment with 1 MiB left after it. The allocator does not
    split off 1 MiB or less: the block is 5 MiB, and the peak counts 5 MiB. The free entry
    says 4 MiB (what was asked for); the block is sized as a new one with the same
    neighbours would be, so the replayed peak is ``max_memory_allocated`` again."""
    mib = 1 << 20
    seg = 1 << 40
    trace = [
        {"action": "alloc", "addr": seg + 4 * mib, "size": 2 * mib},
        {"action": "free_requested", "addr": seg + 15 * mib, "size": 4 * mib},
        {"action": "free_completed", "addr": seg + 15 * mib, "size": 4 * mib},
    ]
    active = [{"address": seg, "size": 4 * mib}, {"address": seg + 4 * mib, "size": 2 * mib}]
    _, baseline, _, _ = merge_allocator_trace(trace, active, [], segment_spans=[[seg, 20 * mib]])
    sizes = {addr - seg: size for _, addr, size in baseline}
    # the freed weight: its whole free block; the live ones: as the snapshot states them
    assert sizes == {15 * mib: 5 * mib, 0: 4 * mib}


def test_overflowed_log_is_bounded_and_reported(monkeypatch):
    from vramscope.tracking import attribution

    monkeypatch.setattr(attribution, "MAX_RECORDS", 300)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with vramscope.track(detail="modules", device="cpu") as session:
        for _ in range(40):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    report = session.report()
    assert len(session._attribution.log) < 600
    assert any("earlier steps were dropped" in n for n in report.extra["attribution_notes"])
    assert report.categories_at_peak.parameters == sum(p.numel() * F32 for p in model.parameters())


# ---- recorded on a GPU -----------------------------------------------------------------------------

FIXTURE = DATA / "attribution_h200_gpt.json.gz"


@pytest.mark.skipif(
    not FIXTURE.exists(), reason="record with tests/gpu/record_attribution_fixture.py"
)
def test_recorded_cuda_trace_categories_sum_to_the_allocator_peak():
    log = EventLog.load(FIXTURE)
    expected = log.meta["max_memory_allocated"]
    analysis = analyze(log)
    assert sum(analysis["categories"].values()) == analysis["peak"]["allocated_bytes"]
    assert analysis["peak"]["allocated_bytes"] == pytest.approx(expected, rel=0.01)
    rows = {m["name"]: m for m in analysis["modules"]}
    assert rows[""]["parameters_bytes"] == log.meta["parameter_bytes"]
    assert analysis["categories"]["activations"] > 0
    assert analysis["peak_tensors"][0]["bytes"] >= analysis["peak_tensors"][-1]["bytes"]


@pytest.mark.skipif(
    not FIXTURE.exists(), reason="record with tests/gpu/record_attribution_fixture.py"
)
def test_recorded_cuda_trace_attributes_backward_to_modules():
    analysis = analyze(EventLog.load(FIXTURE), depth=2)
    blocks = [m for m in analysis["modules"] if m["name"].startswith("blocks.")]
    assert len(blocks) == 4  # the same structure the CPU path shows
    assert all(m["activations_bytes"] > 0 for m in blocks)
    assert all(m["backward_temporaries_peak_bytes"] > 0 for m in blocks)
    assert all(m["forward_temporaries_peak_bytes"] >= 0 and m["calls"] == 1 for m in blocks)
    sizes = [m["activations_bytes"] for m in blocks]  # identical blocks: the same tensors,
    assert max(sizes) <= 1.1 * min(sizes)  # blocks differ only by the allocator's rounding
    assert all(m["recomputed"] == 0 for m in blocks)  # nothing is recomputed without checkpointing


@pytest.mark.skipif(
    not FIXTURE.exists(), reason="record with tests/gpu/record_attribution_fixture.py"
)
def test_recorded_cuda_trace_sizes_blocks_as_the_allocator_does():
    log = EventLog.load(FIXTURE)
    analyze(log)
    sizes = [r[3] for r in log.records if r[0] == "a"]
    assert all(size % 512 == 0 for size in sizes)  # requests rounded to whole blocks
    assert log.meta["trace"]["changed_sizes"] > 0  # a 3 MiB request in a free 4 MiB block
    again = [r[3] for r in log.records if r[0] == "a"]
    analyze(log)  # sizing twice changes nothing
    assert [r[3] for r in log.records if r[0] == "a"] == again


@pytest.mark.skipif(
    not FIXTURE.exists(), reason="record with tests/gpu/record_attribution_fixture.py"
)
def test_recorded_cuda_trace_peak_before_the_first_step_still_shows_the_modules():
    # memory freed during the run (a previous model collected by gc) puts the peak at the
    # log's start, in no step: per-module numbers still describe a step with a backward
    log = EventLog.load(FIXTURE)
    garbage = 1 << 30
    log.baseline.append([(1 << 41), 1, garbage])
    log.records.insert(0, ["f", 1 << 41])
    analysis = analyze(log, depth=2)
    assert analysis["peak"]["record"] == -1 and analysis["peak"]["step"] is None
    blocks = [m for m in analysis["modules"] if m["name"].startswith("blocks.")]
    assert blocks and all(m["activations_bytes"] > 0 for m in blocks)
    assert all(m["backward_temporaries_peak_bytes"] > 0 for m in blocks)


PLAIN_LOG = DATA / "attribution_h200_plain_log.json.gz"


def _raw_trace(log: EventLog, token: str) -> tuple[list[dict], list[dict], list[list]]:
    """The allocator trace and markers a merged log came from (merge_allocator_trace undone).

    Each entry's metadata is ``token`` + the count of markers before it, as the recorder
    sets it on the thread that allocates.
    """
    addrs = {b[0]: b[1] for b in log.baseline}
    sizes = {b[0]: b[2] for b in log.baseline}
    trace: list[dict] = []
    markers: list[list] = []
    live = dict(addrs)
    for record in log.records:
        meta = f"{token}{len(markers)}"
        if record[0] == "a":
            addrs[record[1]], sizes[record[1]] = record[2], record[3]
            live[record[1]] = record[2]
            trace.append({"action": "alloc", "addr": record[2], "size": record[3]})
        elif record[0] == "f":
            addr = live.pop(record[1])
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": sizes[record[1]]})
        else:
            markers.append(record)
            continue
        for entry in trace[-2 if record[0] == "f" else -1 :]:
            entry["user_metadata"] = meta
    active = [{"address": addrs[b], "size": sizes[b]} for b in live]
    return trace, active, markers


def _stale_autograd_thread(trace: list[dict], markers: list[list], stale: str) -> int:
    """What the H200 run showed: the autograd thread's first entries of each backward carry
    the metadata it kept from the previous session, until its first backward hook."""
    count = 0
    kinds = [None] + [m[0] + str(m[1]) for m in markers]
    for i, entry in enumerate(trace):
        n = int(entry["user_metadata"].rsplit(":", 1)[-1])
        ahead = kinds[n] if n < len(kinds) else None
        if ahead == "pbackward" and i and trace[i - 1]["user_metadata"] == entry["user_metadata"]:
            entry["user_metadata"] = stale  # the entries after the main thread's first
            count += 1
    return count


def _blocks(analysis: dict) -> list[dict]:
    return [m for m in analysis["modules"] if m["name"].startswith("blocks.") and m["depth"] == 2]


@pytest.mark.skipif(not PLAIN_LOG.exists(), reason="recorded by tests/gpu/test_attribution_gpu.py")
def test_h200_plain_run_blocks_hold_activations():
    # the plain 2-step GPT run of tests/gpu, recorded on an H200, first in its process
    log = EventLog.load(PLAIN_LOG)
    blocks = _blocks(analyze(log, depth=2))
    assert len(blocks) == 4
    assert all(m["activations_bytes"] > 0 for m in blocks)
    assert all(m["backward_temporaries_peak_bytes"] > 0 for m in blocks)


@pytest.mark.skipif(not PLAIN_LOG.exists(), reason="recorded by tests/gpu/test_attribution_gpu.py")
def test_metadata_left_on_the_autograd_thread_by_an_earlier_session_is_ignored():
    # the allocator's user metadata is per thread; the autograd thread keeps the last count
    # an earlier session's backward hooks set. Honoured, that count placed every marker up
    # to it before the first backward allocation: on the H200 the second plain run of a
    # process showed 0 activations for every block (test_checkpointing_recomputes_...)
    log = EventLog.load(PLAIN_LOG)
    expected = {m["name"]: m for m in analyze(log, depth=2)["modules"]}
    token = "vramscope:1.2.3:"
    segments = log.meta["segments"]

    def merged(stale: str, prefix: str) -> EventLog:
        trace, active, markers = _raw_trace(log, prefix)
        assert _stale_autograd_thread(trace, markers, stale) >= 2  # one per backward
        records, baseline, _, info = merge_allocator_trace(
            trace, active, markers, segment_spans=segments, metadata_prefix=prefix
        )
        again = EventLog(source=log.source, device=log.device, modules=log.modules)
        again.records, again.baseline, again.frames = records, baseline, log.frames
        again.censuses, again.meta = log.censuses, {**log.meta, "trace": info}
        return again

    markers = [r for r in log.records if r[0] not in "af"]
    last_backward = str(max(i for i, m in enumerate(markers) if m[0] == "b") + 1)
    # honoured (plain counts, as before the token), the stale count reproduces the failure
    broken = merged(last_backward, "")
    assert broken.meta["trace"]["foreign_metadata"] == 0
    assert all(m["activations_bytes"] == 0 for m in _blocks(analyze(broken, depth=2)))
    # an earlier session's token, an earlier version's plain count, or a count beyond the
    # markers recorded: not this session's, ignored
    for stale in (f"vramscope:9.9.9:{last_backward}", last_backward, f"{token}{10**6}"):
        again = merged(stale, token)
        assert again.meta["trace"]["foreign_metadata"] >= 2
        assert [r[:2] for r in again.records] == [r[:2] for r in log.records]
        rows = {m["name"]: m for m in analyze(again, depth=2)["modules"]}
        assert rows == expected
        assert all(rows[f"blocks.{i}"]["activations_bytes"] > 0 for i in range(4))


def _totals_at_markers(records: list[list], baseline: list[list]) -> list[int]:
    """Bytes allocated at each marker, in marker order."""
    sizes = {b[0]: b[2] for b in baseline}
    total = sum(sizes.values())
    out = []
    for record in records:
        if record[0] == "a":
            sizes[record[1]] = record[3]
            total += record[3]
        elif record[0] == "f":
            total -= sizes.pop(record[1], 0)
        elif record[0] != "g":  # a marker (not where the trace resumes)
            out.append(total)
    return out


@pytest.mark.skipif(not PLAIN_LOG.exists(), reason="recorded by tests/gpu/test_attribution_gpu.py")
def test_trace_recorded_in_windows_joins_into_the_marked_steps_exactly():
    # the H200 run's trace, as the recorder keeps it when step 1 has no markers: one window
    # up to step 1, nothing in step 1, one window from step 2 to the end
    log = EventLog.load(PLAIN_LOG)
    token = "vramscope:1.2.3:"
    trace, _, markers = _raw_trace(log, token)
    steps = [i for i, m in enumerate(markers) if m[0] == "s"]
    gap_start, gap_end = steps[1], steps[-1]  # markers [gap_start, gap_end) are step 1's

    def count(entry: dict) -> int:
        return int(entry["user_metadata"][len(token) :])

    def live_after(n_markers: int) -> list[dict]:
        """The blocks allocated when marker ``n_markers`` was about to be placed."""
        live, seen = {b[0]: (b[1], b[2]) for b in log.baseline}, 0
        for record in log.records:
            if record[0] not in "af":
                if seen == n_markers:
                    break
                seen += 1
            elif record[0] == "a":
                live[record[1]] = (record[2], record[3])
            else:
                live.pop(record[1], None)
        return [{"address": addr, "size": size} for addr, size in live.values()]

    windows = [
        {
            "first": 0,
            "last": gap_start,
            "trace": [e for e in trace if count(e) <= gap_start],
            "active": live_after(gap_start),
            "segments": log.meta["segments"],
        },
        {
            "first": gap_end,
            "last": None,
            "trace": [e for e in trace if count(e) > gap_end],
            "active": live_after(len(markers)),
            "segments": log.meta["segments"],
        },
    ]
    records, baseline, _, info = merge_trace_windows(windows, markers, metadata_prefix=token)
    assert info["windows"] == 2 and info["bridged"] > 0 and info["foreign_metadata"] == 0
    assert [r for r in records if r[0] not in "afg"] == markers  # every marker, in order
    assert sum(1 for r in records if r[0] == "g") == 1  # where the second window begins
    gap = records[records.index(markers[gap_start]) : records.index(markers[gap_end])]
    last_marker = max(i for i, r in enumerate(gap) if r[0] not in "af")
    assert gap[last_marker] == ["g"]  # the trace resumes after step 1's markers
    assert all(r[0] not in "af" for r in gap[:last_marker])  # nothing recorded in step 1,
    bridge = gap[last_marker + 1 :]  # then what changed in it, where step 2's window begins
    assert bridge and all(r[0] == "f" or r[4] == -1 for r in bridge)
    full = _totals_at_markers(log.records, log.baseline)
    joined = _totals_at_markers(records, baseline)
    recorded = [*range(gap_start + 1), *range(gap_end, len(markers))]
    assert [joined[i] for i in recorded] == [full[i] for i in recorded]
    # the analysis of the joined log: the blocks of step 2 hold their activations
    again = EventLog(source=log.source, device=log.device, modules=log.modules)
    again.records, again.baseline, again.censuses = records, baseline, log.censuses
    again.meta = {**log.meta, "trace": info}
    analysis = analyze(again, depth=2)
    assert analysis["peak"]["allocated_bytes"] == analyze(log, depth=2)["peak"]["allocated_bytes"]
    assert all(m["activations_bytes"] > 0 for m in _blocks(analysis))


def test_an_object_storage_where_an_activation_was_across_a_gap_is_another_block():
    """The trace of ``--detail modules`` runs in the marked steps only. An activation of a
    marked step lives past its window (a GAN's generator output, consumed by the next step);
    in the steps the trace does not record it is freed and a gradient of the same size takes
    its address, so the next window finds a block at that address and size, which a census
    there finds to be a gradient. That is another allocation: at the peak, in the marked
    step, the activation is still an activation (an H200 run of a DCGAN-like script counted
    2 MiB of it as gradients at the peak)."""
    mib, token = 1 << 20, "vramscope:gap:"
    param, act, temp = 1 << 32, (1 << 32) + 4 * mib, (1 << 32) + 8 * mib
    markers = [
        ["s", 0], ["p", "forward"], ["k", 0], ["p", "backward"], ["p", "optimizer"],
        ["s", 1], ["p", "forward"], ["p", "backward"], ["p", "optimizer"],  # not recorded
        ["s", 2], ["p", "optimizer"], ["k", 1],
    ]  # fmt: skip

    def entry(action: str, addr: int, size: int, count: int) -> dict:
        return {"action": action, "addr": addr, "size": size, "user_metadata": f"{token}{count}"}

    first = [
        entry("alloc", act, 2 * mib, 3),  # step 0's forward: an activation
        entry("alloc", temp, 4 * mib, 4),  # its backward: a temporary, the peak
        entry("free_requested", temp, 4 * mib, 4),
        entry("free_completed", temp, 4 * mib, 4),
    ]
    windows = [
        {"first": 0, "last": 5, "trace": first, "segments": [],
         "active": [{"address": param, "size": 4 * mib}, {"address": act, "size": 2 * mib}]},
        # steps 2 on: a gradient at the activation's address, of its size
        {"first": 9, "last": None, "trace": [], "segments": [],
         "active": [{"address": param, "size": 4 * mib}, {"address": act, "size": 2 * mib}]},
    ]  # fmt: skip
    records, baseline, _, info = merge_trace_windows(windows, markers, metadata_prefix=token)
    assert info["windows"] == 2 and info["bridged"] == 0  # the same address and size
    log = EventLog(source="cuda-trace", device="cuda:0", records=records, baseline=baseline)
    log.censuses = [
        [[param, "parameters", -1, "weight", [1024, 1024], "float32"]],
        [[act, "gradients", -1, "weight.grad", [512, 1024], "float32"]],
    ]
    log.meta = {"block_sizes": "allocator", "trace": info}
    analysis = analyze(log)
    assert analysis["peak"] == {
        "allocated_bytes": 10 * mib, "record": analysis["peak"]["record"], "step": 0,
        "phase": "backward",
    }  # fmt: skip
    categories = analysis["categories"]
    assert (categories["activations"], categories["gradients"]) == (2 * mib, 0)
    assert (categories["parameters"], categories["temporaries"]) == (4 * mib, 4 * mib)
    assert not [n for n in analysis["notes"] if "not found" in n]


def test_block_sizes_follow_the_caching_allocator():
    from vramscope.tracking.events import allocator_block_sizes

    mib = 1 << 20
    base = 1 << 32
    records = [
        ["a", 0, base, 4 * mib, -1, None, None],  # a 4 MiB block ...
        ["a", 1, base + 4 * mib, 8 * mib, -1, None, None],  # ... and its neighbour
        ["f", 0],
        ["a", 2, base, 3 * mib, -1, None, None],  # 3 MiB in the free 4 MiB: 1 MiB left, no split
        ["a", 3, base + 12 * mib, 2 * mib + 1, -1, None, None],  # segment tail: 20 - 12 - 2 > 1
        ["a", 4, base + 16 * mib, 100, -1, None, None],  # small pool: rounded to 512
    ]
    changed = allocator_block_sizes(records, [], [[base, 20 * mib]])
    assert [r[3] for r in records if r[0] == "a"] == [
        4 * mib,
        8 * mib,
        4 * mib,
        2 * mib + 512,
        512,
    ]
    assert changed == 1


def teardown_module() -> None:
    gc.collect()


def test_modules_deeper_than_depth_place_no_markers_and_count_to_their_ancestor():
    """``--detail modules --depth 2``: the blocks' layers run no markers (cheaper), their
    memory counts to the block, and the categories still sum to the peak."""
    torch.manual_seed(0)
    with vramscope.track(detail="modules", device="cpu", depth=2) as session:
        train(TinyLM())
    report = session.report()
    rows = rows_by_name(report)
    assert "blocks.0" in rows and "blocks.0.fc1" not in rows
    assert report.categories_at_peak.total() == pytest.approx(
        report.extra["attribution"]["peak_bytes"], rel=0.01
    )
    deep = tracked(TinyLM()).report()  # the default depth, 3: the layers are there
    full = rows_by_name(deep)
    assert "blocks.0.fc1" in full
    assert rows["blocks.0"]["activations_bytes"] == full["blocks.0"]["activations_bytes"]


def test_a_second_model_of_a_class_the_first_holds_is_found_with_its_weights():
    """A bare nn.Linear head beside an encoder holding Linears: the head's class is wrapped
    for the encoder's markers before the head is called, and discovery still finds it (its
    weights were counted outside every module)."""
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(32, 16), nn.ReLU())
    dec = nn.Linear(16, 32)
    opt = torch.optim.SGD([*enc.parameters(), *dec.parameters()], lr=1e-3)
    with vramscope.track(detail="modules", device="cpu") as session:
        for _ in range(4):
            x = torch.randn(8, 32)
            loss = nn.functional.mse_loss(dec(enc(x)), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    rows = session.report().modules
    dec_bytes = sum(p.numel() * F32 for p in dec.parameters())
    roots = [m for m in rows if m["depth"] == 0 and m["class"]]  # (not "outside modules")
    assert sorted(m["class"] for m in roots) == ["Linear", "Sequential"]
    assert next(m for m in roots if m["class"] == "Linear")["parameters_bytes"] == dec_bytes


def test_a_model_trained_on_another_thread_keeps_the_objects_exact_categories():
    """The CPU's operators are recorded on the thread tracking started in; a training loop
    in a ``threading.Thread`` makes its gradients and optimizer state elsewhere: the
    categories are then the objects' (exact), not a split that lost them."""
    import threading

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters())

    def work() -> None:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(8, 16)).pow(2).mean().backward()
            opt.step()

    with vramscope.track(detail="modules", device="cpu") as session:
        session.watch(model, opt)
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    report = session.report()
    weights = sum(p.numel() * F32 for p in model.parameters())
    cats = report.categories_at_peak
    assert (cats.parameters, cats.gradients) == (weights, weights)
    assert cats.optimizer_state == 2 * weights + 4 * F32  # two moments, a step count each
    assert cats.activations is None and "a thread other than" in report.categories_note


TWO_MODELS_SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
enc = nn.Sequential(nn.Linear(32, 16, bias=False), nn.ReLU())  # (the smaller, in blocks too)
heads = [nn.Linear(16, 32)]
opt = torch.optim.SGD([*enc.parameters(), *heads[0].parameters()], lr=1e-3)
for _ in range(3):
    x = torch.randn(8, 32)
    loss = nn.functional.mse_loss(heads[0](enc(x)), x)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def two_models_rows(tmp_path, prelude: str = "") -> list[dict]:
    """TWO_MODELS_SCRIPT (after ``prelude``) under ``vramscope run --detail modules``: its
    module rows."""
    import json
    import subprocess
    import sys

    (tmp_path / "two.py").write_text(prelude + TWO_MODELS_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "-q", "--detail", "modules", "--json",
         "r.json", "two.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / "r.json").read_text())["modules"]


def assert_named_as_the_script_calls_them(rows: list[dict]) -> None:
    roots = {m["class"]: m for m in rows if m["depth"] == 0 and m["class"]}
    assert roots["Linear"]["label"] == "heads[0]"  # the main model: the most parameters
    assert {m["name"] for m in rows if m["name"].startswith("enc")} == {"enc", "enc.0", "enc.1"}


def test_each_model_is_named_as_the_script_calls_it(tmp_path):
    """A script's models by their names in it (``heads[0]``, the main model's label;
    ``enc``, the other's rows), found where each is first called, its class otherwise."""
    assert_named_as_the_script_calls_them(two_models_rows(tmp_path))
