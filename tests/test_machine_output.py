"""For machines: ``--json -`` puts the JSON alone on stdout (text for people on stderr) and
``--quiet`` prints nothing but errors, while every file asked for is still written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli import vramscope

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SCRIPT = ROOT / "tests" / "scripts" / "train_loop.py"
TINY = (
    "import torch, vramscope\n"
    "def build(batch_size, device):\n"
    "    m = torch.nn.Linear(64, 64).to(device)\n"
    "    return vramscope.Workload(model=m, optimizer=torch.optim.SGD(m.parameters()),\n"
    "        batch=lambda: (torch.randn(batch_size, 64, device=device),),\n"
    "        loss=lambda m, x: m(x).sum())\n"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wl") / "tiny.py"
    path.write_text(TINY)
    return f"{path}:build"


def test_run_json_dash_is_the_report_alone_and_the_scripts_output_goes_to_stderr():
    proc = vramscope("run", "--json", "-", str(SCRIPT), "--epochs", "1")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # nothing else on stdout
    assert report["schema"] == "vramscope.report/1" and len(report["steps"]) == 4
    assert "epoch 0 loss" in proc.stderr  # the script's own print
    assert "What the peak is made of" in proc.stderr  # the report, for people
    assert "wrote" not in proc.stderr


def test_run_quiet_prints_no_report_and_still_writes_files(tmp_path):
    proc = vramscope(
        "run",
        "-q",
        "--json",
        "r.json",
        "--csv",
        "s.csv",
        str(SCRIPT),
        "--epochs",
        "1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["epoch 0 loss 2.310242"]  # the script's, only
    assert proc.stderr == ""
    assert json.loads((tmp_path / "r.json").read_text())["steps"]
    assert (tmp_path / "s.csv").read_text().count("\n") == 5


def test_quiet_still_shows_errors_as_one_line(tmp_path):
    proc = vramscope("report", "-q", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("vramscope: error: no such report file")


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(DATA / "report_h200_gpt.json")],
        [
            "report",
            str(DATA / "report_h200_gpt.json"),
            "--diff",
            str(DATA / "report_h200_leak.json"),
        ],
    ],
    ids=["report", "diff"],
)
def test_report_json_dash_and_quiet(args, tmp_path):
    proc = vramscope(*args, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] in ("vramscope.report/1", "vramscope.diff/1")
    assert "Peak" in proc.stderr
    quiet = vramscope(*args, "-q", "--json", str(tmp_path / "out.json"))
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    assert json.loads((tmp_path / "out.json").read_text()) == data


def test_estimate_json_dash_puts_the_verdict_on_stderr(tiny):
    proc = vramscope("estimate", tiny, "-b", "4", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"]["fits"] is True
    assert "vramscope: fits on NVIDIA H200" in proc.stderr
    quiet = vramscope("estimate", tiny, "-b", "4", "-q")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_fit_and_compare_json_dash(tiny):
    fit = vramscope("fit", tiny, "--gpu", "h200", "--max-batch-size", "16", "--json", "-")
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)["fit"]["max_batch_size"] == 16
    assert "Largest batch size: at least 16 (the search's cap" in fit.stderr
    compare = vramscope("compare", tiny, "-b", "4", "--strategies", "sgd", "-q", "--json", "-")
    assert compare.returncode == 0, compare.stderr
    rows = json.loads(compare.stdout)["fit"]["strategies"]
    assert [r["name"] for r in rows] == ["baseline", "sgd"]
    assert compare.stderr == ""  # quiet: not even the progress lines


def test_measure_and_demo_json_dash(tiny, tmp_path):
    measure = vramscope("measure", tiny, "-b", "2", "--steps", "2", "--json", "-")
    assert measure.returncode == 0, measure.stderr
    assert len(json.loads(measure.stdout)["steps"]) == 2
    # one example for one GPU: the GPT's search for the largest batch is the shortest
    demo = vramscope(
        *("demo", "--example", "gpt", "--gpu", "rtx4090", "--steps", "1", "--json", "-"),
        cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stderr
    data = json.loads(demo.stdout)
    assert data["workload"]["spec"] == "example:gpt" and list(data["estimates"]) == ["rtx4090"]
    assert list(tmp_path.iterdir()) == []  # no vramscope-demo.json, no file named '-'


def test_info_quiet_writes_its_json_and_prints_nothing(tmp_path):
    proc = vramscope("info", "-q", "--json", str(tmp_path / "i.json"))
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    assert "host" in json.loads((tmp_path / "i.json").read_text())
