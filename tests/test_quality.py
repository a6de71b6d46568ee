"""Lint and type checks run with the suite, so CI enforces the configured ruff and mypy rules."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [
    ["ruff", "check", "."],
    ["mypy"],
])
def test_tool_passes(command: list[str]) -> None:
    if shutil.which(command[0]) is None:
        pytest.fail(f"{command[0]} is not installed: pip install -e '.[test]'")
    result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


PRODUCT = ("alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60


def product_modules() -> list[Path]:
    """Product code: the packages, without the papers' experiments (scripts that run one study
    each, read top to bottom)."""
    return [f for package in PRODUCT for f in sorted((ROOT / package).rglob("*.py"))
            if "experiments" not in f.parts]


def test_modules_and_functions_stay_small() -> None:
    """One job per module and per function: no product module over 450 lines, no function
    over 60 (docs/architecture.md)."""
    import ast

    too_long = []
    for path in product_modules():
        text = path.read_text()
        name = path.relative_to(ROOT)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    assert not too_long, too_long
