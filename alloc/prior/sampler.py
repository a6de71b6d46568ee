"""``PriorSampler``: an Optuna sampler that searches a space's points with a prior that learns.

On Optuna's public ``BaseSampler`` API, so it works with stock ``study.optimize`` as well as under
``python -m workers.search --sampler prior``::

    from alloc.settings import PlanSettings
    from alloc.prior.sampler import PriorSampler
    from search_spaces import load_space

    space = load_space("heads_vs_dim.yaml")
    sampler = PriorSampler.for_space(space, PlanSettings(budget=256, layers=1, kernel="ngram:4",
                                                         input_dim=64, seq_len=64))
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda trial: objective(*space.sample(trial, io)), n_trials=20)

How it picks the next point (docs/theory.md §11 gives the reasons):

1. The first trial is the prior's mode (the allocator's own answer among the space's points).
2. Afterwards, with probability ``max(explore, 1 / (n + 1))`` (``n``: trials observed) a point
   uniformly at random (PriorBand's random share: a prior that is wrong everywhere still
   sees the rest of the space), else the point that maximises
   ``log l(x) - log g(x) + w log prior(x)``: ``l`` and ``g`` are kernel densities over the best
   quarter of the trials and the rest (TPE's density ratio; trials ASHA pruned rank below the
   completed ones, the later their last rung the higher, so a point stopped early counts as a
   bad one), and ``w = beta / n * trust`` is piBO's decaying prior weight, times ``trust``:
   the rank correlation (clipped at 0) between the prior and the trials' results. A prior the
   evidence contradicts stops steering (PriorBand's point: a misleading prior costs little).
3. No point is proposed twice while an untried one is left (finished and running points are
   excluded); numeric training ranges (a learning-rate range) are sampled at random.
4. With ``calibrate``, the bound's constants are re-fitted on the trials (``alloc.calibrate``)
   whenever the fully trained architectures grew by half since the last fit (from 4), and the
   prior is rebuilt from the calibrated bound. The study's user attrs record the prior
   (``prior``) and each set of constants with the trial it was first used for, the number of
   architectures it was fitted on and its R² (``calibration``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from alloc.calibrate import Observation, fit, with_constants
from alloc.constants import Constants
from alloc.errors import CalibrationError
from alloc.prior.bound import (
    DEFAULT_TEMPERATURE,
    Prior,
    allocator_prior,
    candidates,
    point_key,
)
from alloc.settings import PlanSettings
from search_spaces import SearchSpace

DEFAULT_BETA = 10.0  # piBO's beta: the prior's weight is beta / n after n trials
DEFAULT_EXPLORE = 0.1  # the least share of uniformly random points
GOOD_FRACTION = 0.25  # TPE's gamma: the best quarter of the trials make l(x)
KERNEL_SCALE = 1.0  # kernel exp(-scale * distance): one param fully changed weighs 0.37
MIN_CALIBRATION = 4  # 3 constants and the scale
REFIT_GROWTH = 1.5  # refit when the trained architectures grew by half since the last fit
PRIOR_ATTR, CALIBRATION_ATTR = "prior", "calibration"


@dataclass(frozen=True)
class Calibration:
    """How the allocator prior re-fits its constants: its plan inputs, spread and where its
    starting constants came from."""

    settings: PlanSettings
    temperature: float
    source: str = "the search's allocator inputs"
    plan: Mapping[str, Any] | None = None  # the allocator's answer in the space (ties)


@dataclass(frozen=True)
class Observed:
    """What the trials so far say about the candidates."""

    ranked: list[int]  # candidate of each finished trial, best first
    finished: set[int]
    busy: set[int]  # running or waiting (another trial's)
    proposed: bool  # any trial of the study matched a candidate
    losses: dict[int, float]  # best completed value per candidate (calibration)
    first_new: int  # the number of the trial being sampled


class PriorSampler(optuna.samplers.BaseSampler):
    """Prior-guided sampling over a space's points (see the module docstring)."""

    def __init__(self, prior: Prior, *, beta: float = DEFAULT_BETA,
                 explore: float = DEFAULT_EXPLORE, seed: int | None = None,
                 calibration: Calibration | None = None) -> None:
        if not beta >= 0 or not 0 <= explore <= 1:
            raise ValueError(f"beta {beta} must be >= 0 and explore {explore} in [0, 1]")
        self.prior, self.beta, self.explore, self.calibration = prior, beta, explore, calibration
        self._rng = np.random.default_rng(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._index = prior.candidates.index()
        kernel = np.exp(-KERNEL_SCALE * prior.candidates.distance)
        self._kernel, self._smoothing = kernel, float(kernel.mean())
        self._chosen: dict[tuple[str, int], int] = {}
        self._fitted_on = 0  # architectures of the last calibration
        self._lock = threading.Lock()
        self.seconds = 0.0  # time spent choosing points (the sampler's own cost)

    @classmethod
    def for_space(cls, space: SearchSpace, settings: PlanSettings, *,
                  temperature: float = DEFAULT_TEMPERATURE, beta: float = DEFAULT_BETA,
                  explore: float = DEFAULT_EXPLORE, seed: int | None = None,
                  calibrate: bool = True, constants: Constants | None = None,
                  source: str | None = None, plan: Mapping[str, Any] | None = None
                  ) -> PriorSampler:
        """The allocator's prior over ``space`` (``settings``: its inputs; ``constants``:
        start from these, e.g. another study's calibrated ones, named by ``source``; ``plan``:
        the allocator's plan as params of the space, kept among the candidates of a space too
        large to list, and the prior's mode where the bound cannot tell points apart)."""
        if constants is not None:
            settings = with_constants(settings, constants)
        cands = candidates(space, seed=seed or 0, include=[plan] if plan else [])
        calibration = Calibration(settings, temperature, source or "the search's allocator "
                                  "inputs", plan) if calibrate else None
        return cls(allocator_prior(cands, settings, temperature, plan=plan), beta=beta,
                   explore=explore, seed=seed, calibration=calibration)

    # --- Optuna's sampler API ---------------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if len(study.directions) > 1:
            raise ValueError("PriorSampler optimises one objective")
        with self._lock:
            start = time.perf_counter()
            observed = self._observe(study, trial.number)
            self._calibrate(study, observed)
            self._record_prior(study)
            self._chosen[(study.study_name, trial.number)] = self._choose(study, observed)
            self.seconds += time.perf_counter() - start

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        index = self._chosen.get((study.study_name, trial.number))
        if index is not None:
            params = self.prior.candidates.params[index]
            if param_name in params:
                value = params[param_name]
                if _contains(param_distribution, value):
                    return value
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        with self._lock:
            self._chosen.pop((study.study_name, trial.number), None)

    def __getstate__(self) -> dict[str, Any]:  # picklable, as Optuna's samplers are
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._random.reseed_rng()

    # --- choosing -----------------------------------------------------------------------------

    def _observe(self, study: optuna.Study, number: int) -> Observed:
        free = self.prior.candidates.free
        sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
        keyed: list[tuple[tuple[Any, ...], int]] = []
        finished, busy, proposed = set[int](), set[int](), False
        losses: dict[int, float] = {}
        for t in study.get_trials(deepcopy=False):
            index = self._index.get(point_key(t.params, free))
            if index is None or t.number == number:
                continue
            proposed = True
            if t.state in (TrialState.RUNNING, TrialState.WAITING):
                busy.add(index)
            elif t.state == TrialState.COMPLETE and t.value is not None:
                finished.add(index)
                keyed.append(((0, sign * t.value), index))
                losses[index] = min(losses.get(index, math.inf), t.value)
            elif t.state == TrialState.PRUNED:
                finished.add(index)
                keyed.append((_pruned_rank(t, sign), index))
        ranked = [i for _, i in sorted(keyed, key=lambda k: k[0])]
        return Observed(ranked, finished, busy, proposed, losses, number)

    def _choose(self, study: optuna.Study, observed: Observed) -> int:
        n_cands = len(self.prior.candidates)
        taken = observed.finished | observed.busy
        available = np.array([i for i in range(n_cands) if i not in taken])
        if available.size == 0:  # every point tried: repeat one not running (new free params)
            available = np.array([i for i in range(n_cands) if i not in observed.busy]
                                 or range(n_cands))
        n = len(observed.ranked)
        if n == 0 and not observed.proposed:
            return self.prior.mode(available, self._rng)
        if self._rng.random() < max(self.explore, 1.0 / (n + 2)):
            return int(self._rng.choice(available))
        if n < 2:  # one result tells good from bad nothing yet
            return self.prior.sample(available, self._rng)
        return self._best(available, self.acquisition(observed.ranked, available))

    def acquisition(self, ranked: list[int], available: np.ndarray) -> np.ndarray:
        """``log l - log g + w log prior`` of each ``available`` candidate, given the finished
        trials' candidates ``ranked`` best first."""
        n = len(ranked)
        good = max(1, round(GOOD_FRACTION * n))
        k = self._kernel[np.ix_(available, np.array(ranked))]
        lower = (k[:, :good].sum(1) + self._smoothing) / (good + 1)
        upper = (k[:, good:].sum(1) + self._smoothing) / (n - good + 1)
        weight = self.beta / n * self.trust(ranked)
        return np.log(lower) - np.log(upper) + weight * self.prior.log_prob[available]

    def trust(self, ranked: list[int]) -> float:
        """How far the trials bear the prior out: the Spearman correlation of prior and result
        over the finished trials, clipped at 0 (1 until three trials say otherwise)."""
        from scipy.stats import spearmanr  # 0.5 s to import: only once trials are told

        if len(ranked) < 3:
            return 1.0
        log_prob = self.prior.log_prob[np.array(ranked)]
        if np.ptp(log_prob) == 0:
            return 0.0  # the prior does not tell these trials apart
        rho = float(spearmanr(log_prob, -np.arange(len(ranked))).statistic)
        return max(0.0, rho) if math.isfinite(rho) else 0.0

    def _best(self, available: np.ndarray, score: np.ndarray) -> int:
        top = available[np.flatnonzero(score >= score.max() - 1e-12)]
        return int(self._rng.choice(top))

    # --- learning the constants ------------------------------------------------------------------

    def _calibrate(self, study: optuna.Study, observed: Observed) -> None:
        """Re-fit the bound's constants on the trained architectures and rebuild the prior."""
        calibration = self.calibration
        if calibration is None or study.direction != optuna.study.StudyDirection.MINIMIZE:
            return
        cands = self.prior.candidates
        best: dict[str, tuple[float, int]] = {}
        for index, loss in observed.losses.items():
            arch_id = cands.archs[index].arch_id
            if loss > 0 and loss < best.get(arch_id, (math.inf, -1))[0]:
                best[arch_id] = (loss, index)
        if len(best) < max(MIN_CALIBRATION, math.ceil(REFIT_GROWTH * self._fitted_on)):
            return
        observations = [Observation(cands.archs[i].describe(), cands.archs[i].layers[0], loss,
                                    i, 1) for loss, i in best.values()]
        try:
            _, fitted = fit(calibration.settings, observations)
        except CalibrationError:
            return
        self._fitted_on = len(best)
        settings = with_constants(calibration.settings, fitted.constants)
        self.prior = allocator_prior(cands, settings, calibration.temperature,
                                     self.prior.label, calibration.plan)
        _append(study, CALIBRATION_ATTR, {
            **fitted.constants.as_flags(), "from_trial": observed.first_new,
            "architectures": len(best), "r2": fitted.r2, "spearman": fitted.spearman,
            "source": "fitted on the study"})

    def _record_prior(self, study: optuna.Study) -> None:
        if PRIOR_ATTR in study.user_attrs:
            return
        study.set_user_attr(PRIOR_ATTR, {**self.prior.describe(), "beta": self.beta,
                                         "explore": self.explore})
        if self.calibration is not None:
            s = self.calibration.settings
            _append(study, CALIBRATION_ATTR, {
                "c_proj": s.c_proj, "c_head": s.c_head, "order": s.order,
                "width_order": s.width_order, "from_trial": 0,
                "architectures": 0, "r2": None, "spearman": None,
                "source": self.calibration.source})


def _pruned_rank(trial: FrozenTrial, sign: float) -> tuple[Any, ...]:
    """Pruned trials after completed ones: the later the rung they reached, the better, then by
    their value there."""
    if not trial.intermediate_values:
        return (2,)
    step = max(trial.intermediate_values)
    return (1, -step, sign * trial.intermediate_values[step])


def _contains(distribution: BaseDistribution, value: Any) -> bool:
    """Whether ``distribution`` can return ``value`` (an objective may ask a param with other
    choices than the space: then the point's value is not used)."""
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    if not isinstance(distribution, IntDistribution | FloatDistribution):
        return False
    if not isinstance(value, int | float) or not distribution.low <= value <= distribution.high:
        return False
    step = distribution.step
    return step is None or math.isclose((value - distribution.low) / step,
                                        round((value - distribution.low) / step))


def _append(study: optuna.Study, name: str, entry: dict[str, Any]) -> None:
    study.set_user_attr(name, [*study.user_attrs.get(name, []), entry])


