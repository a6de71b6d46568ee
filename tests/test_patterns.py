"""Later layers' head counts from the distinct attention patterns a pilot measures
(docs/theory.md §4.1): the count, the rule, the torch measurement, and the plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alloc.plan import layer_bound, make_plan, report
from alloc.profiling.patterns import distinct_patterns, head_counts, later_head_count
from alloc.settings import PlanSettings
from arch import HeadGroup, LayerSpec
from common.errors import TransformerAllocError
from workers.pilot import head_similarity


@pytest.mark.parametrize("patterns", [1, 2, 3, 4, 8, 16])
def test_equal_groups_of_identical_disjoint_patterns_count_exactly(patterns: int) -> None:
    heads = 16 if 16 % patterns == 0 else 15
    group = np.arange(heads) % patterns
    similarity = (group[:, None] == group[None, :]).astype(float)
    assert distinct_patterns(similarity) == pytest.approx(patterns)


def test_partly_overlapping_patterns_count_between() -> None:
    similarity = np.array([[1.0, 0.5], [0.5, 1.0]])  # two heads sharing half their pattern
    assert 1 < distinct_patterns(similarity) < 2


def test_the_rule_takes_the_nearest_allowed_count_on_a_log_scale() -> None:
    assert head_counts(128, 8) == [1, 2, 4, 8, 16]
    assert head_counts(96, 8, multiple=2) == [2, 4, 6, 12]
    assert later_head_count(4.36, 128, 8) == 4
    assert later_head_count(6.0, 128, 8) == 8  # log 6 is nearer log 8 than log 4
    assert later_head_count(math.sqrt(8), 128, 8) == 4  # a tie: more heads
    assert later_head_count(40.0, 128, 8) == 16  # no more than the width allows
    assert later_head_count(0.5, 128, 8) == 1


def sharp_logits(heads: int, patterns: int, windows: int = 4, length: int = 32) -> torch.Tensor:
    """(B, H, T, T) logits of heads in ``patterns`` groups: group g attends to the key
    ``g + 1`` back (the query itself near the start); future entries -inf."""
    t = torch.arange(length)
    logits = torch.full((windows, heads, length, length), -30.0)
    for h in range(heads):
        back = h % patterns + 1
        key = (t - back).clamp_min(0)
        logits[:, h, t, key] = 30.0
    causal = t[None, :] > t[:, None]
    return logits.masked_fill(causal, float("-inf"))


@pytest.mark.parametrize("patterns", [1, 2, 4, 8])
def test_the_measurement_recovers_a_known_count_by_construction(patterns: int) -> None:
    # 16 heads whose patterns are known: the measured count is the constructed one within the
    # sequence start's overlap (early queries cannot look far back), and the rule gives it.
    similarity = head_similarity(sharp_logits(16, patterns)).numpy()
    assert np.allclose(np.diag(similarity), 1.0)
    measured = distinct_patterns(similarity)
    assert measured == pytest.approx(patterns, rel=0.15)
    assert later_head_count(measured, 128, 8) == patterns


def test_the_plan_gives_each_later_layer_its_measured_count_and_says_why() -> None:
    settings = PlanSettings(budget=128, layers=3, seq_len=64, input_dim=32, kernel="ngram:4",
                            mlp_ratio=2, patterns=(7.2, 1.3))
    plan = make_plan(settings)
    counts = [layer.n_heads for layer in plan.arch.layers]
    assert counts == [4, 8, 1]
    rows = report(plan)["layers"]
    assert "7.2 distinct attention patterns measured: 8 heads" in rows[1]["reason"]
    assert "1.3 distinct attention patterns measured: 1 head;" in rows[2]["reason"]
    assert "averages s1-4" in rows[0]["reason"]
    # Without a measurement, later layers keep layer 0's heads, as before.
    plain = make_plan(PlanSettings(budget=128, layers=3, seq_len=64, input_dim=32,
                                   kernel="ngram:4", mlp_ratio=2))
    assert [layer.n_heads for layer in plain.arch.layers] == [4, 4, 4]
    assert "no pattern count measured" in report(plain)["layers"][1]["reason"]


def test_the_prior_energy_is_least_at_the_rules_count() -> None:
    settings = PlanSettings(budget=128, layers=2, seq_len=64, input_dim=32, kernel="ngram:4",
                            mlp_ratio=2, patterns=(7.2,))
    plan = make_plan(settings)
    layer = plan.arch.layers[1]
    costs = {}
    for count in (1, 2, 4, 8, 16):
        candidate = LayerSpec("mhsa", (HeadGroup(count, 128 // count),), 2, "process")
        costs[count] = layer_bound(settings, 1, candidate)
    assert min(costs, key=costs.__getitem__) == layer.n_heads == 8


@pytest.mark.parametrize(("change", "words"), [
    ({"patterns": (0.5,)}, "patterns"),
    ({"patterns": (2.0, 2.0)}, "patterns: 2 values for 1 later layer"),
    ({"max_block": 0}, "max_block"),
    ({"max_block": 65}, "max_block"),
])
def test_bad_measurements_are_refused_by_field(change: dict, words: str) -> None:
    with pytest.raises(TransformerAllocError, match=words):
        PlanSettings(budget=128, layers=2, **change)
