"""The JSON Schema (draft 2020-12) of the report, and a validator for it.

``jsonschema`` is imported only when ``validate`` is called, so reading and writing
reports never needs it.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

from vramscope.errors import VramscopeError

REPORT_SCHEMA_FILE = "report.schema.json"


def schema_path() -> Path:
    """Where the report schema lies (a file inside the installed package)."""
    return Path(str(resources.files(__name__).joinpath(REPORT_SCHEMA_FILE)))


@functools.lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The report schema as a dict."""
    return json.loads(schema_path().read_text(encoding="utf-8"))


def errors(data: dict[str, Any]) -> list[str]:
    """Every way ``data`` breaks the schema, as 'path: message' lines (empty when valid)."""
    try:
        import jsonschema
    except ImportError:
        raise VramscopeError(
            "validating a report needs the jsonschema package: pip install jsonschema"
        ) from None
    validator = jsonschema.Draft202012Validator(load_schema())
    found = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}" for e in found]


def validate(data: dict[str, Any]) -> None:
    """Raise VramscopeError, naming the first problems, when ``data`` is not a valid report."""
    problems = errors(data)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise VramscopeError("not a valid vramscope report: " + "; ".join(problems[:3]) + more)
