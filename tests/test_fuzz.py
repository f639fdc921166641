"""The parsers, fuzzed: what a person types (sizes, percentages, workload specs) and what a
file holds (a saved report) either give a value or a VramscopeError of one line, never another
exception; and a report that loads also renders."""

from __future__ import annotations

import copy
import json
import math
import os
import string
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from vramscope.errors import VramscopeError
from vramscope.report.diff import diff_reports, render_terminal
from vramscope.report.model import Report
from vramscope.report.terminal import render
from vramscope.units import MAX_BYTES, format_bytes, parse_percent, parse_size

DATA = Path(__file__).parent / "data"
REAL_REPORTS = [*sorted(DATA.glob("report_*.json")), DATA / "fit_cpu_cnn_2g.json"]
# VRAMSCOPE_FUZZ_EXAMPLES=5000 for a longer hunt than the suite's
FUZZ = settings(
    max_examples=int(os.environ.get("VRAMSCOPE_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def one_line_error(fn: Any, *args: Any) -> Any:
    """Call ``fn``: a value, or None after a VramscopeError of one line."""
    try:
        return fn(*args)
    except VramscopeError as exc:
        message = str(exc)
        assert message and "\n" not in message and "\r" not in message, repr(message)
        return None


# ---- sizes and percentages ---------------------------------------------------------------------
UNITS = {"": 1, "B": 1, "K": 1024, "KiB": 1024, "KB": 1000, "M": 1024**2, "MiB": 1024**2,
         "MB": 1000**2, "G": 1024**3, "GiB": 1024**3, "GB": 1000**3, "T": 1024**4,
         "TiB": 1024**4, "TB": 1000**4}  # fmt: skip


@FUZZ
@given(st.text())
@example("9" * 400 + "GiB")
@example("1" * 5000)
@example("٣GiB")
@example("1e9GiB")
@example("nan")
def test_parse_size_of_any_text_is_bytes_or_one_line(text):
    value = one_line_error(parse_size, text)
    assert value is None or (isinstance(value, int) and 0 <= value < 2**64)


@FUZZ
@given(
    st.integers(0, 2**40),
    st.sampled_from(sorted(UNITS)),
    st.sampled_from(["", " ", "  "]),
    st.booleans(),
)
def test_parse_size_reads_every_unit_however_spaced_and_cased(n, unit, space, lower):
    assume(n * UNITS[unit] < MAX_BYTES)
    text = f" {n}{space}{unit.lower() if lower else unit} "
    assert parse_size(text) == n * UNITS[unit]


@FUZZ
@given(st.integers(0, 2**60))
def test_a_formatted_size_reads_back_within_its_rounding(n):
    back = parse_size(format_bytes(n))
    assert abs(back - n) <= max(n * 0.005, 1)


@FUZZ
@given(st.floats(0, 1e6, allow_nan=False), st.sampled_from(["GiB", "MiB", "TB", " GB"]))
def test_parse_size_reads_decimals(x, unit):
    text = f"{x:.3f}{unit}"
    assert parse_size(text) == round(Fraction(f"{x:.3f}") * UNITS[unit.strip()])  # exact


@FUZZ
@given(st.one_of(st.text(), st.integers(), st.floats()))
@example("nan%")
@example("inf")
@example("1e999")
@example(float("nan"))
def test_parse_percent_of_anything_is_a_finite_fraction_or_one_line(value):
    fraction = one_line_error(parse_percent, value)
    assert fraction is None or (isinstance(fraction, float) and math.isfinite(fraction))


@pytest.mark.parametrize(("text", "fraction"), [("5%", 0.05), ("5", 0.05), ("1", 0.01),
                                                ("0.05", 0.05), (" 12.5 % ", 0.125), (0.1, 0.1)])  # fmt: skip
def test_parse_percent_reads_what_people_write(text, fraction):
    assert parse_percent(text) == pytest.approx(fraction)


# ---- workload specs (parsing only: nothing is imported or built) -------------------------------
NAMES = st.text(string.ascii_letters + string.digits + "_-.", max_size=12)
SUFFIXES = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "ckpt",
                "seq=512",
                "seq=",
                "seq=x",
                "seq=-1",
                "size=96",
                "attn=eager",
                "",
                "=",
                "bogus",
                "seq=1e3",
            ]
        ),
        st.text(max_size=6),
    ),
    max_size=3,
)


@st.composite
def specs(draw: Any) -> str:
    prefix = draw(st.sampled_from(["example", "torchvision", "timm", "hf", "nope", ""]))
    name = draw(st.one_of(st.sampled_from(["cnn", "gpt", "gpt2", "resnet50", "vit_b_16"]), NAMES))
    optimizer = draw(st.sampled_from(["", "@sgd", "@sgdm", "@adam", "@infer", "@", "@lion"]))
    suffix = "".join("/" + s for s in draw(SUFFIXES))
    return f"{prefix}:{name}{optimizer}{suffix}"


@pytest.fixture(scope="module")
def empty_dir():
    """Specs are fuzzed from an empty folder, so no generated ``file.py:fn`` can exist."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(here)


@FUZZ
@given(st.one_of(specs(), st.text()))
@example("hf:gpt2/seq=abc")
@example("x\x00.py:build")
@example("hf:gpt2/seq=0")
@example("torchvision:resnet50/flux")
def test_a_workload_spec_resolves_or_says_why_in_one_line(empty_dir, text):
    from vramscope.workload import resolve

    spec = one_line_error(resolve, text)
    if spec is not None:
        assert callable(spec.builder) and spec.spec == text.strip()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("hf:gpt2/seq=abc", "seq"),
        ("hf:gpt2/seq=0", "seq"),
        ("torchvision:resnet50/size=-3", "size"),
        ("timm:vit_base_patch16_224/flux", "flux"),
        ("hf:gpt2@lion", "unknown optimizer 'lion'"),
        ("hf:no model", "unknown hf model .no model."),
        ("example:cnn@sgd", "no built-in example"),
    ],
)
def test_bad_spec_options_are_refused_before_any_model_is_built(empty_dir, text, needle):
    from vramscope.workload import resolve

    with pytest.raises(VramscopeError, match=needle):
        resolve(text)


# ---- saved reports -----------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def load_text(text: str) -> Report | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.json"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        return one_line_error(Report.load, path)


def render_text(report: Report, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    console.print(render(report))
    console.print(render_terminal(diff_reports(report, report)))
    return console.export_text()


def real(path: Path) -> dict:
    return json.loads(path.read_text())


@FUZZ
@given(JSON)
def test_any_json_is_a_report_or_one_line(value):
    report = load_text(json.dumps(value))
    if report is not None:
        render_text(report)


@FUZZ
@given(st.sampled_from(REAL_REPORTS), st.floats(0, 1))
def test_a_truncated_report_is_one_line(path, where):
    text = path.read_text()
    cut = int(len(text.rstrip()) * where)
    assume(cut < len(text.rstrip()))
    assert load_text(text[:cut]) is None


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            out += _paths(item, (*prefix, i))
    return out


@pytest.fixture(scope="module")
def real_data() -> dict[str, dict]:
    """Saved reports (an H200 run, a leaking run, a fit) and a fresh CPU run with the module
    tree, the tensors of the peak and line tables: the free-form sections too."""
    import vramscope

    data = {p.name: real(p) for p in REAL_REPORTS}
    run = vramscope.measure("example:cnn", batch_size=2, steps=2, device="cpu", detail="lines")
    data["cpu-lines"] = json.loads(run.to_json())
    return data


def garble(doc: dict, path: tuple, value: Any, drop: bool) -> dict:
    doc = copy.deepcopy(doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if drop and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@FUZZ
@given(st.data(), JSON, st.booleans())
def test_a_report_with_one_value_garbled_loads_and_renders_or_is_one_line(
    real_data, data, value, drop
):
    name = data.draw(st.sampled_from(sorted(real_data)))
    doc = real_data[name]
    path = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    report = load_text(json.dumps(garble(doc, path, value, drop)))
    if report is not None:
        render_text(report)


@pytest.mark.parametrize(
    "text",
    [
        '{"schema": "vramscope.report/1", "peak": {"allocated_bytes": NaN}}',
        '{"schema": "vramscope.report/1", "steps": 5}',
        '{"schema": "vramscope.report/1", "steps": [{"epoch": 1}]}',
        '{"schema": "vramscope.report/1", "peak": {"allocated_bytes": 1' + "0" * 400 + "}}",
        "[" * 100000 + "]" * 100000,
    ],
    ids=["nan", "steps-not-a-list", "step-without-index", "huge-int", "deep"],
)
def test_reports_that_once_broke_the_loader(text):
    report = load_text(text)
    if report is not None:
        render_text(report)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"schema": "vramscope.report/1", "peak": {"allocated_bytes": NaN}}', "NaN"),
        ('{"schema": "vramscope.report/1", "steps": 5}', "steps should be a list"),
        ('{"schema": "vramscope.report/1", "steps": [{"epoch": 1}]}', "has no 'index'"),
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ((DATA / "report_h200_gpt.json").read_text()[:5000], "not valid JSON"),
        ('{"schema": "vramscope.demo/1", "reports": {}}', "this is vramscope demo's file"),
    ],
    ids=["nan", "steps-not-a-list", "step-without-index", "deep", "truncated", "demo-file"],
)
def test_report_of_a_garbled_file_is_one_line_and_exit_2(tmp_path, text, needle):
    path = tmp_path / "r.json"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "vramscope", "report", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:"), proc.stderr
    assert needle in lines[0]
