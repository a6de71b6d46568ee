"""``ModePrior``: an Optuna sampler whose prior's mode is the allocator's plan, for spaces too
large to list (a student's per-layer widths: ``search_spaces/students/``).

Each parameter is drawn on its own. With probability ``weight(n)`` (``n`` finished trials) from
the prior: over a parameter's ordered choices, ``P(k) ~ exp(-|k - mode| / temperature)``, the
plan's value the most probable and its neighbours next; otherwise from ``fallback`` (Optuna's
multi-objective TPE, random while it has too few trials). The prior's weight decays as piBO's,
``min(1, beta / (n + 1))``, so the evidence takes over: the plan is where the search starts
looking, not where it must stay.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

DEFAULT_BETA = 4.0  # the prior's weight is min(1, beta / (n + 1)) after n finished trials
DEFAULT_SPREAD = 1.0  # the prior's temperature, in steps between neighbouring choices


class ModePrior(optuna.samplers.BaseSampler):
    """Independent draws around ``modes`` (parameter -> the plan's value), decaying into
    ``fallback`` (default: TPE with the constant liar, seeded)."""

    def __init__(self, modes: Mapping[str, Any], *, temperature: float = DEFAULT_SPREAD,
                 beta: float = DEFAULT_BETA, seed: int = 0,
                 fallback: optuna.samplers.BaseSampler | None = None) -> None:
        self.modes, self.temperature, self.beta = dict(modes), temperature, beta
        self.seed = seed
        self.rng = random.Random(seed)
        self.fallback = fallback or optuna.samplers.TPESampler(seed=seed, constant_liar=True)

    def weight(self, finished: int) -> float:
        """The prior's share of the draws after ``finished`` trials."""
        return min(1.0, self.beta / (finished + 1))

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        finished = len(study.get_trials(deepcopy=False,
                                        states=(TrialState.COMPLETE, TrialState.PRUNED)))
        mode = self.modes.get(param_name)
        if (isinstance(param_distribution, CategoricalDistribution) and mode is not None
                and self.rng.random() < self.weight(finished)):
            return self.draw(list(param_distribution.choices), mode)
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def draw(self, choices: list[Any], mode: Any) -> Any:
        """One choice, ``exp(-|k - k_mode| / temperature)``-weighted (the nearest choice to
        ``mode`` stands for it when it is not one)."""
        centre = min(range(len(choices)), key=lambda k: abs(float(choices[k]) - float(mode)))
        weights = [math.exp(-abs(k - centre) / self.temperature) for k in range(len(choices))]
        return self.rng.choices(choices, weights)[0]

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.fallback.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.rng = random.Random()
        self.fallback.reseed_rng()
