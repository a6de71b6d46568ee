"""Start-up stays light: ``python -m CMD --help`` of every product command, and ``studies list`` /
``studies best`` on a small study, import none of the heavy libraries; each is imported where it
is used, once the flags are read. Checked in a fresh interpreter per command, as a property, not
a time (``python -m bench.startup`` measures the times)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from arch import ArchConfig, HeadGroup, LayerSpec
from studies import add_record, open_storage

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("alloc.solve", "alloc.profile", "alloc.calibrate", "workers.train",
            "workers.search", "workers.profile", "workers.compress", "workers.calibrate",
            "studies")
HEAVY = ("torch", "ray", "scipy.stats", "scipy.optimize", "transformers", "matplotlib", "optuna")
# Runs ``python -m MODULE ARGS...`` in this interpreter, then prints the heavy modules it loaded.
PROBE = """
import json, runpy, sys
module, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as exit_:
    assert not exit_.code, exit_.code
print()
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""


def heavy_modules(*argv: str) -> list[str]:
    """The heavy modules ``python -m *argv`` imports, run in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded: list[str] = json.loads(proc.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize("command", COMMANDS)
def test_help_imports_no_heavy_library(command: str) -> None:
    # The study package is Optuna's storage: importing it loads Optuna, nothing heavier.
    allowed = {"optuna"} if command == "studies" else set()
    assert set(heavy_modules(command, "--help")) <= allowed


@pytest.mark.parametrize("query", ["list", "best"])
def test_reading_a_study_imports_optuna_only(query: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="small")
    for heads in (1, 2, 4):
        layer = LayerSpec("mhsa", (HeadGroup(heads, 64 // heads),))
        arch = ArchConfig(d_model=64, layers=(layer,) * 2, max_seq_len=16, input_dim=8)
        add_record(study, arch, 1.0 / heads, steps_reached=10)
    assert heavy_modules("studies", query, "--storage", url) == ["optuna"]


def test_a_trial_imports_no_storage_library() -> None:
    """What a search's trial runs (a Ray worker; the GPU image, which has no Optuna or
    SQLAlchemy) reads the trial's vocabulary (``studies.trials``) without loading the storage."""
    code = ("import sys, workers.search.trial, workers.search.protocol, studies.trials; "
            "print(sorted(m for m in ('optuna', 'sqlalchemy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
