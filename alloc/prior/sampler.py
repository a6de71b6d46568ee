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

How it picks the next point (docs/theory.md §11 gives the reasons and what they assume):

1. Every proposal, the first included, is the prior's with probability ``share`` and random
   search's otherwise (PriorBand's mixture): a point drawn as ``RandomSampler`` draws (every
   decision uniform over its options) among the untried ones. ``share = (1 - explore) *
   belief``: ``belief`` is the probability that the prior orders results better than chance,
   ``START_BELIEF`` before two trials have finished, then updated by a likelihood ratio on the
   pairs of finished trials that the prior's density orders the same way as their results
   (``belief``). A wrong prior loses its share within a few trials, and the random share keeps
   searching, so it costs about ``sum share`` trials; a prior the results bear out gets up to
   ``1 - explore`` of the proposals.
2. The prior's proposal: while fewer than two trials have finished, its most probable untried
   point (its mode first); then the point that maximises
   ``log l(x) - log g(x) + w log prior(x)``: ``l`` and ``g`` are kernel densities over the best
   quarter of the trials and the rest (TPE's density ratio; trials ASHA pruned rank below the
   completed ones, the later their last rung the higher, so a point stopped early counts as a
   bad one), and ``w = beta / n * belief`` is piBO's decaying prior weight times the belief.
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
DEFAULT_EXPLORE = 0.1  # the least share of random search's proposals
START_BELIEF = 0.2  # P(the prior orders results better than chance) before any evidence
INFORMED = 0.75  # the share of pairs an informative prior orders as the results do
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
    losses: dict[int, float]  # best completed value per candidate (calibration)
    first_new: int  # the number of the trial being sampled


class PriorSampler(optuna.samplers.BaseSampler):
    """Prior-guided sampling over a space's points (see the module docstring)."""

    def __init__(self, prior: Prior, *, beta: float = DEFAULT_BETA,
                 explore: float = DEFAULT_EXPLORE, seed: int | None = None,
                 calibration: Calibration | None = None,
                 start_belief: float = START_BELIEF) -> None:
        if not beta >= 0 or not 0 <= explore <= 1 or not 0 < start_belief < 1:
            raise ValueError(f"beta {beta} must be >= 0, explore {explore} in [0, 1] and "
                             f"start_belief {start_belief} in (0, 1)")
        self.prior, self.beta, self.explore, self.calibration = prior, beta, explore, calibration
        self.start_belief = start_belief
        self._rng = np.random.default_rng(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._index = prior.candidates.index()
        kernel = np.exp(-KERNEL_SCALE * prior.candidates.distance)
        self._kernel, self._smoothing = kernel, float(kernel.mean())
        self._chosen: dict[tuple[str, int], int] = {}
        self._finished: dict[tuple[str, int], int | None] = {}  # (study, trial) -> candidate
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
        finished, busy = set[int](), set[int]()
        losses: dict[int, float] = {}
        for t in study.get_trials(deepcopy=False):
            index = self._candidate_of(study, t, free)
            if index is None or t.number == number:
                continue
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
        return Observed(ranked, finished, busy, losses, number)

    def _candidate_of(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                      free: frozenset[str]) -> int | None:
        """The candidate ``trial`` is (None: none), kept once the trial has finished: its
        params no longer change, and recomputing every trial's key at every proposal made a
        search of n trials cost n^2 keys (2,000 proposals: 2 million, 20 s)."""
        if not trial.state.is_finished():  # a running trial may still be choosing its params
            return self._index.get(point_key(trial.params, free))
        key = (study.study_name, trial.number)
        if key not in self._finished:
            self._finished[key] = self._index.get(point_key(trial.params, free))
        return self._finished[key]

    def _choose(self, study: optuna.Study, observed: Observed) -> int:
        n_cands = len(self.prior.candidates)
        taken = observed.finished | observed.busy
        available = np.array([i for i in range(n_cands) if i not in taken])
        if available.size == 0:  # every point tried: repeat one not running (new free params)
            available = np.array([i for i in range(n_cands) if i not in observed.busy]
                                 or range(n_cands))
        belief = self.belief(observed.ranked)
        if self._rng.random() >= (1.0 - self.explore) * belief:
            chance = self.prior.candidates.chance[available]
            return int(self._rng.choice(available, p=chance / chance.sum()))
        if len(observed.ranked) < 2:  # one result tells good from bad nothing yet
            return self.prior.mode(available, self._rng)
        return self._best(available, self.acquisition(observed.ranked, available, belief))

    def acquisition(self, ranked: list[int], available: np.ndarray, belief: float
                    ) -> np.ndarray:
        """``log l - log g + w log prior`` of each ``available`` candidate, given the finished
        trials' candidates ``ranked`` best first and the prior's ``belief``."""
        n = len(ranked)
        good = max(1, round(GOOD_FRACTION * n))
        k = self._kernel[np.ix_(available, np.array(ranked))]
        lower = (k[:, :good].sum(1) + self._smoothing) / (good + 1)
        upper = (k[:, good:].sum(1) + self._smoothing) / (n - good + 1)
        weight = self.beta / n * belief
        return np.log(lower) - np.log(upper) + weight * self.prior.log_prob[available]

    def belief(self, ranked: list[int]) -> float:
        """The probability that the prior orders results better than chance, given the finished
        trials' candidates ``ranked`` best first (``prior_belief``)."""
        return prior_belief(self.prior.log_prob[np.array(ranked, dtype=int)],
                            self.start_belief)

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
                                         "explore": self.explore,
                                         "start_belief": self.start_belief,
                                         "informed": INFORMED})
        if self.calibration is not None:
            s = self.calibration.settings
            _append(study, CALIBRATION_ATTR, {
                "c_proj": s.c_proj, "c_head": s.c_head, "order": s.order,
                "width_order": s.width_order, "from_trial": 0,
                "architectures": 0, "r2": None, "spearman": None,
                "source": self.calibration.source})


def prior_belief(log_prob: np.ndarray, start: float = START_BELIEF,
                 informed: float = INFORMED) -> float:
    """P(the prior is informative) after the finished trials whose prior log-densities are
    ``log_prob``, best result first (docs/theory.md §11).

    Two hypotheses: the prior orders a pair of results as they are with probability
    ``informed`` (it is informative) or 1/2 (it is not). Of the pairs the prior tells apart,
    ``kappa`` are ordered as the results; they count as ``n - 1`` pairs' worth of evidence
    (the pairs of ``n`` trials are not independent), so the odds ``start / (1 - start)`` are
    multiplied by ``(2 informed)^(e kappa) (2 - 2 informed)^(e (1 - kappa))`` with
    ``e = (n - 1) * (pairs told apart) / (all pairs)``."""
    n = len(log_prob)
    if n < 2:
        return start
    later = np.triu(np.ones((n, n), dtype=bool), 1)  # (n, n): i ranked above j
    gap = (log_prob[:, None] - log_prob[None, :])[later]
    agree, disagree = int((gap > 0).sum()), int((gap < 0).sum())
    if agree + disagree == 0:
        return start  # the prior does not tell these trials apart
    evidence = (n - 1) * (agree + disagree) / (n * (n - 1) / 2)
    kappa = agree / (agree + disagree)
    log_ratio = evidence * (kappa * math.log(2 * informed)
                            + (1 - kappa) * math.log(2 - 2 * informed))
    logit = math.log(start / (1 - start)) + log_ratio
    return 0.5 * (1 + math.tanh(logit / 2))  # the logistic of the log-odds, without overflow


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


