"""The report's JSON Schema: valid draft 2020-12, complete, and met by real reports."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest

import vramscope
from vramscope import schema
from vramscope.errors import VramscopeError
from vramscope.report import html
from vramscope.report import model as m

DATA = Path(__file__).parent / "data"
CONTRACT = (
    "schema",
    "kind",
    "workload",
    "device",
    "peak",
    "categories_at_peak",
    "phases",
    "modules",
    "steps",
)

# each dataclass of the model and the part of the schema that describes it
PARTS = {
    m.Report: None,  # the top level
    m.Peak: "peak",
    m.Categories: "categories",
    m.Startup: "startup",
    m.PhaseStats: "phase",
    m.StepStats: "step",
    m.EpochStats: "epoch",
    m.Reconciliation: "reconciliation",
    m.AllocatorSlack: "slack",
    m.Finding: "finding",
    m.Timeline: "timeline",
    m.OomInfo: "oom",
    m.ExitInfo: "exit",
    m.RankEntry: "rank",
    m.RankExit: "rank_exit",
}


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def cpu_report() -> m.Report:
    return vramscope.measure("example:cnn", batch_size=2, steps=2, device="cpu")


def test_the_schema_is_valid_draft_2020_12():
    loaded = schema.load_schema()
    assert loaded["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(loaded)


def test_the_schema_ships_inside_the_package():
    path = schema.schema_path()
    assert path.name == "report.schema.json" and path.is_file()
    assert path.parent == Path(vramscope.__file__).parent / "schema"


def test_the_contract_keys_are_required():
    loaded = schema.load_schema()
    assert set(loaded["required"]) == set(CONTRACT)
    assert set(loaded["$defs"]["peak"]["required"]) == {
        "allocated_bytes",
        "reserved_bytes",
        "device_used_bytes",
    }
    assert set(loaded["$defs"]["categories"]["required"]) == set(m.CATEGORY_NAMES)
    assert {"index", "peak_allocated_bytes", "peak_reserved_bytes"} <= set(
        loaded["$defs"]["step"]["required"]
    )
    assert {"name", "peak_allocated_bytes"} <= set(loaded["$defs"]["phase"]["required"])


@pytest.mark.parametrize("cls", list(PARTS), ids=lambda c: c.__name__)
def test_the_schema_documents_every_field_of_the_model(cls):
    loaded = schema.load_schema()
    part = loaded if PARTS[cls] is None else loaded["$defs"][PARTS[cls]]
    fields = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    assert fields <= set(part["properties"])
    assert part.get("additionalProperties", True) is True  # newer minor versions add keys


@pytest.mark.parametrize("name", ["report_h200_gpt.json", "report_h200_leak.json"])
def test_reports_recorded_on_an_h200_are_valid(name):
    assert schema.errors(recorded(name)) == []


def test_a_fresh_cpu_report_is_valid_and_renders(cpu_report):
    data = json.loads(cpu_report.to_json())
    assert schema.errors(data) == []
    page = html.render(cpu_report)
    assert "GPU memory was not measured" in page and 'id="chart-timeline"' in page


def test_an_older_minor_version_without_optional_sections_loads_and_is_valid():
    data = recorded("report_h200_gpt.json")
    data["schema"] = "vramscope.report/1.0"
    for optional in ("timeline", "epochs", "startup", "oom", "reconciliation", "findings", "host"):
        del data[optional]
    schema.validate(data)
    report = m.Report.from_dict(data)
    assert report.schema == "vramscope.report/1.0"
    assert report.timeline.t == [] and report.oom is None
    assert schema.errors(report.to_dict()) == []
    assert "<h1>example:gpt</h1>" in html.render(report)


def test_a_newer_minor_version_with_new_keys_is_valid():
    data = recorded("report_h200_gpt.json")
    data["schema"] = "vramscope.report/1.4"
    data["future_section"] = {"anything": [1, 2]}
    data["peak"]["future_key"] = 1
    assert schema.errors(data) == []


def test_a_missing_contract_key_is_named():
    data = recorded("report_h200_gpt.json")
    del data["categories_at_peak"]
    with pytest.raises(VramscopeError, match="'categories_at_peak' is a required property"):
        schema.validate(data)


def test_a_wrong_value_is_named_with_its_path():
    data = recorded("report_h200_gpt.json")
    data["steps"][2]["peak_allocated_bytes"] = "a lot"
    data["schema"] = "vramscope.report/2"
    problems = schema.errors(data)
    assert any(p.startswith("steps/2/peak_allocated_bytes:") for p in problems)
    assert any(p.startswith("schema:") for p in problems)
