"""On one GPU: two ranks of a torchrun job share cuda:0 over gloo (DDP and FSDP2 on a small
GPT); each rank's row holds its own exact peaks, those its own max_memory_allocated() and
max_memory_reserved() report, and the distributed memory is named where it sits.

Run with: python -m pytest -q -m gpu tests/gpu/test_distributed_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope import schema
from vramscope.report.model import Report
from vramscope.units import round_up

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "gpt_ranks.py"
MIB = 2**20
HEAVY_MIB = 256


def run_job(tmp_path: Path, strategy: str) -> tuple[Report, dict[int, dict]]:
    """Two ranks on cuda:0, rank 1 holding 256 MiB more; the report and each rank's own peaks.
    One GPU visible: with more, a rank measures cuda:LOCAL_RANK unless its script moved it
    off device 0, and these ranks share device 0 on purpose."""
    args = [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "vramscope",
        "run",
        "-q",
        "--json",
        "job.json",
        str(SCRIPT),
        "--strategy",
        strategy,
        "--device",
        "cuda",
        "--heavy-rank",
        "1",
        "--heavy-mib",
        str(HEAVY_MIB),
        "--own-peaks",
        str(tmp_path),
    ]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=visible)
    proc = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((tmp_path / "job.json").read_text())
    assert schema.errors(data) == []
    own = {r: json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)}
    return Report.from_dict(data), own


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def job(request, tmp_path_factory) -> tuple[str, Report, dict[int, dict]]:
    strategy = request.param
    return (strategy, *run_job(tmp_path_factory.mktemp(strategy), strategy))


def test_each_ranks_peaks_are_its_own_allocator_peaks(job):
    _, report, own = job
    assert [r.rank for r in report.ranks] == [0, 1]
    for row in report.ranks:
        assert row.reported and row.exit.status == "ok"
        assert row.device["type"] == "cuda" and row.device["index"] == 0
        assert row.peak.allocated_bytes == own[row.rank]["max_memory_allocated"]
        assert row.peak.reserved_bytes == own[row.rank]["max_memory_reserved"]
        assert row.categories_at_peak.parameters == own[row.rank]["parameter_block_bytes"]
        assert row.categories_at_peak.total() == row.peak.allocated_bytes
    heavier = report.ranks[1].peak.allocated_bytes - report.ranks[0].peak.allocated_bytes
    assert heavier >= HEAVY_MIB * MIB * 0.95
    job = report.extra["distributed"]
    assert job["heaviest_rank"] == 1 and job["imbalance"]["by"] == "peak_allocated_bytes"
    assert report.peak.allocated_bytes == own[1]["max_memory_allocated"]
    assert job["gather"]["seconds"] < 1.0


def test_ddp_buckets_are_exact_and_sit_in_other(job):
    strategy, report, own = job
    if strategy != "ddp":
        pytest.skip("a DDP job")
    for row in report.ranks:
        (buckets,) = [m for m in row.memory if m["name"] == "ddp_gradient_buckets"]
        assert sum(buckets["bucket_sizes"]) == own[row.rank]["parameter_bytes"]
        assert buckets["bytes"] == sum(round_up(s, 512) for s in buckets["bucket_sizes"])
        assert buckets["category"] == "other"
        assert row.categories_at_peak.other >= buckets["bytes"]  # made with DDP, kept


def test_fsdp_groups_are_sized_from_their_shards(job):
    strategy, report, own = job
    if strategy != "fsdp":
        pytest.skip("an FSDP2 job")
    for row in report.ranks:
        items = {m["name"]: m for m in row.memory}
        gathered = items["fsdp_unsharded_parameters"]
        assert gathered["groups"] == 5  # four blocks and the root
        # every group all-gathered: twice this rank's shard (two ranks), padding included
        assert gathered["total_bytes"] == pytest.approx(
            2 * own[row.rank]["parameter_bytes"], rel=0.01
        )
        assert gathered["bytes"] < gathered["total_bytes"]
        reduce = items["fsdp_reduce_scatter_buffers"]
        assert reduce["total_bytes"] == pytest.approx(gathered["total_bytes"], rel=0.01)
        assert row.categories_at_peak.parameters <= own[row.rank]["parameter_bytes"] * 1.01
