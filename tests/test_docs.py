"""The documentation site: it builds with `mkdocs build --strict`, its generated blocks are
up to date with the benchmark results and the recordings, and the recordings are the
recorder's, free of this machine's paths."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "gen"))

import record_outputs  # noqa: E402
import sync  # noqa: E402


def test_the_site_builds_strict(tmp_path: Path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # the reference is made from the docstrings
    assert "Track the memory of a block of code" in api
    for page in ("getting-started", "commands/demo", "estimator", "schema", "faq"):
        assert (site / page / "index.html").exists(), page


def test_generated_blocks_are_up_to_date():
    stale = []
    for page in sync.pages():
        _, changed = sync.filled(page.read_text(encoding="utf-8"))
        stale += [f"{page.relative_to(ROOT)}: {block}" for block in changed]
    assert not stale, "run python docs/gen/sync.py:\n" + "\n".join(stale)


def test_estimator_accuracy_tables_are_made_from_the_committed_results():
    page = (DOCS / "estimator.md").read_text(encoding="utf-8")
    for name in ("accuracy-summary", "accuracy-cases", "accuracy-worst", "estimate-speed"):
        assert f"<!-- generated: table {name} -->" in page
    import json

    cases = json.loads((ROOT / "benchmarks/results/accuracy_h200.json").read_text())["cases"]
    table = sync.content("table", "accuracy-cases")
    assert len([line for line in table.splitlines() if line.startswith("| `")]) == len(cases)


@pytest.mark.parametrize("recording", record_outputs.RECORDINGS, ids=lambda r: r.name)
def test_each_recording_is_the_recorders_and_names_no_machine_path(recording):
    text = (DOCS / "outputs" / f"{recording.name}.txt").read_text(encoding="utf-8")
    first = text.splitlines()[0]
    assert first.startswith("$ vramscope "), first
    assert not re.search(r"(/tmp/vramscope-docs|/work/|/root/|/home/)", text)
    used = "".join(page.read_text(encoding="utf-8") for page in sync.pages())
    assert f"<!-- generated: output {recording.name}.txt -->" in used


def test_every_recording_file_has_a_recorder():
    names = {r.name for r in record_outputs.RECORDINGS}
    files = {p.stem for p in (DOCS / "outputs").glob("*.txt")}
    assert files == names


def test_readme_links_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [link for link in re.findall(r"\]\(([^)#]+)", readme) if "://" not in link]
    assert len(links) >= 15
    assert [link for link in links if not (ROOT / link).exists()] == []
