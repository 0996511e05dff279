"""The shape of the house (DESIGN.md, "Layers"), read from the source: two towers on one ground,
joined by the roles and the controller; imports point down only; acting and learning never
import each other; no import circle except type-only ones inside one folder; no module over
500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "roll"

FLOOR = {
    "roll": 0, "roll.batch": 0, "roll.errors": 0, "roll.models": 0, "roll.utils": 0,
    "roll.inference": 1, "roll.algorithms": 1,
    "roll.agentic": 2, "roll.multi_agent": 2,
    "roll.distributed": 3,
    "roll.pipeline": 4,
}
"""Floor of each top-level room: a module imports only from lower floors or its own room."""
TOWER = {"roll.inference": "acting", "roll.agentic": "acting",
         "roll.algorithms": "learning", "roll.multi_agent": "learning"}
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _submodule(module: str, name: str) -> str:
    path = ROOT.parent / Path(*module.split("."), name)
    return f"{module}.{name}" if path.is_dir() or path.with_suffix(".py").is_file() else module


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, type-only) for every roll import in a file, at any depth."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for inner in child.body:
                    visit_node(inner, True)
                for inner in child.orelse:
                    visit_node(inner, type_only)
            else:
                visit_node(child, type_only)

    def visit_node(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, type_only) for alias in node.names
                         if alias.name.split(".")[0] == "roll")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module.split(".")[0] == "roll"):
            # ``from roll.models import smollm2`` imports the submodule, not the package
            found.extend((_submodule(node.module, alias.name), type_only)
                         for alias in node.names)
        visit(node, type_only)

    visit(ast.parse(path.read_text()), False)
    return found


SOURCES = sorted(ROOT.rglob("*.py"))
GRAPH = {_module_name(path): _imports(path) for path in SOURCES}


def test_the_rooms_are_known():
    rooms = {_room(module) for module in GRAPH}
    assert rooms <= set(FLOOR), sorted(rooms - set(FLOOR))


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_and_the_towers_stay_apart(module):
    room = _room(module)
    for target, _ in GRAPH[module]:
        other = _room(target)
        if other == room or target == "roll" or FLOOR[room] == FLOOR[other] == 0:
            continue  # within a room, or ground on ground (circles are checked below)
        assert FLOOR[other] < FLOOR[room], f"{module} imports {target}: upward or sideways"
        towers = {TOWER.get(room), TOWER.get(other)}
        assert towers != {"acting", "learning"}, f"{module} imports {target} across the towers"


def test_no_import_circle_except_type_only_ones_inside_one_folder():
    def package(module: str) -> str:
        path = ROOT.parent / Path(*module.split("."))
        return module if path.is_dir() else module.rpartition(".")[0]

    edges = {module: {(target, type_only) for target, type_only in targets if target in GRAPH}
             for module, targets in GRAPH.items()}
    # Circles through run-time imports: none at all.
    runtime = {module: {t for t, type_only in targets if not type_only}
               for module, targets in edges.items()}
    assert not _cycles(runtime), _cycles(runtime)
    # With type-only imports too: each circle stays in one folder.
    for cycle in _cycles({module: {t for t, _ in targets} for module, targets in edges.items()}):
        assert len({package(module) for module in cycle}) == 1, cycle


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            # A package's __init__ re-exporting its own modules is not a circle of design.
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            connect(node)
    return found


def test_no_module_over_500_lines():
    long = {str(path.relative_to(ROOT.parent)): len(path.read_text().splitlines())
            for path in SOURCES}
    assert {path: lines for path, lines in long.items() if lines > MAX_LINES} == {}


def test_the_checks_see_a_violation():
    """The rules above can fail: a learning module importing the engine is caught."""
    room, target = _room("roll.multi_agent.model"), _room("roll.inference.hf.engine")
    assert {TOWER.get(room), TOWER.get(target)} == {"acting", "learning"}
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _imports(Path(__file__)) == []  # this file imports no roll module
