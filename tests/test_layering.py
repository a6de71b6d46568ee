"""The folder tree is the dependency graph: common/ imports no other package of ours,
alloc/ and search_spaces/ import no torch or Ray, studies/ no torch (and not alloc, which reads
studies to calibrate); only workers/ may use both (STYLE.md rule 1). One exception is allowed
and pinned: ``alloc.profile --checkpoint`` runs the trained model, so that function imports
``workers`` lazily; importing alloc never loads torch."""

from __future__ import annotations

import ast
import subprocess
import sys
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
# (file, package, function): a lazy import inside that function only.
ALLOWED = {("alloc/profile.py", "workers", "main")}


def imports(path: Path) -> set[tuple[str, str | None]]:
    """(imported root package, enclosing top-level function or None)."""
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for top in tree.body:
        function = top.name if isinstance(top, ast.FunctionDef) else None
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                found |= {(alias.name.split(".")[0], function) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((node.module.split(".")[0], function))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    for path in files:
        name = str(path.relative_to(ROOT))
        bad = {(root, fn) for root, fn in imports(path) if root in FORBIDDEN[package]
               and (name, root, fn) not in ALLOWED}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_allocator_never_loads_torch() -> None:
    code = ("import sys, alloc.solve, alloc.profile, alloc.calibrate, search_spaces; "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
