"""Fill the generated blocks of the docs and the README from their sources.

A page marks a block with an HTML comment, invisible on GitHub and on the site:

    <!-- generated: table accuracy-summary -->      a table from docs/gen/tables.py
    <!-- generated: output demo.txt -->             a recording from docs/outputs/
    ...                                             (replaced on every run)
    <!-- end generated -->

``python docs/gen/sync.py`` rewrites every block; ``--check`` changes nothing and exits 1
naming the blocks that are out of date (the test suite runs it). Recordings are made by
``docs/gen/record_outputs.py``, which calls this afterwards.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUTPUTS = ROOT / "docs" / "outputs"
sys.path.insert(0, str(HERE))

from tables import TABLES  # noqa: E402

BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<kind>table|output) (?P<name>[\w.-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- end generated -->)",
    re.DOTALL,
)


def pages(root: Path = ROOT) -> list[Path]:
    """Every Markdown file that may hold generated blocks."""
    return [*sorted((root / "docs").rglob("*.md")), root / "README.md"]


def content(kind: str, name: str, root: Path = ROOT) -> str:
    """What a block holds now."""
    if kind == "table":
        if name not in TABLES:
            raise SystemExit(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}")
        return TABLES[name](root).rstrip("\n") + "\n"
    recording = root / "docs" / "outputs" / name
    if not recording.exists():
        raise SystemExit(f"no recording {recording}; run docs/gen/record_outputs.py")
    return "```text\n" + recording.read_text(encoding="utf-8").rstrip("\n") + "\n```\n"


def filled(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """``text`` with every block refilled, and the names of the blocks that changed."""
    changed: list[str] = []

    def refill(match: re.Match[str]) -> str:
        body = content(match["kind"], match["name"], root)
        if body != match["body"]:
            changed.append(f"{match['kind']} {match['name']}")
        return match["open"] + body + match["close"]

    return BLOCK.sub(refill, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new, changed = filled(text)
        if not changed:
            continue
        name = page.relative_to(ROOT)
        stale += [f"{name}: {block}" for block in changed]
        if not args.check:
            page.write_text(new, encoding="utf-8")
    if stale:
        verb = "out of date" if args.check else "updated"
        print(f"{len(stale)} generated blocks {verb}:\n  " + "\n  ".join(stale))
        if args.check:
            print("run: python docs/gen/sync.py")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
