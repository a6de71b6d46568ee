"""The mapping between an Optuna trial and our record of a candidate architecture.

Trial params are the flat per-layer fields of ``arch.codec`` (``L0.attention``,
``L0.g0.count``, ...; fields at their default are left out, since Optuna writes each param with
three queries). Trial user attrs hold the whole ``ArchConfig`` JSON of the trained model and
its measurements; study user attrs describe the search.
"""

from __future__ import annotations

import enum
import json
import math
import subprocess
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from arch import ATTENTION_KINDS, ROLES, ArchConfig, codec, param_count
from arch.memory import kv_cache_bytes

# Trial user attributes written for every trial.
ARCH, ARCH_ID = "arch", "arch_id"
PARAMS_TRAINABLE, PARAMS_TOTAL = "params_trainable", "params_total"
PREDICTED_ERROR, TOKENS_PER_S = "predicted_error", "tokens_per_s"
STEPS_REACHED, STATUS, ERROR = "steps_reached", "status", "error"
# The keys and values a decoder of the trial's model caches per token, in bytes at the dtype the
# trial trained in (``kv_cache_dtype``: bfloat16 on CUDA, float32 on CPU). Trials recorded
# before it existed lack both; queries compute them from the architecture (at float32).
KV_CACHE, KV_CACHE_DTYPE = "kv_cache", "kv_cache_dtype"
# The validation loss of a trained trial and its standard error over the evaluation's batches
# (the evaluation's noise, ``workers.training.trainer.Evaluation``), when it reported them; not in
# TRIAL_ATTRS: records added by hand and older trials lack them.
VAL_LOSS, VAL_LOSS_SE = "val_loss", "val_loss_se"
TRIAL_ATTRS = (ARCH, ARCH_ID, PARAMS_TRAINABLE, PARAMS_TOTAL, PREDICTED_ERROR, TOKENS_PER_S,
               STEPS_REACHED, STATUS, KV_CACHE, KV_CACHE_DTYPE)
# Written by the search when it tells a trial: the Ray node that ran it, the step a restarted
# trial continued from, Ray's in-place restarts after its worker died.
NODE, RESUMED, RESTARTS = "node", "resumed_from", "restarts"
# The trial's last checkpoint directory and its step (a retry continues from it).
CHECKPOINT, CHECKPOINT_STEP = "checkpoint", "checkpoint_step"
DUPLICATE_OF = "duplicate_of"  # a proposal not trained: the number of its finished twin
WARM_START_FROM = "warm_start_from"  # copied from this study (--warm-start)
WARM_START_TRIAL = "warm_start_trial"  # ... where it was this trial
SEED = "seed"  # an enqueued starting point's origin: allocator, grid, untried, ...
# Study user attributes.
STUDY_ATTRS = ("task", "metric", "space_name", "space_hash", "alloc_inputs", "code_version",
               "record_schema")
# Version of what a trial records. 2: the architecture is the task-fitted one that was trained
# (its vocabulary, input/output and length) and the parameter counts are that model's. Studies
# without it were written by code that recorded a placeholder's counts.
RECORD_SCHEMA = 2

_CHOICES: dict[str, tuple[str, ...]] = {"attention": ATTENTION_KINDS, "role": ROLES}


class TrialStatus(enum.StrEnum):
    """What happened to a trial, in words (its user attr ``status``; a ``str`` whose value is
    what the database holds). A trial reports ``running`` at each evaluation and ``failed``
    when its training raised or diverged; the search records the rest when it tells the study.
    The search as a whole ends ``completed``, ``interrupted`` (Ctrl-C), ``terminated``
    (SIGTERM) or ``stopped`` (a full results disk)."""

    RUNNING = "running"
    COMPLETED = "completed"  # trained to the full budget: COMPLETE
    STOPPED = "stopped"  # stopped early by the scheduler: PRUNED
    FAILED = "failed"  # raised, diverged or reported no finite metric: FAIL
    DUPLICATE = "duplicate"  # the same point as a finished trial: not trained, not counted
    ORPHAN = "orphan"  # asked as a connection dropped, then asked again: not trained
    RAY_FAILED = "ray_failed"  # Ray failed it (its worker died, ...): retried, not counted
    DISK_FULL = "disk_full"  # the results disk was full: --resume retries it, not counted
    INTERRUPTED = "interrupted"  # the search was interrupted while it ran (Ctrl-C, a dead driver)
    TERMINATED = "terminated"  # the search was terminated (SIGTERM) while it ran

    @classmethod
    def read(cls, value: Any) -> TrialStatus | str | None:
        """The status a database holds (None: none recorded); a word this code does not know
        (written by hand, or by other code) is kept as it was read."""
        if value is None:
            return None
        try:
            return cls(value)
        except ValueError:
            return str(value)


NOT_TRAINED = (TrialStatus.DUPLICATE, TrialStatus.ORPHAN)  # recorded but never trained
# Failed for the machine, not for the point: ``--resume`` retries them, and they do not count.
MACHINE_FAILURES = (TrialStatus.RAY_FAILED, TrialStatus.DISK_FULL)


class Direction(enum.StrEnum):
    """Which way the study's objective improves; its value is Optuna's word (``create_study(
    direction=...)``), ``mode`` Ray Tune's."""

    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"

    @classmethod
    def of(cls, higher_is_better: bool) -> Direction:
        """The direction of a task's metric."""
        return cls.MAXIMIZE if higher_is_better else cls.MINIMIZE

    @classmethod
    def from_storage(cls, name: str | None) -> Direction:
        """The direction Optuna's tables hold (``StudyDirection`` names; none: minimize)."""
        return cls.MAXIMIZE if str(name).upper() == "MAXIMIZE" else cls.MINIMIZE

    @property
    def mode(self) -> Literal["min", "max"]:
        """Ray Tune's word for it."""
        return "max" if self is Direction.MAXIMIZE else "min"

    @property
    def worst(self) -> float:
        """The value no trial can do worse than."""
        return -math.inf if self is Direction.MAXIMIZE else math.inf

    def better(self, value: float, than: float) -> bool:
        """Whether ``value`` strictly beats ``than``."""
        return self.rank(value) < self.rank(than)

    def rank(self, value: float) -> float:
        """A sort key of values: the better, the lower."""
        return -value if self is Direction.MAXIMIZE else value


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a study, typed: Optuna's number, state and value with the user attrs that
    describe it. The search writes the measured part when it tells the trial (``told_attrs``,
    from the trial's last report); the queries read it back (``from_attrs``), with ``arch``
    and ``train`` only for the trials they return. Every field but the first four may be
    missing from a trial: None."""

    trial_id: int | None  # the storage's id (None: a trial being told)
    number: int
    state: str  # Optuna's state name: COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None
    status: TrialStatus | str | None = None  # a word this code does not know: as read
    steps_reached: int | None = None
    tokens_per_s: float | None = None
    val_loss: float | None = None
    # the evaluation's noise (``workers.training.trainer.Evaluation``)
    val_loss_se: float | None = None
    node: str | None = None
    resumed_from: int | None = None
    restarts: int | None = None
    error: str | None = None
    arch_id: str | None = None
    params_trainable: int | None = None
    params_total: int | None = None
    predicted_error: float | None = None
    kv_bytes: int | None = None  # ``KV_CACHE`` as recorded (``kv_cache`` fills older trials)
    kv_dtype: str | None = None  # ``KV_CACHE_DTYPE`` as recorded
    arch: ArchConfig | None = None
    train: Mapping[str, Any] = field(default_factory=dict)  # sampled training fields

    @classmethod
    def from_attrs(cls, trial_id: int | None, number: int, state: str,
                   value: float | None, attrs: Mapping[str, Any],
                   arch: ArchConfig | None = None) -> TrialRecord:
        """The record of a trial from its user attrs (any subset of them)."""
        typed: dict[str, Any] = {name: attrs.get(key) for name, key in _FIELD_KEYS.items()}
        return cls(trial_id, number, state, value, arch=arch,
                   status=TrialStatus.read(attrs.get(STATUS)), **typed)

    def told_attrs(self) -> dict[str, Any]:
        """What telling the trial records (None: left unwritten)."""
        values = {key: getattr(self, name) for name, key in _FIELD_KEYS.items() if key in _TOLD}
        values[STATUS] = None if self.status is None else str(self.status)
        return values

    @property
    def kv_cache(self) -> int | None:
        """KV cache bytes per token: as recorded, else (a trial recorded before it was) from
        the architecture at ``kv_cache_dtype``; None when neither is known."""
        if self.kv_bytes is not None or self.arch is None:
            return self.kv_bytes
        return kv_cache_bytes(self.arch, self.kv_cache_dtype)

    @property
    def kv_cache_dtype(self) -> str:
        """The dtype ``kv_cache`` counts in (float32 for trials that did not record one)."""
        return str(self.kv_dtype or OLD_KV_DTYPE)


OLD_KV_DTYPE = "float32"  # what a trial recorded without a KV cache is counted in
# The user attr of each field of ``TrialRecord`` read as it is stored (the status is parsed).
_FIELD_KEYS = {"steps_reached": STEPS_REACHED, "tokens_per_s": TOKENS_PER_S, "val_loss": VAL_LOSS,
               "val_loss_se": VAL_LOSS_SE, "node": NODE, "resumed_from": RESUMED,
               "restarts": RESTARTS, "error": ERROR, "arch_id": ARCH_ID,
               "params_trainable": PARAMS_TRAINABLE, "params_total": PARAMS_TOTAL,
               "predicted_error": PREDICTED_ERROR, "kv_bytes": KV_CACHE,
               "kv_dtype": KV_CACHE_DTYPE}
# What a trial's tell records (the rest is written when it is asked: ``trial_attrs``).
_TOLD = (STEPS_REACHED, TOKENS_PER_S, NODE, RESUMED, VAL_LOSS, VAL_LOSS_SE, RESTARTS, ERROR)


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
    task's metric, so the stock ``optuna`` CLI and optuna-dashboard show it."""
    values = study_attrs(**attrs)
    for key, value in values.items():
        study.set_user_attr(key, value)
    with warnings.catch_warnings():  # "experimental" since Optuna 3.2, and what we want
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([values["metric"]])
