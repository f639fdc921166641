"""Record a small CUDA attribution event log on a GPU, for the CPU tests of the analysis.

Usage (on a CUDA machine): python tests/gpu/record_attribution_fixture.py OUTDIR
Writes to OUTDIR (flat, two files):
  attribution_h200_gpt.json.gz  the EventLog of two training steps of a small example:gpt,
                                with meta.max_memory_allocated and meta.parameter_bytes
  attribution_trace_info.json   what this torch's allocator trace carries (keys, join used)
Copy attribution_h200_gpt.json.gz to tests/data/ (keep it under 300 KB).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import vramscope
from vramscope.examples import build_gpt
from vramscope.workload import StepRunner


def main(outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    torch.manual_seed(0)
    w = build_gpt(4, device)
    runner = StepRunner(w, device)
    runner()  # optimizer state exists; the recorded steps are steady ones
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with vramscope.track(detail="modules") as session:
        for _ in range(2):
            runner()
            session.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    recorder = session._attribution
    log = recorder.event_log()
    log.meta["max_memory_allocated"] = peak
    log.meta["parameter_bytes"] = sum(
        -(-p.numel() * p.element_size() // 512) * 512 for p in w.model.parameters()
    )
    log.meta["gpu"] = torch.cuda.get_device_name()
    target = out / "attribution_h200_gpt.json.gz"
    log.save(target)
    raw = recorder.raw_snapshot() or {}
    traces = raw.get("device_traces") or [[]]
    trace = traces[torch.cuda.current_device()] if traces else []
    keys = sorted({k for e in trace[:2000] for k in e})
    info = {
        "torch": torch.__version__,
        "trace_entry_keys": keys,
        "entries": len(trace),
        "trace": log.meta.get("trace"),
        "has_set_memory_metadata": hasattr(torch._C, "_cuda_setMemoryMetadata"),
        "example_entry": {
            k: v for k, v in (trace[len(trace) // 2] if trace else {}).items() if k != "frames"
        },
        "fixture_bytes": target.stat().st_size,
        "max_memory_allocated": peak,
        "notes": log.notes,
    }
    (out / "attribution_trace_info.json").write_text(json.dumps(info, indent=1, default=str))
    print(json.dumps(info, indent=1, default=str))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
