"""The folder tree is the dependency graph (docs/architecture.md, the layering rule), with no
exception: common/ imports no other package of ours; the vocabulary (arch/) and the data readers
(userdata/) build only on common/; search_spaces/ on those; studies/ on the vocabulary (not alloc,
which reads studies to calibrate); alloc/ never imports workers/ (it reaches the torch measurer
through an entry point) and no torch or Ray; only workers/ may use both. No module shadows the
standard library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers"}
FORBIDDEN = {
    # Shared command-line, error, file and plot helpers: everyone may import them.
    "common": {"torch", "ray"} | OURS - {"common"},
    "arch": {"torch", "ray"} | OURS - {"arch", "common"},
    "userdata": {"torch", "ray"} | OURS - {"userdata", "common"},
    "search_spaces": {"torch", "ray", "alloc", "studies", "workers"},
    # alloc.calibrate reads studies; studies never reads alloc, so the graph stays acyclic.
    "alloc": {"torch", "ray", "workers"},
    "studies": {"torch", "ray", "workers", "alloc"},
}


def imports(path: Path) -> set[str]:
    """The root packages ``path`` imports (anywhere in the file, lazily too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    for path in files:
        name = str(path.relative_to(ROOT))
        bad = imports(path) & FORBIDDEN[package]
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_allocator_never_loads_torch() -> None:
    code = ("import sys, alloc.solve, alloc.profile, alloc.calibrate, alloc.compression, arch, "
            "userdata, search_spaces, studies; "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_no_module_shadows_the_standard_library() -> None:
    packages = [ROOT / p for p in sorted(OURS)] + [ROOT / "bench"]
    names = {path.stem for package in packages for path in package.rglob("*.py")}
    names |= {path.name for package in packages for path in package.rglob("*") if path.is_dir()}
    names |= OURS
    # ``python -m alloc.profile`` is a public command; the standard library's ``profile`` is the
    # pure-Python profiler, which nothing here imports. The one name kept, and pinned.
    shadowing = sorted(names & set(sys.stdlib_module_names) - {"profile"})
    assert not shadowing, f"modules named like the standard library's: {shadowing}"


def test_ray_is_imported_by_the_driver_and_the_trial_runner_only() -> None:
    users = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "workers").rglob("*.py")
                   if "ray" in imports(path))
    assert users == ["workers/search/tune.py"], users
