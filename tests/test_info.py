"""``vramscope info`` and the ``vramscope.devices`` API: this machine, and a recorded H200."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

import vramscope.devices as vd
from vramscope.cli.info import render_info, render_text
from vramscope.cli.main import main
from vramscope.devices import SystemInfo, allocator_config
from vramscope.sources import nvml
from vramscope.units import format_bytes

FIXTURE = Path(__file__).parent / "data" / "nvml_h200.json"
NO_DRIVER = nvml.unavailable_reason() is not None
needs_no_driver = pytest.mark.skipif(not NO_DRIVER, reason="this machine has an NVIDIA driver")


@pytest.fixture(autouse=True)
def own_status_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs tracked elsewhere on this machine must not show up in these tests."""
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(tmp_path / "status"))
    monkeypatch.setenv("COLUMNS", "200")  # one line per line, so assertions can find them


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


# --------------------------------------------------------------------------- this machine


@needs_no_driver
def test_info_without_a_driver_says_so_shows_host_memory_and_exits_0(capsys) -> None:
    code, out, err = run_cli(["info"], capsys)
    assert code == 0, err
    assert "No NVIDIA GPU to show" in out
    assert "no NVIDIA driver here" in out
    assert "Host memory" in out
    assert format_bytes(psutil.virtual_memory().total) in out


def test_info_json_to_stdout_is_only_json(capsys) -> None:
    code, out, err = run_cli(["info", "--json", "-"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "vramscope.devices/1"
    assert data["host"]["total_bytes"] == psutil.virtual_memory().total
    assert data["versions"]["nvidia_ml_py"] == nvml.binding_version()
    assert len(data["devices"]) == nvml.device_count()
    if NO_DRIVER:
        assert "NVML" in data["nvml_unavailable_reason"]


def test_info_json_file_loads_back_into_the_same_view(tmp_path: Path, capsys) -> None:
    target = tmp_path / "info.json"
    code, out, err = run_cli(["info", "--json", str(target)], capsys)
    assert code == 0, err
    assert "Host memory" in out
    assert f"wrote {target}" in err
    info = SystemInfo.load(target)
    assert info.host.total_bytes == psutil.virtual_memory().total
    assert info.to_dict() == json.loads(target.read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["info", "--device", "7"], "there is no GPU 7"),
        (["info", "--json", "/no/such/folder/info.json"], "folder /no/such/folder does not exist"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(args, message, capsys) -> None:
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("vramscope: error: ")
    assert message in err


def test_probe_without_cuda_says_why_and_exits_0(capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; tests/gpu/ covers the probe")
    code, out, err = run_cli(["info", "--probe", "--json", "-"], capsys)
    assert code == 0, err
    probe = json.loads(out)["probe"]
    assert probe["available"] is False
    if torch.version.cuda is None:
        assert "CPU-only build" in probe["reason"]
    assert probe["torch_version"] == torch.__version__


def test_info_does_not_import_torch_to_start() -> None:
    code = "import sys, vramscope.cli.info, vramscope.cli.watch; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_host_memory_is_what_the_kernel_reports() -> None:
    host = vd.host()
    vm = psutil.virtual_memory()
    assert host.total_bytes == vm.total
    assert 0 < host.available_bytes <= host.total_bytes
    assert 0.0 <= host.used_fraction <= 1.0


@needs_no_driver
def test_device_api_without_a_driver_is_empty_and_explains() -> None:
    import vramscope

    assert vramscope.devices() == []  # the module is callable: vramscope.devices()
    assert vd.devices() == []
    assert vd.device_count() == 0
    with pytest.raises(vramscope.errors.VramscopeError, match="no NVIDIA driver here"):
        vd.device(0)
    info = vd.system_info(include_torch=False)
    assert info.devices == []
    assert "NVML" in (info.nvml_unavailable_reason or "")


# --------------------------------------------------------------------------- recorded H200


def test_recorded_reading_round_trips_through_json() -> None:
    for reading in recorded()["readings"]:
        assert SystemInfo.from_dict(reading).to_dict() == reading


def test_recorded_h200_renders_memory_sensors_and_processes() -> None:
    reading = recorded()["readings"][-1]
    gpu = reading["devices"][0]
    text = render_text(render_info(SystemInfo.from_dict(reading)), width=140)
    assert f"GPU {gpu['index']} · {gpu['name']}" in text
    used, total = gpu["used_bytes"], gpu["total_bytes"]
    assert f"{format_bytes(used)} used of {format_bytes(total)}" in text
    assert f"({100 * used / total:.0f}%)" in text
    assert f"{format_bytes(gpu['free_bytes'])} free" in text
    if gpu["reserved_bytes"]:
        assert f"{format_bytes(gpu['reserved_bytes'])} reserved by the driver" in text
    assert f"temperature {gpu['temperature_c']} °C" in text
    assert f"power {gpu['power_draw_watts']:.0f} W of {gpu['power_limit_watts']:.0f} W" in text
    assert f"utilization GPU {gpu['utilization_gpu_percent']}%" in text
    for proc in gpu["processes"]:
        row = next(line for line in text.splitlines() if line.strip().startswith(str(proc["pid"])))
        assert format_bytes(proc["device_memory_bytes"]) in row
    assert f"driver {reading['versions']['driver']}" in text


def test_recorded_tracked_process_shows_phase_step_and_memory_split() -> None:
    reading = recorded()["readings"][-1]
    tracked = [p for p in reading["devices"][0]["processes"] if p.get("tracked")]
    if not tracked:
        pytest.skip("the recording's tracked child was not matched to an NVML process")
    proc = tracked[0]
    status = proc["tracked"]
    text = render_text(render_info(SystemInfo.from_dict(reading)), width=160)
    row = next(line for line in text.splitlines() if line.strip().startswith(str(proc["pid"])))
    assert status["phase"] in row
    split = f"{format_bytes(status['allocated_bytes'])} / {format_bytes(status['reserved_bytes'])}"
    assert split in row


def test_recorded_probe_shows_context_and_library_cost() -> None:
    reading = recorded()["readings"][-1]
    probe = reading["probe"]
    assert probe is not None and probe["available"]
    before, _init, context, matmul = probe["stages"]

    def used(stage: dict[str, Any]) -> int:
        if probe["method"] == "process":
            return stage["process_used_bytes"]
        return stage["device_used_bytes"] - before["device_used_bytes"]  # in a container

    # the reported costs are what the stages say: device memory outside the allocator
    assert probe["context_bytes"] == used(context) - context["reserved_bytes"]
    outside_after_matmul = used(matmul) - matmul["reserved_bytes"]
    assert probe["libraries_bytes"] == outside_after_matmul - probe["context_bytes"]
    text = render_text(render_info(SystemInfo.from_dict(reading)), width=140)
    assert f"CUDA context: {format_bytes(probe['context_bytes'])}" in text
    assert f"first matmul: {format_bytes(probe['libraries_bytes'])}" in text


def test_recorded_memory_grows_with_what_the_child_allocated() -> None:
    data = recorded()
    child = data["recording"]["child_pid"]
    steps = data["recording"]["child_allocated_bytes_per_reading"]
    used = []
    for reading in data["readings"]:
        rows = [p for p in reading["devices"][0]["processes"] if p["pid"] == child]
        if not rows or rows[0]["device_memory_bytes"] is None:
            pytest.skip("per-process memory of the child was not available when recorded")
        used.append(rows[0]["device_memory_bytes"])
    growth = [b - a for a, b in itertools.pairwise(used)]
    expected = [b - a for a, b in itertools.pairwise(steps)]
    for grew, allocated in zip(growth, expected, strict=True):
        assert grew == pytest.approx(allocated, rel=0.05)


def test_a_reading_from_another_tool_is_refused() -> None:
    with pytest.raises(vd.VramscopeError, match="not a vramscope device view"):
        SystemInfo.from_dict({"schema": "vramscope.report/1"})


# --------------------------------------------------------------------------- allocator


def test_new_torch_reads_pytorch_alloc_conf_first() -> None:
    env = {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
        "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
    }
    config = allocator_config(env, torch_version="2.13.0+cpu")
    assert config.variable == "PYTORCH_ALLOC_CONF"
    assert config.options == {"expandable_segments": "True", "max_split_size_mb": "128"}
    assert config.ignored == {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    assert any("ignored" in note for note in config.notes)


def test_new_torch_falls_back_to_the_deprecated_name() -> None:
    config = allocator_config(
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, torch_version="2.9.0"
    )
    assert config.variable == "PYTORCH_CUDA_ALLOC_CONF"
    assert any("deprecated" in note for note in config.notes)


def test_old_torch_reads_only_pytorch_cuda_alloc_conf() -> None:
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": ""}
    config = allocator_config(env, torch_version="2.4.1")
    assert config.variable == "PYTORCH_CUDA_ALLOC_CONF"  # set but empty: it still wins
    assert config.options == {}
    assert config.ignored == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}


def test_allocator_not_set_and_misspelled_options() -> None:
    assert allocator_config({}, torch_version="2.13.0").variable is None
    config = allocator_config({"PYTORCH_ALLOC_CONF": "expandable_segment:True"}, "2.13.0")
    assert any("expandable_segment: not an option" in note for note in config.notes)


# --------------------------------------------------------------------------- NVML quirks


def test_a_driver_older_than_the_binding_is_explained() -> None:
    pynvml = nvml.pynvml
    missing = pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    assert "driver" in nvml.explain(missing) and "nvidia-ml-py" in nvml.explain(missing)
    mismatch = pynvml.NVMLLibraryMismatchError("Unversioned function called")
    assert nvml.explain(mismatch) == nvml.explain(missing)
    unsupported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert nvml.explain(unsupported) == "not supported on this device"


def test_a_function_missing_from_the_binding_falls_through() -> None:
    with pytest.raises(AttributeError):
        nvml._first(("nvmlNoSuchFunction", ()), ("nvmlAlsoMissing", ()))
