"""The arrows point down: each package imports only the packages below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trtbuild"

# package -> what it may import (besides itself and the leaf modules below)
LEAVES = {
    "errors",
    "numerics",
    "fsutil",
    "sizes",
    "record",
    "ortload",
    "cores",
    "children",
    "words",
    "shared",
    "__init__",
}
ALLOWED = {
    "graph": set(),
    "policy": {"graph"},  # graph.patterns: the pattern names the schema lists
    "passes": {"graph", "policy"},
    "precision": {"graph", "policy"},
    "engine": {"graph", "policy"},
    "accuracy": {"graph", "policy"},
    "cache": set(),
    # each cached kind as data; it builds the stages' values, so it sits above them
    "cache_codec": {"cache", "graph", "policy", "passes", "precision", "accuracy"},
}


def _imports(path: Path) -> set[str]:
    """trtbuild subpackages a module imports, at any depth, except for type checking."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "trtbuild" and len(parts) > 1:
                found.add(parts[1])
    return found - LEAVES


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_is_below_it(package):
    paths = [PACKAGE / f"{package}.py"] if (PACKAGE / f"{package}.py").is_file() else []
    paths += sorted((PACKAGE / package).rglob("*.py")) if (PACKAGE / package).is_dir() else []
    assert paths
    for path in paths:
        wrong = _imports(path) - ALLOWED[package] - {package}
        assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


def test_no_package_is_named_build():
    assert not (PACKAGE / "build").exists()


def _mutables(path: Path) -> set[str]:
    """Module-level names bound to a mutable: a dict, list or set display or call."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp))
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            mutable = mutable or value.func.id in ("dict", "list", "set", "defaultdict")
        if mutable:
            found.update(t.id for t in targets if isinstance(t, ast.Name))
    return found


def test_no_module_imports_another_modules_mutable():
    """State shared by import is hidden state: each module's mutables stay its own.

    A public UPPER_CASE table (the schema, `LOW_MAX`, the check registry) is a fact
    written once and read everywhere, not state; anything else mutable is refused.
    """
    modules = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p
        for p in PACKAGE.rglob("*.py")
    }
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module not in modules:
                continue
            shared = {a.name for a in node.names} & _mutables(modules[node.module])
            shared = {n for n in shared if n.startswith("_") or not n.isupper()}
            assert not shared, f"{path.relative_to(PACKAGE)} imports {node.module}'s {shared}"


def test_functions_and_classes_read_at_once():
    """No function over 60 lines and no class over 120 in the package: each reads at once."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = {ast.FunctionDef: 60, ast.AsyncFunctionDef: 60, ast.ClassDef: 120}.get(
                type(node)
            )
            if limit and node.end_lineno - node.lineno + 1 > limit:
                too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert not too_long, too_long


def _module_graph() -> dict[str, set[str]]:
    """Every trtbuild module and the trtbuild modules it imports: any import, at any depth,
    type-checking ones and top-level modules included."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_import_cycle_anywhere():
    """Arrows point down between modules too: no module reaches itself through its imports."""
    graph, done, path = _module_graph(), set(), []

    def visit(name: str) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        path.append(name)
        for other in sorted(graph[name]):
            visit(other)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
