"""No import cycle between vramscope's modules: the dependency graph only points one way.

Every import statement of a module counts, wherever it stands: at the top, inside a
function (a deferred import is still a dependency) or under ``TYPE_CHECKING``. Importing a
module's own parent package does not (Python runs the parents first anyway).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vramscope

PACKAGE_DIR = Path(vramscope.__file__).parent

# Cycles being removed by the work that splits these modules; delete each pair once it is gone.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's ``__init__``)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def imported_modules(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The vramscope modules that ``name`` imports anywhere in its file."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            for alias in node.names:  # ``from pkg import module`` imports that module
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    found = set()
    for target in targets:
        while target and target not in known:  # ``import a.b.c`` of a name: its module
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    known = set(modules)
    return {name: imported_modules(name, *modules[name], known) for name in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that comes back to its start, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_deferred_and_type_only_imports():
    graph = import_graph()
    assert "vramscope.report.html" in graph["vramscope.report.exports"]  # inside a function
    assert "vramscope.estimate.recorder" in graph["vramscope.estimate.kernels"]  # TYPE_CHECKING
    assert "vramscope.contract" in graph["vramscope.examples"]


def test_no_module_imports_itself_back():
    graph = import_graph()
    for pair in KNOWN_CYCLES:
        a, b = sorted(pair)
        graph[a].discard(b)
        graph[b].discard(a)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
