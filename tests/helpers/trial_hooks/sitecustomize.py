"""Test-only hooks in a search's trials, for the tests that kill or fail them on purpose.

A test runs ``python -m workers.search`` with ``hooked_env(...)``: this folder first on
``PYTHONPATH``, so every Python process of that search (the driver, and the Ray workers, which
inherit its environment) imports this module at start-up as ``sitecustomize``. It then wraps
``workers.search.trial``'s ``build_trainer`` and ``train_trial`` as that module is imported
(before ``workers.search.tune`` binds ``train_trial``), reading:

* ``$TRANSFORMER_ALLOC_TEST_FAULTS``: a JSON list of ``{"kind": "raise" | "nan", "match":
  TEXT}``; a trial whose architecture JSON contains TEXT raises, or trains with a learning rate
  of 1e30 so that its weights and then its loss really become non-finite.
* ``$TRANSFORMER_ALLOC_TEST_PIDS``: a directory in which a trial's process writes an empty file
  ``<pid>-start`` when the trial starts and ``<pid>-<step>`` after each evaluation it reports,
  then waits while a file ``hold-start`` / ``hold-<step>`` exists there (at most
  ``HOLD_LIMIT`` seconds): a test finds the worker to kill, and kills it at a chosen moment.

The product holds no hook: nothing of it imports this, and without this folder on the path the
variables do nothing. Imported under its package name (by the tests, for ``hooked_env``) it
installs nothing. Standard library only at start-up: every process of the search runs it.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

FOLDER = Path(__file__).resolve().parent
FAULTS_ENV = "TRANSFORMER_ALLOC_TEST_FAULTS"
PIDS_ENV = "TRANSFORMER_ALLOC_TEST_PIDS"
HOLD_LIMIT = 120.0
TRIAL = "workers.search.trial"


def hooked_env(env: Mapping[str, str] | None = None,
               faults: Sequence[Mapping[str, str]] | None = None,
               pids: Path | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a search whose trials take these hooks."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(FOLDER), out.get("PYTHONPATH")) if p)
    if faults is not None:
        out[FAULTS_ENV] = json.dumps(list(faults))
    if pids is not None:
        out[PIDS_ENV] = str(pids)
    return out


def mark(moment: str) -> None:
    """The ``$TRANSFORMER_ALLOC_TEST_PIDS`` hook at ``moment`` (``start`` or a step)."""
    folder = os.environ.get(PIDS_ENV)
    if not folder:
        return
    (Path(folder) / f"{os.getpid()}-{moment}").touch()
    deadline = time.monotonic() + HOLD_LIMIT
    while (Path(folder) / f"hold-{moment}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def fault(arch_json: str) -> Mapping[str, str] | None:
    """The first ``$TRANSFORMER_ALLOC_TEST_FAULTS`` rule whose text ``arch_json`` contains."""
    rules: list[dict[str, str]] = json.loads(os.environ.get(FAULTS_ENV) or "[]")
    return next((rule for rule in rules if rule["match"] in arch_json), None)


def install(trial: ModuleType) -> None:
    """Wrap ``trial``'s (``workers.search.trial``) ``build_trainer`` with the faults and
    ``train_trial`` with the marks."""
    build, train = trial.build_trainer, trial.train_trial

    def build_trainer(job: Any, spec: Any, workdir: Path, callback: Any) -> Any:
        rule = fault(spec.arch.to_json())
        if rule is not None and rule["kind"] == "raise":
            raise RuntimeError(f"injected failure (architecture contains {rule['match']!r})")
        if rule is not None:  # "nan": the sampled fields' learning rate overridden
            spec = dataclasses.replace(spec, train={**spec.train, "lr": 1e30})
        return build(job, spec, workdir, callback)

    def train_trial(job: Any, spec: Any, report: Any, workdir: Path, node: str,
                    restore: Path | None = None) -> None:
        mark("start")

        def marked(result: Any, checkpoint: Path | None) -> None:
            report(result, checkpoint)
            if result.error is None:  # an evaluation (a failure's report is the trial's last)
                mark(str(result.step))

        train(job, spec, marked, workdir, node, restore)

    trial.build_trainer, trial.train_trial = build_trainer, train_trial


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Finds ``workers.search.trial`` as Python would, and installs the hooks once it ran."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != TRIAL:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            install(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if __name__ == "sitecustomize":  # at start-up, on PYTHONPATH; not when the tests import it
    sys.meta_path.insert(0, _InstallOnImport())
