"""The mapping between an Optuna trial and our record of a candidate architecture.

Trial params are the flat per-layer fields of ``arch.codec`` (``L0.attention``,
``L0.g0.count``, ...; fields at their default are left out, since Optuna writes each param with
three queries). Trial user attrs hold the whole ``ArchConfig`` JSON of the trained model and
its measurements; study user attrs describe the search.
"""

# ruff: noqa: F405 (the names of studies.trials, imported whole below)
from __future__ import annotations

import json
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from arch import ATTENTION_KINDS, ROLES, ArchConfig, codec, kv_cache_bytes, param_count

# The trial's vocabulary (no Optuna) is studies.trials'; this module writes and reads it through
# Optuna, and the queries read it from here too (its __all__ names every one).
from studies.trials import *  # noqa: F403

_CHOICES: dict[str, tuple[str, ...]] = {"attention": ATTENTION_KINDS, "role": ROLES}


def fixed_distributions(params: Mapping[str, Any]) -> dict[str, BaseDistribution]:
    """Distributions for params that were not sampled (recorded or enqueued trials).

    Numbers get one-point ranges (Optuna allows ranges to differ between trials); categorical
    params get the vocabulary's full choices, since Optuna requires those to stay fixed.
    """
    dists: dict[str, BaseDistribution] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            dists[key] = CategoricalDistribution((False, True))
        elif isinstance(value, str):
            field_name = key.rsplit(".", 1)[-1]
            dists[key] = CategoricalDistribution(_CHOICES.get(field_name, (value,)))
        elif isinstance(value, int):
            dists[key] = IntDistribution(value, value)
        else:
            dists[key] = FloatDistribution(float(value), float(value))
    return dists


def trial_attrs(arch: ArchConfig, *, predicted_error: float | None = None,
                tokens_per_s: float | None = None, steps_reached: int | None = None,
                status: TrialStatus | None = None, kv_dtype: str = "float32") -> dict[str, Any]:
    """The user attrs of a trial evaluating ``arch``, trained in ``kv_dtype`` (what its KV
    cache is counted in: ``arch.memory.training_dtype`` of the trial's device)."""
    count = param_count(arch)
    return {ARCH: arch.to_json(), ARCH_ID: arch.arch_id, PARAMS_TRAINABLE: count.trainable,
            PARAMS_TOTAL: count.total, PREDICTED_ERROR: predicted_error,
            TOKENS_PER_S: tokens_per_s, STEPS_REACHED: steps_reached,
            STATUS: None if status is None else str(status),
            KV_CACHE: kv_cache_bytes(arch, kv_dtype), KV_CACHE_DTYPE: kv_dtype}


def read_arch(trial: FrozenTrial) -> ArchConfig:
    """The ``ArchConfig`` recorded on ``trial``."""
    return ArchConfig.from_json(trial.user_attrs[ARCH])


def add_record(study: optuna.Study, arch: ArchConfig, value: float | None, *,
               state: TrialState = TrialState.COMPLETE, curve: Mapping[int, float] | None = None,
               extra_params: Mapping[str, Any] | None = None, **attrs: Any) -> None:
    """Write a finished trial for ``arch`` through Optuna (``study.add_trial``)."""
    params = {**codec.encode(arch), **(extra_params or {})}
    trial = optuna.trial.create_trial(
        state=state, value=value if state == TrialState.COMPLETE else None, params=params,
        distributions=fixed_distributions(params), user_attrs=trial_attrs(arch, **attrs),
        intermediate_values=dict(curve or {}))
    study.add_trial(trial)


def code_version() -> str:
    """Package version plus the git commit when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        base = version("transformer-alloc")
    except PackageNotFoundError:
        base = "unknown"
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{base}+{commit}" if commit else base


def study_attrs(*, task: str, metric: str, space_name: str = "", space_hash: str = "",
                alloc_inputs: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """What a later reader needs to interpret a study (``extra``: more attributes)."""
    return {"task": task, "metric": metric, "space_name": space_name, "space_hash": space_hash,
            "alloc_inputs": json.dumps(dict(alloc_inputs or {})),
            "code_version": code_version(), "record_schema": RECORD_SCHEMA, **extra}


def set_study_attrs(study: optuna.Study, **attrs: Any) -> None:
    """Describe the search on the study (``study_attrs``) and name its objective after the
    task's metric (a multi-objective study's others after ``other_metrics``), so the stock
    ``optuna`` CLI and optuna-dashboard show them."""
    values = study_attrs(**attrs)
    for key, value in values.items():
        study.set_user_attr(key, value)
    with warnings.catch_warnings():  # "experimental" since Optuna 3.2, and what we want
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([values["metric"], *values.get("other_metrics", ())])
