"""How sure a measurement over seeds is: a point's mean and its 95% interval over seeds
(``interval``), the seeds' spread beside the evaluation's (``noise``), which points are not
significantly worse than a reference (``not_worse``, ``not_worse_than_kth``), a paired
difference over shared seeds (``paired``), and a family of tests read together (``holm``).

The rule of a verdict: a point is *not significantly worse* than the reference unless a
one-sided Welch t-test (unequal variances) rejects "its mean loss is no higher than the
reference's" at ``alpha`` (5%). With fewer than two seeds on either side there is no spread to
test with: the point is then not worse only if its mean is no higher than the reference's (the
plain rank rule). The reference itself is never worse than itself. SciPy's t distribution is
imported where it is used, so importing this module stays light.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

Key = TypeVar("Key", bound=Hashable)
ALPHA = 0.05  # the verdicts' significance level
CONFIDENCE = 0.95  # the intervals' coverage


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds and its two-sided Student-t interval (``low``, ``high``); with
    one seed the interval is unknown (NaN bounds)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def describe(self, digits: int = 4) -> str:
        """``1.2345 ± 0.0040 (3 seeds)``; ``1.2345 (1 seed, no interval)``."""
        if self.n < 2:
            return f"{self.mean:.{digits}f} ({self.n} seed, no interval)"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} ({self.n} seeds)"


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("the mean of no values")
    return math.fsum(values) / len(values)


def sd(values: Sequence[float]) -> float:
    """The sample standard deviation (n - 1); NaN with fewer than two values."""
    if len(values) < 2:
        return math.nan
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """``values``' mean and its Student-t interval: mean ± t(1 - (1 - confidence) / 2, n - 1)
    · sd / sqrt(n).

    Raises:
        ValueError: no values.
    """
    m, n = mean(values), len(values)
    if n < 2:
        return Interval(m, math.nan, math.nan, n)
    from scipy.stats import t

    half = float(t.ppf(1 - (1 - confidence) / 2, n - 1)) * sd(values) / math.sqrt(n)
    return Interval(m, m - half, m + half, n)


@dataclass(frozen=True)
class Noise:
    """The two noises of a table of points: the seeds' (how much a point's loss moves with the
    training seed) and the evaluation's (how much it moves with the validation windows)."""

    seed_sd: float  # the seeds' SD, pooled over the points: sqrt(mean of their variances)
    eval_se: float  # the mean standard error of one evaluation (NaN: none recorded)
    points: int  # the points with two seeds or more, pooled

    @property
    def ratio(self) -> float:
        """Evaluation noise over seed noise: well below 1 means the evaluation is not what
        decides a ranking."""
        return self.eval_se / self.seed_sd if self.seed_sd > 0 else math.nan

    def describe(self) -> str:
        """``seed SD 0.0040, eval SE 0.0007 (0.18x)``."""
        return f"seed SD {self.seed_sd:.4f}, eval SE {self.eval_se:.4f} ({self.ratio:.2f}x)"


def noise(losses: Mapping[Key, Sequence[float]], eval_se: Sequence[float]) -> Noise:
    """The seeds' SD pooled over the points of ``losses`` (per point, its losses over seeds;
    points with one seed add nothing), beside the mean of ``eval_se`` (each evaluation's
    standard error)."""
    variances = [sd(v) ** 2 for v in losses.values() if len(v) >= 2]
    seed_sd = math.sqrt(mean(variances)) if variances else math.nan
    return Noise(seed_sd, mean(eval_se) if eval_se else math.nan, len(variances))


def worse_p(values: Sequence[float], reference: Sequence[float]) -> float | None:
    """The one-sided Welch t-test's p-value of "``values``' mean is higher than
    ``reference``'s" (small: significantly worse, for a loss); None with fewer than two values
    on either side. Two constant samples: 0 if higher, else 1."""
    n1, n2 = len(values), len(reference)
    if n1 < 2 or n2 < 2:
        return None
    diff = mean(values) - mean(reference)
    a, b = sd(values) ** 2 / n1, sd(reference) ** 2 / n2
    if a + b == 0:
        return 0.0 if diff > 0 else 1.0
    from scipy.stats import t

    df = (a + b) ** 2 / (a**2 / (n1 - 1) + b**2 / (n2 - 1))  # Welch-Satterthwaite
    return float(t.sf(diff / math.sqrt(a + b), df))


@dataclass(frozen=True)
class Verdict(Generic[Key]):
    """Which points are not significantly worse than ``reference`` (``not_worse``)."""

    reference: Key
    alpha: float
    p_worse: Mapping[Key, float | None]  # ``worse_p`` against the reference, per point
    not_worse: frozenset[Key]


def not_worse(losses: Mapping[Key, Sequence[float]], reference: Key,
              alpha: float = ALPHA) -> Verdict[Key]:
    """The points of ``losses`` (per point, its losses over seeds) not significantly worse than
    ``reference`` (one of them), by the module's rule.

    Raises:
        KeyError: ``reference`` is not a point of ``losses``.
    """
    ref = losses[reference]
    p_worse = {k: None if k == reference else worse_p(v, ref) for k, v in losses.items()}

    def kept(key: Key) -> bool:
        p = p_worse[key]
        if p is None:  # the reference, or too few seeds to test: the means decide
            return key == reference or mean(losses[key]) <= mean(ref)
        return p >= alpha

    return Verdict(reference, alpha, p_worse, frozenset(k for k in losses if kept(k)))


def kth_best(means: Mapping[Key, float], k: int) -> Key:
    """The point of the ``k``-th lowest mean (1: the best); ties keep ``means``' order.

    Raises:
        ValueError: ``k`` is not in 1..len(means).
    """
    if not 1 <= k <= len(means):
        raise ValueError(f"k = {k}: must lie in 1..{len(means)}, the number of points")
    return sorted(means, key=means.__getitem__)[k - 1]


def not_worse_than_kth(losses: Mapping[Key, Sequence[float]], k: int,
                       alpha: float = ALPHA) -> Verdict[Key]:
    """The points not significantly worse than the ``k``-th best by mean (e.g. k = 6 of 25:
    the top quartile a point can be placed in, given the noise)."""
    return not_worse(losses, kth_best({p: mean(v) for p, v in losses.items()}, k), alpha)


@dataclass(frozen=True)
class Paired:
    """The paired difference ``values - reference`` (the same seeds, or windows, on both
    sides): its mean with its Student-t interval, and the one-sided paired t-test's p-value of
    "the mean difference is above 0" (small: ``values`` significantly higher, i.e. worse for a
    loss); ``p_worse`` is None with fewer than two pairs."""

    difference: Interval
    p_worse: float | None


def paired(values: Sequence[float], reference: Sequence[float],
           confidence: float = CONFIDENCE) -> Paired:
    """``values`` against ``reference`` pair by pair (Student, 1908: the t-test of the
    differences). Differences that are all equal give p 0 when above 0, else 1.

    Raises:
        ValueError: no pairs, or the two sides of different lengths.
    """
    if len(values) != len(reference):
        raise ValueError(f"paired values: {len(values)} against {len(reference)}; the pairs "
                         "need one value on each side")
    diff = [v - r for v, r in zip(values, reference)]
    at = interval(diff, confidence)
    if len(diff) < 2:
        return Paired(at, None)
    spread = sd(diff)
    if spread == 0:
        return Paired(at, 0.0 if at.mean > 0 else 1.0)
    from scipy.stats import t

    return Paired(at, float(t.sf(at.mean / (spread / math.sqrt(len(diff))), len(diff) - 1)))


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's (1979) step-down adjustment of one family's p-values, in their order (None: no
    test, outside the family): the smallest times m, the next times m - 1, and so on, each at
    least the one before it and at most 1. An adjusted p below ``ALPHA`` rejects its hypothesis
    with the chance of any false rejection in the family at most ``ALPHA``, whatever the tests'
    dependence. Read one by one at 5%, 13 tests of which none should reject make a false
    rejection in about half of such families (1 - 0.95^13)."""
    tested = sorted((p, k) for k, p in enumerate(ps) if p is not None)
    adjusted: list[float | None] = [None] * len(ps)
    running = 0.0
    for rank, (p, k) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[k] = running
    return adjusted


def paired_bootstrap(values: ArrayLike, reference: ArrayLike,
                     confidence: float = CONFIDENCE, resamples: int = 2000, seed: int = 0
                     ) -> tuple[float, float, float]:
    """The mean of ``values - reference``, paired element by element (the same windows scored
    by two models), and its percentile bootstrap interval (Efron, 1979): the pairs are
    resampled with replacement ``resamples`` times. Needs NumPy."""
    import numpy as np

    diff = np.asarray(values, dtype=float) - np.asarray(reference, dtype=float)
    if diff.size == 0:
        raise ValueError("a paired difference of no values")
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(resamples, diff.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(diff.mean()), float(low), float(high)
