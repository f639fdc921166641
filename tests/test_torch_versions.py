"""The torch versions the estimator accepts: declared once, refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vramscope.errors import VramscopeError
from vramscope.estimate import torch_support
from vramscope.estimate.estimator import estimate

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_the_range_the_estimator_accepts():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib comes with Python 3.11")
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["vramscope"]
    assert declared["estimate-torch"] == torch_support.supported_range() == ">=2.11,<2.16"
    for version in declared["tested-torch"]:
        torch_support.check_torch_version(version)
    noxfile = (ROOT / "noxfile.py").read_text()
    assert all(f'"{version}"' in noxfile for version in declared["tested-torch"])


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.14.1+cu130", (2, 14)), ("2.13.0+cpu", (2, 13)), ("2.16.0.dev20270101", (2, 16))],
)
def test_a_release_is_its_major_and_minor_number(version, release):
    assert torch_support.torch_release(version) == release


@pytest.mark.parametrize("version", ["2.10.0", "2.4.1+cu121", "2.16.0", "3.0.0"])
def test_other_versions_are_refused_in_one_line(monkeypatch, version):
    monkeypatch.delenv("VRAMSCOPE_ANY_TORCH", raising=False)
    monkeypatch.setattr(torch_support.torch, "__version__", version)
    with pytest.raises(VramscopeError) as caught:
        estimate("example:gpt", 1, gpu="h200")
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"vramscope estimates need torch 2.11 to 2.15 (this is torch {version}): install one "
        "of those, or set VRAMSCOPE_ANY_TORCH=1 to try anyway"
    )


def test_the_override_lets_another_version_through(monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_ANY_TORCH", "1")
    torch_support.check_torch_version("2.16.0")
