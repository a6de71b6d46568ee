"""The ``# Copied from`` check, as ``transformers``' ``utils/check_copies.py`` does it: a function
marked ``# Copied from package.module.NAME`` (optionally ``with OLD->NEW``, names replaced
in the source first) must equal that function's source text."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^# Copied from (?P<module>[\w.]+)\.(?P<name>\w+)"
                  r"(?: with (?P<old>\w+)->(?P<new>\w+))?\s*$")


def function_sources(text: str) -> dict[str, str]:
    """Each top-level function of a module's ``text``, by name: its source text."""
    tree = ast.parse(text)
    return {node.name: ast.get_source_segment(text, node) or "" for node in tree.body
            if isinstance(node, ast.FunctionDef)}


def copies(text: str) -> list[tuple[str, str, str, str | None, str | None]]:
    """``(copy's name, source module, source name, old, new)`` of each marked function: the
    mark is the line right above its ``def``."""
    lines = text.splitlines()
    found = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.lineno >= 2:
            mark = MARK.match(lines[node.lineno - 2])
            if mark:
                found.append((node.name, mark["module"], mark["name"], mark["old"], mark["new"]))
    return found


def drifted(path: Path) -> list[str]:
    """One line per marked function of ``path`` that differs from its source (empty: every copy
    is exact)."""
    text = path.read_text()
    ours = function_sources(text)
    problems = []
    for name, module, source_name, old, new in copies(text):
        source_path = ROOT / (module.replace(".", "/") + ".py")
        source = function_sources(source_path.read_text()).get(source_name)
        if source is None:
            problems.append(f"{name}: {module}.{source_name} does not exist")
            continue
        if old is not None and new is not None:
            source = re.sub(rf"\b{old}\b", new, source)
        if ours[name] != source:
            problems.append(f"{name}: differs from {module}.{source_name}")
    return problems
