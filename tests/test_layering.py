"""The folder tree is the dependency graph: common/ imports no other package of ours,
alloc/ and search_spaces/ import no torch or Ray,
studies/ no torch (and not alloc, which reads studies to calibrate); only workers/ may use both
(STYLE.md rule 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    # Shared command-line, file and plot helpers: everyone may import them, they import no one.
    "common": {"torch", "ray", "alloc", "studies", "workers", "search_spaces"},
    "search_spaces": {"torch", "ray", "alloc", "studies", "workers"},
    # alloc.calibrate reads studies; studies never reads alloc, so the graph stays acyclic.
    "alloc": {"torch", "ray", "workers"},
    "studies": {"torch", "workers", "alloc"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    for path in files:
        bad = imported_roots(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
