"""Every ``python -m`` entry point answers ``--help`` (and each subcommand's), showing each
default at most once, and cites no document a user of the package cannot open."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for package in ("alloc", "studies", "workers", "bench")
    for path in (ROOT / package).rglob("*.py")
    if "def main(" in path.read_text() and path.name != "harness.py")
# Citations of the project's internal documents (spelt in pieces so this file has none).
UNRESOLVABLE = re.compile(r"\bS" r"PEC\b|paper 0" "0[0-9]")
SUBCOMMANDS = {"studies.cli": ["list", "best", "top", "pareto", "layers", "theory", "export",
                               "errors"]}


def help_text(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_the_entry_points_are_found() -> None:
    assert {"alloc.solve", "alloc.profile", "workers.train", "workers.search.cli",
            "workers.profile", "studies.cli"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("package", ["workers.search", "studies"])
def test_packages_run_with_python_dash_m(package: str) -> None:
    """``python -m workers.search`` and ``python -m studies`` run their ``__main__``."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", package, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_shows_each_default_once(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in [[]] + [[c] for c in SUBCOMMANDS.get(module, [])]:
        text = help_text(module, argv, capsys)
        assert text.startswith("usage:")
        # One entry per option: a line starting with "  -", then its indented continuation.
        for entry in re.split(r"\n(?=  -)", text.split("options:", 1)[-1]):
            flat = " ".join(entry.split())  # argparse wraps lines
            assert flat.count("(default") <= 1, (module, argv, flat)
            assert "(default: None)" not in flat, (module, argv, flat)
        assert not UNRESOLVABLE.search(text), (module, argv)  # users cannot open those
