"""``info``/``watch`` and ``vramscope.devices`` on a real GPU: NVML against torch, per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import vramscope.devices as vd  # noqa: E402
from vramscope.cli.main import main  # noqa: E402
from vramscope.sources import nvml  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GiB = 1 << 30

HOLDER = textwrap.dedent(
    """
    import os, sys, torch
    from vramscope.tracking.status import StatusWriter

    index = int(sys.argv[1])
    device = torch.device("cuda", index)
    block = torch.empty(1 << 30, dtype=torch.uint8, device=device)  # 1 GiB
    torch.cuda.synchronize(device)
    writer = StatusWriter({"name": "holder", "device": index}, min_interval=0.0)
    writer.update(phase="forward", step=3, epoch=1,
                  allocated_bytes=torch.cuda.memory_allocated(device),
                  reserved_bytes=torch.cuda.memory_reserved(device))
    print(torch.cuda.memory_reserved(device), flush=True)
    sys.stdin.readline()
    writer.close()
    """
)


def nvml_index_of_torch_device_0() -> int:
    """NVML's index of the GPU torch calls cuda:0 (they differ under CUDA_VISIBLE_DEVICES)."""
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    gpu = nvml.device_by_uuid(uuid)
    assert gpu is not None, f"NVML does not know torch's cuda:0 ({uuid})"
    return gpu.index


@pytest.fixture
def status_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(tmp_path / "status"))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "status"


@pytest.fixture
def holder(status_dir: Path) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A child process holding 1 GiB on the GPU, tracked; yields (process, index, reserved)."""
    index = nvml_index_of_torch_device_0()
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    env.pop("CUDA_VISIBLE_DEVICES", None)  # so the child's cuda:<index> is NVML's <index>
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(index)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    reserved = int(child.stdout.readline())
    time.sleep(0.2)
    yield child, index, reserved
    child.communicate("\n", timeout=60)


def test_devices_agree_with_torch_on_total_memory() -> None:
    index = nvml_index_of_torch_device_0()
    gpu = vd.device(index)
    _free, total = torch.cuda.mem_get_info(0)
    assert gpu.total_bytes is not None and gpu.used_bytes is not None
    # NVML's v2 total is the whole memory; CUDA's total excludes nothing more than the reserve
    assert gpu.total_bytes == pytest.approx(total, rel=0.02)
    parts = gpu.used_bytes + (gpu.free_bytes or 0) + (gpu.reserved_bytes or 0)
    assert parts == pytest.approx(gpu.total_bytes, rel=0.001)  # v2: used + free + reserve
    assert gpu.name and gpu.uuid and gpu.uuid.startswith(("GPU-", "MIG-"))
    assert gpu.memory_info_version in (1, 2)


def test_every_gpu_is_listed() -> None:
    listed = vd.devices()
    assert [g.index for g in listed] == list(range(nvml.device_count()))
    assert all(g.total_bytes for g in listed)


def test_a_process_holding_1_gib_is_listed_with_its_memory_and_status(holder) -> None:
    child, index, reserved = holder
    info = vd.system_info(index=index, include_torch=False)
    rows = [p for p in info.devices[0].processes if p.pid == child.pid]
    if not rows:
        pytest.skip("NVML lists PIDs from another PID namespace here (a container)")
    row = rows[0]
    if row.device_memory_bytes is None:
        pytest.skip(f"per-process memory not available: {info.devices[0].not_available}")
    # what nvidia-smi shows = torch reserved + context and libraries (hundreds of MiB)
    assert reserved <= row.device_memory_bytes <= reserved + 2 * GiB
    assert row.user and "python" in (row.command or "")
    assert row.tracked is not None
    assert (row.tracked["phase"], row.tracked["step"]) == ("forward", 3)


def test_probe_measures_the_context_in_a_child() -> None:
    index = nvml_index_of_torch_device_0()
    probe = vd.probe_context(index)
    assert probe.available, probe.reason
    assert len(probe.stages) == 4 and probe.stages[0].name == "before CUDA"
    context = probe.stages[2]
    # the first tensor's segment: 2 MiB with the default allocator settings
    assert context.reserved_bytes is not None and 0 < context.reserved_bytes <= 64 << 20
    assert probe.context_bytes is not None and 32 << 20 <= probe.context_bytes <= 4 * GiB
    assert probe.libraries_bytes is not None and probe.libraries_bytes >= 0


def test_info_json_on_a_gpu(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["info", "--json", "-"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    data = json.loads(out)
    assert data["nvml_unavailable_reason"] is None
    assert data["versions"]["driver"] and data["versions"]["cuda_driver"]
    assert len(data["devices"]) == nvml.device_count()


def test_watch_once_shows_the_held_memory_and_the_tracked_step(holder, capsys) -> None:
    child, index, _reserved = holder
    with pytest.raises(SystemExit) as done:
        main(["watch", "--once", "--device", str(index)])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    assert f"GPU {index}" in out
    row = next((line for line in out.splitlines() if str(child.pid) in line), "")
    assert "forward" in row and " 3 " in row
