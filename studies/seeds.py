"""A study's architectures compared over their seeds (``python -m studies seeds``): the fully
trained trials of one architecture and training, told apart only by ``train.seed``, are one
point; its value is their mean with a 95% interval over seeds, and against a reference point
the difference is paired seed by seed (the same seed fixes both models' weights and batches),
with its interval, the one-sided p that the point is worse, and a verdict: ``worse`` (p < 5%),
``better`` (the interval on the better side of 0) or ``level`` (neither: the seeds cannot tell
them apart). Pure: records in, records out (``studies.query`` reads the trials)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.stats import ALPHA, Interval, Paired, interval, mean, paired
from studies.trials import TrialRecord


@dataclass(frozen=True)
class SeedPoint:
    """One architecture and training (all but the seed) with its trials' values by seed."""

    key: str  # the architecture's id and the training fields but the seed
    trials: tuple[TrialRecord, ...]  # in seed order
    values: Mapping[int, float]  # seed -> the trial's value
    # the trials' names, in ``trials``' order: their numbers, ``STUDY#N`` for a pooled study's
    names: tuple[str, ...] = ()

    @property
    def trial_names(self) -> tuple[str, ...]:
        return self.names or tuple(str(t.number) for t in self.trials)

    @property
    def first(self) -> TrialRecord:
        return self.trials[0]

    @property
    def value(self) -> Interval:
        return interval(list(self.values.values()))

    @property
    def tokens_per_s(self) -> float | None:
        rates = [t.tokens_per_s for t in self.trials if t.tokens_per_s]
        return mean(rates) if rates else None


@dataclass(frozen=True)
class SeedComparison:
    """A point against the reference over the seeds both have (None: it is the reference)."""

    point: SeedPoint
    against: Paired | None
    seeds: tuple[int, ...]  # the seeds paired
    verdict: str  # reference | worse | better | level | no shared seed


def seed_points(trials: Sequence[TrialRecord],
                pooled: Mapping[str, Sequence[TrialRecord]] | None = None) -> list[SeedPoint]:
    """The trials grouped by architecture and training but the seed (``train.seed``; a trial
    without one counts as seed 0), in the order their first trials were made; ``pooled``:
    other studies' trials (by study name) joining the same points, after ``trials`` (an
    architecture one study trained at a seed another also did keeps the first's value)."""
    groups: dict[str, list[tuple[str, TrialRecord]]] = {}
    sources = [("", trials), *((f"{name}#", more) for name, more in (pooled or {}).items())]
    for prefix, members in sources:
        for trial in members:
            if trial.value is None:
                continue
            rest = {k: v for k, v in trial.train.items() if k != "seed"}
            key = f"{trial.arch_id or prefix + str(trial.number)} " \
                  f"{json.dumps(rest, sort_keys=True)}"
            groups.setdefault(key, []).append((f"{prefix}{trial.number}", trial))
    points = []
    for key, named in groups.items():
        kept: dict[int, tuple[str, TrialRecord]] = {}
        for name, trial in named:
            kept.setdefault(seed_of(trial), (name, trial))
        by_seed = sorted(kept.values(), key=lambda pair: seed_of(pair[1]))
        values = {seed_of(t): float(t.value) for _, t in by_seed if t.value is not None}
        points.append(SeedPoint(key, tuple(t for _, t in by_seed), values,
                                tuple(name for name, _ in by_seed)))
    return points


def seed_of(trial: TrialRecord) -> int:
    return int(trial.train.get("seed", 0))


def compare(points: Sequence[SeedPoint], reference: SeedPoint, maximize: bool = False
            ) -> list[SeedComparison]:
    """Each point against ``reference``, paired over their shared seeds; differences are the
    point's value minus the reference's (for a maximised value, the reference's minus the
    point's), so below 0 is better either way."""
    out = []
    for point in points:
        if point is reference:
            out.append(SeedComparison(point, None, tuple(point.values), "reference"))
            continue
        seeds = tuple(s for s in point.values if s in reference.values)
        if not seeds:
            out.append(SeedComparison(point, None, (), "no shared seed"))
            continue
        sign = -1.0 if maximize else 1.0
        mine = [sign * point.values[s] for s in seeds]
        theirs = [sign * reference.values[s] for s in seeds]
        result = paired(mine, theirs)
        out.append(SeedComparison(point, result, seeds, verdict(result)))
    return out


def verdict(result: Paired) -> str:
    """``worse`` when the one-sided paired test rejects "no worse" at ``ALPHA``; ``better``
    when the whole interval is below 0; else ``level``."""
    if result.p_worse is not None and result.p_worse < ALPHA:
        return "worse"
    if result.difference.n >= 2 and result.difference.high < 0:
        return "better"
    return "level"
