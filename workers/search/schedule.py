"""Early stopping that keeps what a search is for: successive halving at fixed milestones, with
the best trials always trained in full. No Ray here (``workers.search.tune`` wraps ``Halving``
in a Tune scheduler), so the rule is tested on its own.

Stock ASHA (grace period a ninth of the training, a third kept at each rung) ended the README's
14-trial search with 2 complete trials: its first rung fell on an early, noisy evaluation, a
trial retried from a checkpoint was judged once, at the first rung it had passed, by a value
from much later in its training (which set the cutoff that stopped every fresh trial), and a
third of 14 is 4 points, too few for a Pareto front or a rank correlation. Here:

* the milestones are evaluation steps at a third and two thirds of the training (``Rungs``):
  every trial is judged on values measured at the same step;
* a trial retried from a checkpoint reports its recorded evaluations again before it trains on
  (``workers.search.trial``), so it meets every milestone as a fresh trial does;
* at a milestone a trial stops only when at least ``full`` trials (10) that reached it are
  better *and* it is outside the best ``1 / reduction`` (a third) of them: a search trains at
  least its ten best candidates in full, and successive halving cuts as ASHA does once more
  trials than that compete.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FULL_TRIALS = 10  # trials a milestone never stops: the fewest a study's queries can rank
REDUCTION = 3  # past them, a milestone keeps the best third (successive halving)
FRACTIONS = (1 / 3, 2 / 3)  # milestones, as fractions of the training


@dataclass(frozen=True)
class Rungs:
    """Where trials are compared (evaluation steps) and how many each comparison keeps."""

    milestones: tuple[int, ...]
    steps: int
    full: int = FULL_TRIALS
    reduction: int = REDUCTION

    @classmethod
    def for_training(cls, steps: int, eval_every: int, full: int = FULL_TRIALS) -> Rungs:
        """The first evaluation step at or after each of ``FRACTIONS`` of ``steps``, short of
        the end (a trial's last evaluation is its result, not a milestone)."""
        found = []
        for fraction in FRACTIONS:
            step = math.ceil(steps * fraction / eval_every) * eval_every
            if step < steps and step not in found:
                found.append(step)
        return cls(tuple(found), steps, full)


@dataclass
class Halving:
    """The decisions of one search's run: which trial continues at each milestone.

    ``judge`` is called with every result of every trial; it records a trial's value at the
    first result at or past each milestone (its evaluation at that step), once.
    """

    rungs: Rungs
    maximize: bool
    recorded: dict[int, dict[str, float]] = field(default_factory=dict)  # milestone -> values

    def judge(self, trial: str, step: int, value: float) -> bool:
        """Whether ``trial`` continues after reporting ``value`` at ``step``."""
        score = value if self.maximize else -value
        if not math.isfinite(score):
            score = -math.inf  # a non-finite value is the worst there is
        for milestone in self.rungs.milestones:
            seen = self.recorded.setdefault(milestone, {})
            if step < milestone or trial in seen:
                continue
            better = sum(other > score for other in seen.values())
            seen[trial] = score
            if better >= max(self.rungs.full, math.ceil(len(seen) / self.rungs.reduction)):
                return False
        return True
