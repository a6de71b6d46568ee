"""python -m bench.student_samplers --storage URL --prefix NAME [--seeds 0 1 2] [--within 0.01]
    [--samplers prior tpe random]

How many trials each sampler of a student search (``workers.search --teacher``) needs to come
within 1% of the best held-out loss found at its seed, read from recorded studies named
``NAME-SAMPLER-sSEED`` (``--samplers``: any names, ``random`` read as random search; each seed
its own calibration sample, so its own plan and its own best). Trials count in the order they
ran, the fixed allocations the study enqueued first included.

- An adaptive sampler (the prior decays into TPE; TPE) is read as it ran: its first trial within
  the margin, per seed, and the median over seeds.
- Random search draws every point independently, so its recorded draws are exchangeable: each
  order of them is a run it could have made. Its median is read two ways: replayed (its sampled
  draws shuffled 2,000 times per seed, the fixed trials first as in the study), and from the
  share ``p`` of its draws within the margin, pooled over seeds, whose first hit is geometric:
  median ``fixed + ceil(ln 0.5 / ln(1 - p))``, with ``p``'s exact (Clopper-Pearson) 95%
  interval turned into the median's.

The goal reads: a sampler within the margin in at most half of random search's median trials.
For every other sampler, ``holds`` where its median is at most half the lower end of random's
interval, ``fails`` where it is more than half the upper end (a run that never came within
the margin counts as its trials plus one: the least it could have taken), else
``inconclusive``. Writes nothing.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState
from scipy import stats

from common.cli import Parser, add_format, dump, fail, render_table
from common.errors import Problem, UsageError
from studies import redact

SAMPLERS = ("prior", "tpe", "random")  # the default names; RANDOM's draws are exchangeable
RANDOM = "random"
FIXED_LABELS = ("plan", "uniform", "palu", "refit")  # enqueued allocations (trial attr "seed")
REPLAYS = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Run:
    """One study: each trial's held-out loss in run order (None: stopped or failed)."""

    sampler: str
    seed: int
    losses: tuple[float | None, ...]
    fixed: int  # how many of the first trials were enqueued allocations

    @property
    def sampled(self) -> tuple[float | None, ...]:
        return self.losses[self.fixed:]

    def best(self) -> float:
        return min((v for v in self.losses if v is not None), default=math.inf)


def load_run(url: str, study: str, sampler: str, seed: int) -> Run:
    """The study's trials in the order they ran."""
    trials = sorted(optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False),
                    key=lambda t: t.number)
    ran = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    losses = tuple(t.values[0] if t.state == TrialState.COMPLETE else None for t in ran)
    fixed = next((i for i, t in enumerate(ran) if t.user_attrs.get("seed") not in FIXED_LABELS),
                 len(ran))
    return Run(sampler, seed, losses, fixed)


def first_within(losses: Sequence[float | None], target: float) -> int | None:
    """The 1-based trial at which the loss first came within ``target`` (None: never)."""
    return next((i for i, v in enumerate(losses, 1) if v is not None and v <= target), None)


def replayed(run: Run, target: float, rng: random.Random, replays: int = REPLAYS
             ) -> list[int | None]:
    """Random search's first trial within ``target`` over ``replays`` orders of its draws."""
    draws = list(run.sampled)
    found = []
    for _ in range(replays):
        rng.shuffle(draws)
        hit = first_within(draws, target)
        found.append(None if hit is None else run.fixed + hit)
    return found


def geometric_median(p: float, fixed: int) -> float:
    """Median trials to the first hit when each draw hits with probability ``p``."""
    if p <= 0:
        return math.inf
    if p >= 1:
        return fixed + 1
    return fixed + math.ceil(math.log(0.5) / math.log1p(-p))


def clopper_pearson(hits: int, draws: int) -> tuple[float, float]:
    """The exact 95% interval of a binomial share."""
    alpha = 1 - CONFIDENCE
    low = 0.0 if hits == 0 else float(stats.beta.ppf(alpha / 2, hits, draws - hits + 1))
    high = 1.0 if hits == draws else float(stats.beta.ppf(1 - alpha / 2, hits + 1, draws - hits))
    return low, high


def censored_median(found: Sequence[int | None]) -> float:
    """The median of first hits where a run without one counts as beyond every hit."""
    ordered = sorted(math.inf if f is None else f for f in found)
    return float(statistics.median(ordered))


@dataclass(frozen=True)
class Race:
    """The samplers at every seed against that seed's best."""

    within: float
    seeds: tuple[int, ...]
    runs: tuple[Run, ...]
    samplers: tuple[str, ...] = SAMPLERS

    def target(self, seed: int) -> float:
        return (1 + self.within) * min(r.best() for r in self.runs if r.seed == seed)

    def of(self, sampler: str) -> list[Run]:
        return [r for r in self.runs if r.sampler == sampler]


def read_race(url: str, prefix: str, seeds: Sequence[int], within: float,
              samplers: Sequence[str] = SAMPLERS) -> Race:
    """Every ``PREFIX-SAMPLER-sSEED`` study there is (a seed without one is an error)."""
    names = set(optuna.get_all_study_names(storage=url))
    runs = [load_run(url, f"{prefix}-{s}-s{seed}", s, seed)
            for seed in seeds for s in samplers if f"{prefix}-{s}-s{seed}" in names]
    missing = [seed for seed in seeds if not any(r.seed == seed for r in runs)]
    if missing:
        raise UsageError.of([Problem("prefix", prefix, f"no study {prefix}-SAMPLER-s"
                                     f"{missing[0]} in {redact(url)} (SAMPLER: "
                                     f"{', '.join(samplers)})")])
    return Race(within, tuple(seeds), tuple(runs), tuple(samplers))


def summary(race: Race) -> dict[str, Any]:
    """Per sampler and seed the first trial within the margin; random's replays and geometric
    median with its interval; the goal's verdict."""
    first = {id(r): first_within(r.losses, race.target(r.seed)) for r in race.runs}
    rows = [{"sampler": r.sampler, "seed": r.seed, "trials": len(r.losses), "fixed": r.fixed,
             "best": r.best(), "target": race.target(r.seed), "first_within": first[id(r)],
             "hits": sum(v is not None and v <= race.target(r.seed) for v in r.sampled)}
            for r in race.runs]
    medians = {s: censored_median([first[id(r)] for r in race.of(s)])
               for s in race.samplers if race.of(s)}
    # a run without a hit took more than its trials: the least its median can be
    least = {s: float(statistics.median([first[id(r)] or len(r.losses) + 1 for r in race.of(s)]))
             for s in medians}
    out: dict[str, Any] = {"within": race.within, "rows": rows, "medians": medians,
                           "least_medians": least}
    randoms = race.of(RANDOM)
    if randoms:
        out[RANDOM] = random_median(race, randoms)
        out["verdicts"] = {s: verdict(m, out[RANDOM]["interval"], least[s])
                           for s, m in medians.items() if s != RANDOM}
    return out


def random_median(race: Race, runs: Sequence[Run]) -> dict[str, Any]:
    """Random search's median trials: replayed per seed, and geometric from the pooled share
    of hits with its exact interval."""
    rng = random.Random(0)
    replays = {r.seed: censored_median(replayed(r, race.target(r.seed), rng)) for r in runs}
    hits = sum(v is not None and v <= race.target(r.seed) for r in runs for v in r.sampled)
    draws = sum(len(r.sampled) for r in runs)
    fixed = max(r.fixed for r in runs)
    low, high = clopper_pearson(hits, draws)
    return {"hits": hits, "draws": draws, "share": hits / draws if draws else math.nan,
            "replayed_median_by_seed": replays,
            "median": geometric_median(hits / draws if draws else 0.0, fixed),
            "interval": [geometric_median(high, fixed), geometric_median(low, fixed)]}


def verdict(median: float, random_interval: Sequence[float], least: float | None = None
            ) -> str:
    """A sampler's median trials against half of random search's interval; ``least``: the
    least its median can be where some of its runs never came within the margin (default:
    ``median``)."""
    low, high = random_interval
    if median <= 0.5 * low:
        return "holds"
    if (median if least is None else least) > 0.5 * high:
        return "fails"
    return "inconclusive"


def render(result: dict[str, Any]) -> str:
    table = render_table(
        ["sampler", "seed", "trials", "best", "first within", "hits (sampled)"],
        [[r["sampler"], r["seed"], r["trials"], f"{r['best']:.4f}",
          r["first_within"] or f"none in {r['trials']}", r["hits"]] for r in result["rows"]])
    lines = [table, "", "median first trial within {:.0%}: {}".format(
        result["within"], ", ".join(
            f"{s} {_n(m)}" + ("" if math.isfinite(m) else
                              f" (at least {result['least_medians'][s]:g})")
            for s, m in result["medians"].items()))]
    if "random" in result:
        rnd = result["random"]
        lines.append(
            f"random: {rnd['hits']} of {rnd['draws']} sampled draws within (share "
            f"{rnd['share']:.3f}); median {_n(rnd['median'])} trials, 95% "
            f"[{_n(rnd['interval'][0])}, {_n(rnd['interval'][1])}]; replayed per seed: "
            + ", ".join(f"s{k} {_n(v)}" for k, v in rnd["replayed_median_by_seed"].items()))
    for sampler, said in result.get("verdicts", {}).items():
        lines.append(f"{sampler} in at most half of random's median trials: {said}")
    return "\n".join(lines)


def _n(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:g}"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.student_samplers",
               description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--storage", required=True, help="the studies' database URL")
    p.add_argument("--prefix", required=True,
                   help="studies named PREFIX-SAMPLER-sSEED (SAMPLER: prior, tpe, random)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS),
                   help="the SAMPLER parts of the studies' names; 'random' is random search")
    p.add_argument("--within", type=float, default=0.01,
                   help="the margin above a seed's best (default: 0.01, 1%%)")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = "bench.student_samplers"
    if not 0 < args.within < 1:
        return fail(prog, f"within {args.within}: must be in (0, 1)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        result = summary(read_race(args.storage, args.prefix, args.seeds, args.within,
                                   args.samplers))
    except UsageError as err:
        return fail(prog, str(err))
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
