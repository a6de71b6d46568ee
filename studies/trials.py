"""What a trial is in words, with no Optuna, SQLAlchemy or torch: the user-attr keys a trial
records, its status, the study's direction and the typed ``TrialRecord``. The search's trials
(Ray workers, the GPU image) import this module; ``studies.records`` writes and reads it through
Optuna."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from arch import ArchConfig, kv_cache_bytes

__all__ = [
    "ARCH",
    "ARCH_ID",
    "CHECKPOINT",
    "CHECKPOINT_STEP",
    "DUPLICATE_OF",
    "ERROR",
    "KV_CACHE",
    "KV_CACHE_DTYPE",
    "MACHINE_FAILURES",
    "NODE",
    "NOT_TRAINED",
    "OLD_KV_DTYPE",
    "PARAMS_TOTAL",
    "PARAMS_TRAINABLE",
    "PREDICTED_ERROR",
    "RECORD_SCHEMA",
    "RESTARTS",
    "RESUMED",
    "SEED",
    "STATUS",
    "STEPS_REACHED",
    "STUDY_ATTRS",
    "TOKENS_PER_S",
    "TRIAL_ATTRS",
    "VAL_LOSS",
    "VAL_LOSS_SE",
    "WARM_START_FROM",
    "WARM_START_TRIAL",
    "Direction",
    "TrialRecord",
    "TrialStatus",
]

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
