"""The shape of the house: small files, no import circles, nothing shipped that needs the
benchmarks. Each limit here is one a reader relies on to find an idea in one file."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "lookahead"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_shipped_python_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): _lines(p) for p in PACKAGE.rglob("*.py") if _lines(p) > 400}
    assert not long, long


def test_no_rust_file_over_700_lines():
    rust = ROOT / "rust"
    long = {str(p.relative_to(ROOT)): _lines(p) for p in rust.rglob("*.rs") if _lines(p) > 700}
    assert not long, long


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each package module's imports of other package modules (at any depth of the file:
    a function-level import closes a circle too, only later)."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files) | {"lookahead._core"}
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in known else node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in known and d != name}
    return graph


def test_no_import_circle():
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(name: str, path: list) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                circles.append(path[path.index(dep) :] + [dep])  # on the path: a circle
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles


def test_the_package_needs_nothing_outside_it():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                assert n.split(".")[0] not in ("benchmarks", "research", "tests"), (path, n)
