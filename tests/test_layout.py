"""The arrows point down: each package imports only the packages below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trtbuild"

# package -> what it may import (besides itself and the leaf modules below)
LEAVES = {"errors", "numerics", "fsutil", "sizes", "__init__"}
ALLOWED = {
    "graph": set(),
    "policy": {"graph"},  # graph.patterns: the pattern names the schema lists
    "passes": {"graph", "policy"},
    "precision": {"graph", "policy"},
    "engine": {"graph", "policy"},
    "accuracy": {"graph", "policy"},
    "cache": set(),
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
