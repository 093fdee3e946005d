"""The house's layout holds: imports run down the path a number takes, never up, never around.

Floors, lowest first: ``notation``; ``model``; ``terms``; ``serve`` and ``compose`` (side by side,
neither imports the other); ``answers``; ``flags`` (how the CLI reads a field); the entry points
(``cli`` and the package's public names, then ``browser`` and ``__main__`` over the CLI);
``measure``. A module imports only from its own package or a lower floor, at module level; the
one function-local import is the CLI's of the ``measure`` extra (torch, transformers).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "vrammath"
FLOORS = {
    "notation": 0,
    "model": 1,
    "terms": 2,
    "serve": 3,
    "compose": 3,
    "answers": 4,
    "flags": 5,
    "serve_command": 6,
    "cli": 7,
    "__init__": 7,
    "browser": 8,
    "__main__": 8,
    "measure": 9,
}
LOCAL_ALLOWED = {("vrammath.cli", "vrammath.measure.derive")}
MAX_LINES = 520


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _floor(module: str) -> tuple[int, str]:
    head = module.split(".")[1] if "." in module else "__init__"
    return FLOORS[head], head


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported vrammath module, at module level) for every import of ``module``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vrammath"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = [n for n in names if n in MODULES] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("vrammath")]
        else:
            continue
        found += [(t, id(node) in top) for t in targets if t != module]
    return found


def test_every_package_has_a_floor() -> None:
    assert {_floor(m)[1] for m in MODULES} == set(FLOORS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down(module: str) -> None:
    floor, head = _floor(module)
    for target, at_top in _imports(module):
        if (module, target) in LOCAL_ALLOWED:  # an optional extra, loaded where it is used
            continue
        if target == "vrammath":  # the public names: the entry points' floor
            target_floor, target_head = FLOORS["__init__"], "__init__"
        else:
            target_floor, target_head = _floor(target)
        assert target_floor < floor or target_head == head, f"{module} imports {target} (up)"
        assert at_top or (module, target) in LOCAL_ALLOWED, f"{module} imports {target} locally"


def test_no_import_circle() -> None:
    graph = {m: {t for t, _ in _imports(m) if t in MODULES} for m in MODULES}
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path[path.index(node) :], node))
        if node in done:
            return
        for nxt in graph[node]:
            visit(nxt, (*path, node))
        done.add(node)

    for module in MODULES:
        visit(module, ())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_formulas_read_the_parts(module: str) -> None:
    # a model type is the readers' business (and the measurement harness's, which builds the
    # real transformers class of it): a formula reads the part the reader set
    if module.startswith(("vrammath.model.readers", "vrammath.measure")):
        return
    text = MODULES[module].read_text(encoding="utf-8")
    assert not re.search(r"model_type\s*(==|!=|in\b|not\s+in\b)", text), module
