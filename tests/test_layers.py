"""The layers hold: no import cycle, and recall/ stands on the bottom floor (nothing from
run/, the runtime, testing or bench).

Every import counts, those made inside a function as well as at module level: a lazy
import is a dependency all the same, only paid later. TYPE_CHECKING ones are type-only and
do not count. The one exception is the CLI's lazy imports (:data:`LAZY_OK`), which exist
to keep ``loomrt --help`` fast and point down from the top floor anyway."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {
    "loomrt": REPO / "loomrt",
    "loomrt.providers": REPO / "providers",
    "loomrt.recall": REPO / "recall",
    "loomrt.harvest": REPO / "harvest",
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = [p for p in f.relative_to(folder).with_suffix("").parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


LAZY_OK = ("loomrt.cli",)
"""Packages whose imports inside functions are left out of the graph: the CLI imports each
command's machinery when the command runs, so that ``loomrt --help`` starts fast."""


def _imports(path: Path, known: set[str], name: str = "") -> set[str]:
    found: set[str] = set()
    lazy_ok = name.startswith(LAZY_OK)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # type-only
            if lazy_ok and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # the CLI's lazy imports (LAZY_OK)
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("loomrt"):
                names = [f"{child.module}.{a.name}" for a in child.names]
                found.update(n for n in names if n in known)
                if not any(n in known for n in names):
                    found.add(child.module)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("loomrt"))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


@functools.cache  # read once per session: the tree does not change while the tests run
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        graph[name] = {
            m for m in _imports(path, known, name) if m != name and m in known and not name.startswith(m + ".")
        }
    return graph


def test_no_module_level_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    # a package's __init__ re-exporting its submodules is not a cycle of concerns
    real = [
        c
        for c in cycles
        if not any(c[i].startswith(c[i + 1] + ".") or c[i + 1].startswith(c[i] + ".") for i in range(len(c) - 1))
    ]
    assert real == []


def test_recall_stands_on_the_bottom_floor() -> None:
    graph = _graph()
    outside = {
        m
        for n, deps in graph.items()
        if n.startswith("loomrt.recall")
        for m in deps
        if not m.startswith("loomrt.recall")
    }
    forbidden = {m for m in outside if m.startswith(("loomrt.run", "loomrt.runtime", "loomrt.testing", "loomrt.bench"))}
    assert forbidden == set()
    assert outside <= {
        "loomrt.events",
        "loomrt.messages",
        "loomrt.tokens",
        "loomrt.tools",
        "loomrt.crashpoints",
        "loomrt.visibility",
        "loomrt.driving",
    }


def test_harvest_is_wired_at_the_top_and_never_imported_by_recall_or_the_run() -> None:
    """harvest/ stands above recall/ and run/: they never import it (even inside a function);
    the toolset wires it in."""
    for folder in (REPO / "recall", REPO / "loomrt" / "run"):
        for f in folder.rglob("*.py"):
            assert not re.search(r"^\s*(from|import) loomrt\.harvest", f.read_text(encoding="utf-8"), re.M), f
    harvest = {m for n, deps in _graph().items() if n.startswith("loomrt.harvest") for m in deps}
    assert not {m for m in harvest if m.startswith(("loomrt.run.", "loomrt.runtime", "loomrt.bench", "loomrt.cli"))}


def test_the_record_never_imports_what_stands_above_it() -> None:
    """record/ is the bottom floor: harvest registers its migrations from its own side."""
    above = ("loomrt.harvest", "loomrt.run", "loomrt.runtime", "loomrt.cli", "loomrt.mcp", "loomrt.bench")
    graph = _graph()
    up = {(n, m) for n, deps in graph.items() if n.startswith("loomrt.record") for m in deps if m.startswith(above)}
    assert up == set()
