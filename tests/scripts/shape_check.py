"""Check one script of benchmarks/scripts on the CPU, in this process: the oracle's two passes
(benchmarks/peak_oracle.py, which shares no code with vramscope), then ``vramscope run`` with
the given detail; prints the comparison as JSON (one process: torch is imported once)."""

import faulthandler
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peak_oracle  # noqa: E402

# a run that hangs prints where every thread stood and ends, well before the test's timeout
faulthandler.dump_traceback_later(300, exit=True)
name, details = sys.argv[1], sys.argv[2].split(",")
script, extra = peak_oracle.SCRIPTS[name]
path = str(peak_oracle.SCRIPTS_DIR / script)
args = [*extra, "--small", *(["--backend", "aot_eager"] if name == "compiled" else [])]
argv = list(sys.argv)
steps = peak_oracle.Probe(False, None).run(path, args)
instant = peak_oracle.Probe(True, steps["run_peak"]).run(path, args)
sys.argv = argv

from vramscope.tracking.runner import run_script  # noqa: E402
from vramscope.tracking.session import Session  # noqa: E402

results = {"oracle": {"steps": steps, "instant": instant}, "runs": {}}
for detail in details:
    report, code = run_script(path, args, Session(detail=detail, device="cpu", status=False))
    data = report.to_dict()
    results["runs"][detail] = {
        "code": code,
        "compare": peak_oracle.compare({"steps": steps, "instant": instant}, data),
        "report": {k: data[k] for k in ("categories_at_peak", "peak", "steps", "exit")},
        "modules": data.get("modules") or [],
    }
print("RESULT " + json.dumps(results))
