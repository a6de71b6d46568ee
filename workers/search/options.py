"""How a search runs, besides what it searches: ``SearchOptions``, and the training of a
``--smoke-test`` search (``training_budget``). Light to import (no Optuna, no torch), so that
the command's flags take their defaults from here without loading the driver."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alloc import DEFAULT_TEMPERATURE
from arch import SMOKE_TRIAL

if TYPE_CHECKING:
    from search_spaces import SearchSpace

DEFAULT_TRIALS = 20  # trials in a study when neither --trials nor a grid says how many


@dataclass(frozen=True)
class SearchOptions:
    """How a search runs, besides what it searches (all have working defaults)."""

    scheduler: str = "asha"  # asha stops bad trials early; fifo trains every trial fully
    seed: int = 0  # sampler and model seed
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0  # fractions share a GPU; > 0 trains on CUDA
    max_concurrent: int | None = None
    address: str | None = None  # Ray cluster: auto or ray://host:port; None: local Ray
    storage_path: Path = Path("ray_results")  # Ray's experiment directory
    heartbeat_interval: int = 10
    grace_period: int = 60  # a driver silent this long is dead: its lease can be taken
    storage_patience: int = 60  # seconds a lost database connection is retried
    reuse_actors: bool = True
    checkpoints: bool = True  # a checkpoint per evaluation: trials resume mid-way after faults
    profile: Path | None = None  # allocator inputs measured from the data (workers.profile)
    sampler: str | None = None  # tpe | random | grid | prior; None: the space's
    prior_temperature: float = DEFAULT_TEMPERATURE  # the prior's spread (--sampler prior)
    warm_start: str | None = None  # a study of the same database to start from
    quiet: bool = False  # no progress on stderr (the estimate, one line per finished trial)
    # Only these points of a finite space, as params, in this order (e.g. a grid's finalists);
    # the search's trials default to their number. Empty: the sampler's starting points.
    points: tuple[Mapping[str, Any], ...] = ()


def training_budget(space: SearchSpace, smoke_test: bool = False,
                    steps: int | None = None) -> SearchSpace:
    """``space`` at smoke size (``SMOKE_TRIAL``) and/or with ``steps`` per trial."""
    if smoke_test:
        space = space.with_train(**SMOKE_TRIAL)
    if steps:
        space = space.with_train(steps=steps, eval_every=min(int(space.fixed_train(
            "eval_every")), steps))
    return space
