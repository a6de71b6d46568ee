"""common.stats: intervals against the t distribution by hand, Welch's and the paired test
against SciPy's, and the verdict on points built to be inside or outside the noise."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as scipy_stats

from common.stats import (
    Interval,
    holm,
    interval,
    kth_best,
    noise,
    not_worse,
    not_worse_than_kth,
    paired,
    sd,
    worse_p,
)


def test_interval_is_the_student_t_interval_by_hand() -> None:
    values = [1.0, 1.2, 0.9, 1.1]
    m = sum(values) / 4
    s = math.sqrt(sum((v - m) ** 2 for v in values) / 3)
    half = scipy_stats.t.ppf(0.975, 3) * s / 2  # sqrt(4) = 2
    got = interval(values)
    assert got == Interval(pytest.approx(m), pytest.approx(m - half), pytest.approx(m + half), 4)
    assert half == pytest.approx(3.182446 * s / 2, rel=1e-6)  # t(0.975, 3) from a table
    assert got.half_width == pytest.approx(half)
    assert interval(values, confidence=0.5).half_width < half
    assert "± " in got.describe() and "4 seeds" in got.describe()


def test_one_seed_has_no_interval() -> None:
    one = interval([2.5])
    assert one.mean == 2.5 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert "no interval" in one.describe()
    with pytest.raises(ValueError):
        interval([])


def test_welch_p_value_is_scipys() -> None:
    a, b = [1.30, 1.34, 1.29, 1.36], [1.25, 1.27, 1.31]
    expected = scipy_stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    assert worse_p(a, b) == pytest.approx(expected)
    assert worse_p(b, a) == pytest.approx(1 - expected)
    assert worse_p([1.0], b) is None and worse_p(a, [1.0]) is None
    assert worse_p([2.0, 2.0], [1.0, 1.0]) == 0.0 and worse_p([1.0, 1.0], [1.0, 1.0]) == 1.0


def test_a_point_three_standard_errors_worse_is_excluded_one_within_noise_kept() -> None:
    # Five seeds each with the same spread: offsets give each point's SD; its SE = SD/sqrt(5).
    offsets = [-0.02, -0.01, 0.0, 0.01, 0.02]
    spread = sd(offsets)
    se_diff = math.sqrt(2 * spread**2 / 5)  # the standard error of a difference of two means

    def point(centre: float) -> list[float]:
        return [centre + o for o in offsets]

    losses = {"best": point(1.00), "ref": point(1.01), "near": point(1.01 + 0.5 * se_diff),
              "far": point(1.01 + 3 * se_diff), "better": point(0.98)}
    verdict = not_worse(losses, "ref")
    assert verdict.not_worse == {"best", "ref", "near", "better"}
    assert verdict.p_worse["far"] is not None and verdict.p_worse["far"] < 0.05
    assert verdict.p_worse["near"] is not None and verdict.p_worse["near"] > 0.05
    assert verdict.p_worse["ref"] is None
    # k-th best by mean: better (0.98), best (1.00), ref (1.01), ...
    assert kth_best({k: sum(v) / 5 for k, v in losses.items()}, 3) == "ref"
    assert not_worse_than_kth(losses, 3) == verdict
    with pytest.raises(ValueError, match="k = 6"):
        kth_best({"a": 1.0}, 6)


def test_one_seed_falls_back_to_the_means() -> None:
    """With a single seed on either side nothing can be tested: a point is kept only if its
    mean is no higher than the reference's (the rank rule)."""
    losses = {"ref": [1.0, 1.1], "lone_better": [0.9], "lone_worse": [1.2]}
    verdict = not_worse(losses, "ref")
    assert verdict.not_worse == {"ref", "lone_better"}
    assert verdict.p_worse["lone_worse"] is None
    single = not_worse({"a": [1.0], "b": [1.0001]}, "a")
    assert single.not_worse == {"a"}


def test_noise_pools_the_seeds_and_averages_the_evaluations() -> None:
    summary = noise({"a": [1.0, 1.2], "b": [2.0, 2.4], "c": [3.0]}, [0.01, 0.03])
    assert summary.points == 2
    assert summary.seed_sd == pytest.approx(math.sqrt((0.02 + 0.08) / 2))
    assert summary.eval_se == pytest.approx(0.02)
    assert summary.ratio == pytest.approx(0.02 / summary.seed_sd)
    assert summary.describe() == f"seed SD {summary.seed_sd:.4f}, eval SE 0.0200 " \
                                 f"({summary.ratio:.2f}x)"
    assert math.isnan(noise({"a": [1.0]}, []).ratio)


def test_the_paired_test_is_scipys_and_pairing_removes_the_shared_noise() -> None:
    reference = [2.0, 2.5, 1.8, 2.2]  # seeds that move both sides together
    values = [r + d for r, d in zip(reference, [0.011, 0.009, 0.012, 0.010])]
    got = paired(values, reference)
    want = scipy_stats.ttest_rel(values, reference, alternative="greater")
    assert got.p_worse == pytest.approx(want.pvalue)
    assert got.difference == interval([v - r for v, r in zip(values, reference)])
    assert got.p_worse is not None and got.p_worse < 0.001  # significantly worse, paired ...
    unpaired = worse_p(values, reference)
    assert unpaired is not None and unpaired > 0.4  # ... and lost in the seeds' spread if not
    better = paired(reference, values)
    assert better.p_worse is not None and better.p_worse > 0.999 and better.difference.high < 0


def test_paired_edge_cases() -> None:
    assert paired([1.0], [0.5]).p_worse is None  # one pair: no spread to test with
    assert paired([1.5, 2.5], [1.0, 2.0]).p_worse == 0.0  # every pair 0.5 higher
    assert paired([1.0, 1.1], [1.0, 1.1]).p_worse == 1.0
    with pytest.raises(ValueError, match="1 against 2"):
        paired([1.0], [1.0, 2.0])


def holm_rejects(ps: list[float], alpha: float) -> set[int]:
    """Holm's procedure as he states it: test the smallest p at alpha / m, the next at
    alpha / (m - 1), ..., and stop at the first that fails."""
    rejected: set[int] = set()
    for rank, (p, k) in enumerate(sorted((p, k) for k, p in enumerate(ps))):
        if p > alpha / (len(ps) - rank):
            break
        rejected.add(k)
    return rejected


def test_holm_adjusts_as_the_step_down_procedure_rejects() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.012, None, 0.3]) == pytest.approx([0.024, None, 0.3])  # None: not tested
    rng = random.Random(3)
    for _ in range(300):
        ps = [rng.random() ** 3 for _ in range(rng.randint(1, 15))]
        adjusted = holm(ps)
        for alpha in (0.01, 0.05, 0.2):
            assert {k for k, a in enumerate(adjusted) if a is not None and a <= alpha} == (
                holm_rejects(ps, alpha))
