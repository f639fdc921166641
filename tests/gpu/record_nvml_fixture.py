"""Record what ``vramscope.devices`` reads on a real GPU into tests/data/nvml_h200.json.

Run on the GPU machine, from the repository root:

    python tests/gpu/record_nvml_fixture.py --out tests/data/nvml_h200.json

It starts a child process that allocates device memory step by step while publishing a
tracked-run status (as ``vramscope run`` does), takes one reading of the whole device view
after each step, and runs the CUDA-context probe with the last one. The file holds
``{"recording": {...}, "readings": [SystemInfo.to_dict(), ...]}``; CPU tests render it.

Host name, user names and the command lines of processes other than the child are replaced
by neutral values unless ``--keep-identities`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import vramscope.devices as vd
from vramscope.sources import nvml

CHILD = textwrap.dedent(
    """
    import sys, time, torch
    from vramscope.tracking.status import StatusWriter

    index = int(sys.argv[1])
    steps = int(sys.argv[2])
    device = torch.device("cuda", index)
    writer = StatusWriter({"name": "record_nvml_fixture", "workload": "fixture:alloc",
                           "device": index}, min_interval=0.0)
    blocks = []
    for step in range(steps):
        blocks.append(torch.empty(1 << 30, dtype=torch.uint8, device=device))  # 1 GiB
        torch.cuda.synchronize(device)
        writer.update(phase="forward", step=step, epoch=0,
                      allocated_bytes=torch.cuda.memory_allocated(device),
                      reserved_bytes=torch.cuda.memory_reserved(device),
                      peak_allocated_bytes=torch.cuda.max_memory_allocated(device))
        print("step", step, flush=True)
        sys.stdin.readline()  # the recorder reads, then lets us take the next step
    writer.close()
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/nvml_h200.json"))
    parser.add_argument("--device", type=int, default=0, help="NVML index of the GPU")
    parser.add_argument("--steps", type=int, default=3, help="GiB the child allocates, 1 a step")
    parser.add_argument("--keep-identities", action="store_true")
    args = parser.parse_args()

    reason = nvml.unavailable_reason()
    if reason is not None:
        sys.exit(f"record_nvml_fixture: {reason}")
    gpu = nvml.device(args.device)
    if gpu is None:
        sys.exit(f"record_nvml_fixture: no GPU {args.device}")

    env = dict(os.environ)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch's index = NVML's index
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(args.device), str(args.steps)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    readings = []
    try:
        for step in range(args.steps):
            line = child.stdout.readline()
            if not line.startswith("step"):
                sys.exit(f"record_nvml_fixture: the child failed at step {step}")
            time.sleep(0.3)  # let utilization and power catch up
            last = step == args.steps - 1
            info = vd.system_info(index=args.device, probe=last)
            readings.append(info.to_dict())
            child.stdin.write("\n")
            child.stdin.flush()
    finally:
        child.stdin.close()
        child.wait(timeout=60)

    for reading in readings:
        _label_child(reading, child.pid)
        if not args.keep_identities:
            _anonymize(reading, child.pid)
    versions = readings[-1]["versions"]
    recording = {
        "placeholder": False,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "recorder": "tests/gpu/record_nvml_fixture.py",
        "gpu": readings[-1]["devices"][0]["name"],
        "driver": versions.get("driver"),
        "torch": versions.get("torch"),
        "nvidia_ml_py": versions.get("nvidia_ml_py"),
        "child_pid": child.pid,
        "child_allocated_bytes_per_reading": [(i + 1) << 30 for i in range(args.steps)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"recording": recording, "readings": readings}, indent=1))
    print(f"wrote {args.out}: {len(readings)} readings of {recording['gpu']}")


def _label_child(reading: dict, child_pid: int) -> None:
    """The child's command line is this file's whole CHILD program: name it instead."""
    for device in reading["devices"]:
        for proc in device["processes"]:
            if proc["pid"] == child_pid:
                proc["command"] = "python -c CHILD (record_nvml_fixture.py: 1 GiB a step)"


def _anonymize(reading: dict, child_pid: int) -> None:
    reading["hostname"] = "gpu-host"
    for device in reading["devices"]:
        for proc in device["processes"]:
            if proc.get("user"):
                proc["user"] = "user"
            if proc["pid"] != child_pid and proc.get("command"):
                proc["command"] = "[another process]"
    for status in reading.get("tracked", []):
        if status.get("pid") != child_pid:
            status["name"] = status["workload"] = "another run"


if __name__ == "__main__":
    main()
