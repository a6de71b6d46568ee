"""Every command and Python snippet the README and the guides show still works as written.

Each fenced ``python -m`` command of README.md and docs/guide/*.md (in bash blocks, or after a
``$`` prompt) is parsed by its own command's argument parser exactly as written, so a renamed
flag, a removed choice or a moved command fails here; a command with a placeholder (``...``)
and each inline ``python -m`` mention is checked for its command and flag names. Each Python
block must compile and every name it imports must exist. Blocks marked
``<!-- docs-test: run -->`` (the quick starts) run for real, line by line, in a fresh directory.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md")),
        ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
OURS = {"alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers", "bench",
        "experiments"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(python -m [^`]+)`")
RUN_MARK = "<!-- docs-test: run -->"
SHELL = {"bash", "sh", "shell", "console", "text", ""}
SEPARATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class Block:
    """A fenced block of a document."""

    where: str  # file:line of its first line
    lang: str
    text: str
    run: bool  # marked to run for real


@dataclass(frozen=True)
class Command:
    """One ``python -m MODULE ARGS`` of the docs."""

    where: str
    module: str
    argv: tuple[str, ...]
    exact: bool  # written out in full (parse it); False: a placeholder or prose mention

    def __str__(self) -> str:
        return f"{self.where}: python -m {shlex.join([self.module, *self.argv])}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, match.start()) + 2
        found.append(Block(f"{path.relative_to(ROOT)}:{line}", match.group(1), match.group(2),
                           before == RUN_MARK))
    return found


def shell_lines(block: Block) -> Iterator[tuple[str, str]]:
    """(where, line) of a shell block: continuations joined, ``$`` prompts removed, output
    lines of a console block (no prompt) skipped when the block has prompts."""
    lines = block.text.replace("\\\n", " ").split("\n")
    prompted = any(line.startswith("$ ") for line in lines)
    first = int(block.where.rsplit(":", 1)[1])
    for n, line in enumerate(lines):
        if prompted and not line.startswith("$ "):
            continue
        yield f"{block.where.rsplit(':', 1)[0]}:{first + n}", line.removeprefix("$ ").strip()


def parse_commands(where: str, line: str, exact: bool) -> list[Command]:
    """The commands of ``line``; an optional part written ``[--flag value]`` is parsed as
    given (its brackets dropped), so its flags are checked too."""
    words = [w.strip("[]") for w in shlex.split(line, comments=True)]
    words = [w for w in words if w]
    parts: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(word)
    commands = []
    for part in parts:
        if part[:2] == ["python", "-m"] and len(part) > 2 and part[2].split(".")[0] in OURS:
            commands.append(Command(where, part[2], tuple(part[3:]),
                                    exact and "..." not in part))
    return commands


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        for block in blocks(path):
            if block.lang in SHELL:
                for where, line in shell_lines(block):
                    commands += parse_commands(where, line, exact=True)
        prose = FENCE.sub("", path.read_text())
        for mention in INLINE.findall(prose):
            commands += parse_commands(str(path.relative_to(ROOT)), mention, exact=False)
    return commands


def python_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.lang == "python"]


def run_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.run]


# --- parsing a command with its own parser ------------------------------------------------------


class Parsed(Exception):
    """Raised by the patched ``parse_args`` once a command's flags parsed: nothing runs."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def parse(module: str, argv: list[str]) -> tuple[int | None, str]:
    """Run ``python -m module argv`` in this process up to its argument parsing: (None, "")
    when the flags parse, else (exit code, what the parser printed)."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, args: Any = None,
                        namespace: Any = None) -> argparse.Namespace:
        original(self, args, namespace)
        raise Parsed(self)

    out, err = io.StringIO(), io.StringIO()
    try:
        with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
                mock.patch.object(sys, "argv", [module, *argv]), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            # The command's module is usually imported already (by an earlier command): runpy
            # warns that it runs a second copy as __main__, which is what is wanted here.
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except Parsed:
        return None, ""
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue() + err.getvalue()
    return -1, "the command ran without parsing its arguments first"


def flags(argv: tuple[str, ...]) -> list[str]:
    return [w.split("=", 1)[0] for w in argv if w.startswith("--")]


COMMANDS = documented_commands()


def test_the_docs_show_commands_and_snippets() -> None:
    """The extraction itself finds what the docs hold (a broken regex would pass every test)."""
    modules = {c.module for c in COMMANDS}
    assert {"alloc.solve", "alloc.profile", "workers.train", "workers.search",
            "workers.profile", "workers.compress", "studies"} <= modules
    assert sum(c.exact for c in COMMANDS) >= 50
    assert len(python_blocks()) >= 2 and run_blocks()


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.exact], ids=str)
def test_documented_command_parses(command: Command) -> None:
    code, said = parse(command.module, list(command.argv))
    assert code is None, f"{command}\n  exit {code}: {said.strip()[-400:]}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.exact], ids=str)
def test_documented_mention_names_real_flags(command: Command) -> None:
    """A placeholder command or a prose mention: its command exists and its flags are its
    parser's (or its subcommand's); a placeholder module (``python -m bench.NAME``): its package
    exists."""
    if any(part.isupper() for part in command.module.split(".")):
        assert importlib.util.find_spec(command.module.split(".")[0]) is not None, str(command)
        return
    words = [w for w in command.argv if w != "..." and not w.startswith("-")]
    sub = words[:1] if command.module == "studies" else []
    code, help_text = parse(command.module, [*sub, "--help"])
    assert code == 0, f"{command}\n  --help: exit {code}: {help_text.strip()[-400:]}"
    missing = [f for f in flags(command.argv) if not re.search(rf"{re.escape(f)}\b", help_text)]
    assert not missing, f"{command}: no flag {missing} in its --help"


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.where)
def test_documented_python_imports(block: Block) -> None:
    tree = ast.parse(block.text, filename=block.where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}") is not None, (
                    f"{block.where}: from {node.module} import {alias.name}: no such name")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


@pytest.mark.parametrize("block", run_blocks(), ids=lambda b: b.where)
def test_quick_start_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The block's lines, in order, in a fresh directory: each exits 0. A search joins the
    test process's Ray node (``RAY_ADDRESS``, as on a cluster); the other search tests run
    searches on a Ray of their own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "workers.search" in block.text:
        env.update(request.getfixturevalue("ray_cluster"))
    for where, line in shell_lines(block):
        if not line or line.startswith("#"):
            continue
        done = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, executable="/bin/bash")
        assert done.returncode == 0, (f"{where}: {line}\n  exit {done.returncode}: "
                                      f"{(done.stdout + done.stderr).strip()[-800:]}")
