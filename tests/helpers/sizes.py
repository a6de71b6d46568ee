"""Long functions of the product, reported at the end of a test run (``conftest.py``), never
failing it: a long function is a smell to look at in review, not a rule to satisfy (a module's
length is not reported: one job per module is what is reviewed, docs/architecture.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers")
LONG_FUNCTION = 60  # lines: beyond this, a function is named in the report


def product_modules(root: Path = ROOT, packages: Iterable[str] = PRODUCT) -> list[Path]:
    """Product code: the packages, without the papers' experiments (scripts that run one study
    each, read top to bottom)."""
    return [f for package in packages for f in sorted((root / package).rglob("*.py"))
            if "experiments" not in f.parts]


def long_functions(modules: Iterable[Path], root: Path = ROOT,
                   limit: int = LONG_FUNCTION) -> list[str]:
    """``path:line name(): N lines`` for each function of ``modules`` over ``limit`` lines."""
    found = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}(): "
                                 f"{length} lines")
    return found
