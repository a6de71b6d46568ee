"""python -m alloc.calibrate --storage URL --study NAME [--out constants.yaml] [--plot fit.png]

Fit the bound's constants ``c_proj``, ``c_head``, the order ``n`` and the width order ``m`` to the
losses a study measured (docs/theory.md §6): least squares on log-loss, ``log y = log k + log
E(arch; c_proj, c_head, n, m)``, with the constants kept positive (fitted as logs), ``n`` in [1, 6],
``m`` in [0, 6] and the scale ``k`` (loss units per unit of bound) solved in closed form; ``n`` and
``m`` apart only where the observed first layers identify them (``width_design``). Each
architecture counts once, with its best fully trained loss over learning rates and seeds (the
paper's estimate of the approximation error). Prints the fit (R² of log-loss, Spearman rank
correlation) next to the raw constants' fit, and the allocation re-solved with the fitted
constants next to the raw one; ``--out`` writes the constants for ``python -m alloc.solve
--constants``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from alloc.constants import Constants, to_yaml
from alloc.errors import CalibrationError, PlanError
from alloc.plan import Plan, make_plan, predicted_error
from alloc.settings import PlanSettings
from arch import ArchConfig, HeadGroup, LayerSpec
from common.cli import (
    Parser,
    add_format,
    check_writable,
    dump,
    fail,
    flag_names,
    render_table,
    wrote,
)
from common.errors import Problem, TransformerAllocError
from common.files import write_atomic

PROG = "alloc.calibrate"


ORDER_RANGE = (1.0, 6.0)
WIDTH_ORDER_RANGE = (0.0, 6.0)
LOG_C_RANGE = (-12.0, 12.0)  # c in [6e-6, 1.6e5]: wide, but keeps the optimiser finite
# Coarse grid over (log c_proj, log c_head) whose best points, with each design's exponents,
# start the local fits.
_LOG_C_GRID = [(p, h) for p in (-4.0, -1.0, 2.0) for h in (-4.0, -1.0, 2.0)]
# The observed first layers' (log heads, log head dim) must spread in two directions, the
# smaller at least this share of the larger (singular values), for n and m to be fitted apart.
MIN_SPREAD = 0.05
BOTH_MIN = 5  # observations to fit n and m apart: c_proj, c_head, n, m and the scale

# What the observed first layers identify of the extraction exponents (docs/theory.md §6):
# "both" n and m; "difference" only n - m (every layer one width: H heads of D/H extract at
# K (D/d_in)^-m H^(m-n)); "order" only n (m held at the settings' value).
WidthDesign = Literal["both", "difference", "order"]


@dataclass(frozen=True)
class Observation:
    """One architecture's first layer and its best measured loss."""

    label: str
    layer: LayerSpec
    loss: float
    trial: int  # the trial that measured ``loss``
    trials: int  # fully trained trials of this architecture


@dataclass(frozen=True)
class Group:
    """Observations measured on one task (one corpus): its allocator inputs and, in a fit over
    several groups, a scale of its own (loss levels differ between tasks; the constants are
    shared)."""

    name: str
    settings: PlanSettings
    observations: tuple[Observation, ...]


@dataclass(frozen=True)
class ConstantsFit:
    constants: Constants
    scale: float  # one group's; over several, the geometric mean of theirs
    r2: float  # of log-loss (within each group, over several)
    spearman: float
    bound: tuple[float, ...]  # E per observation under ``constants`` (unscaled)
    design: WidthDesign = "order"  # what the observations identified of n and m
    scales: tuple[float, ...] = ()  # per observation, its group's scale (several groups only)

    @property
    def predicted(self) -> tuple[float, ...]:
        """Predicted loss per observation: its scale times ``E``."""
        return tuple(k * e for k, e in zip(self.scales or [self.scale] * len(self.bound),
                                           self.bound))


def with_constants(settings: PlanSettings, constants: Constants) -> PlanSettings:
    return dataclasses.replace(settings, c_proj=constants.c_proj, c_head=constants.c_head,
                               order=constants.order, width_order=constants.width_order)


def bounds(settings: PlanSettings, observations: Sequence[Observation],
           constants: Constants) -> np.ndarray:
    """The allocator's error bound of each observed first layer under ``constants`` (solved
    once per distinct set of heads: the bound depends on nothing else of the layer)."""
    s = with_constants(settings, constants)
    solved: dict[tuple[HeadGroup, ...], float] = {}
    for o in observations:
        if o.layer.heads not in solved:
            solved[o.layer.heads] = predicted_error(s, o.layer)
    return np.array([solved[o.layer.heads] for o in observations])


def _score(groups: Sequence[Group], constants: Constants) -> ConstantsFit:
    """Best scale of each group for ``constants`` and the fit's quality (R² and Spearman of
    log-loss within each group, where its own scale puts it)."""
    from scipy.stats import spearmanr  # SciPy's stats and optimize take 0.5 s to import

    es, log_ks, sse, sst, x, y = [], [], 0.0, 0.0, [], []
    for g in groups:
        e = bounds(g.settings, g.observations, constants)
        log_y = np.log([o.loss for o in g.observations])
        gap = log_y - np.log(e)
        log_ks.append(float(gap.mean()))
        sse += float(((gap - log_ks[-1]) ** 2).sum())
        sst += float(((log_y - log_y.mean()) ** 2).sum())
        es.append(e)
        x += (np.log(e) - np.log(e).mean()).tolist()
        y += (log_y - log_y.mean()).tolist()
    # A bound that prices every arm alike (e.g. every offset truncated) explains nothing: R² 0
    # exactly, where sse and sst would differ by a rounding error and pass a guard at 0.
    if all(np.ptp(e) <= 1e-12 * np.abs(e).max() for e in es):
        r2, rho = 0.0, 0.0
    else:
        r2 = 1.0 - sse / sst if sst > 0 else 1.0
        rho = float(spearmanr(x, y).statistic)
    scales = () if len(groups) == 1 else tuple(
        math.exp(k) for k, g in zip(log_ks, groups) for _ in g.observations)
    return ConstantsFit(constants, math.exp(float(np.mean(log_ks))), r2,
                        rho if math.isfinite(rho) else 0.0,
                        tuple(np.concatenate(es).tolist()), scales=scales)


def width_design(layers: Sequence[LayerSpec]) -> WidthDesign:
    """What the observed first layers identify of the extraction exponents ``n`` and ``m``:
    the extraction term of ``H`` heads of dimension ``d`` is ``K H^-n (d/d_in)^-m``, so in logs
    ``-n log H - m log d``. Both are identified when the layers' ``(log H, log d)`` spread in
    two directions; where every layer has one width ``D`` (``log d = log D - log H``) only ``n -
    m``; otherwise (one head count, points on another line, or fewer than ``BOTH_MIN``
    observations for four constants and the scale) ``m`` is held."""
    points = sorted({(layer.n_heads, layer.width) for layer in layers})
    if len({h for h, _ in points}) < 2:
        return "order"
    if len({w for _, w in points}) == 1:
        return "difference"
    x = np.log([[h, w / h] for h, w in points])
    spread = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)
    apart = spread[1] >= MIN_SPREAD * spread[0] and len(layers) >= BOTH_MIN
    return "both" if apart else "order"


@dataclass(frozen=True)
class _Parametrisation:
    """The fitted vector of one design: ``(log c_proj, log c_head, ...)`` with ``n, m`` for
    "both", ``q = n - m`` for "difference" (read as the smallest ``m`` that fits: ``n =
    max(q, 1)``, ``m = n - q``), ``n`` alone for "order" (``m`` held)."""

    design: WidthDesign
    held_width_order: float

    @property
    def box(self) -> tuple[list[float], list[float]]:
        logs = ([LOG_C_RANGE[0]] * 2, [LOG_C_RANGE[1]] * 2)
        if self.design == "both":
            return (logs[0] + [ORDER_RANGE[0], WIDTH_ORDER_RANGE[0]],
                    logs[1] + [ORDER_RANGE[1], WIDTH_ORDER_RANGE[1]])
        if self.design == "difference":  # q from n = 1, m = 6 up to n = 6, m = 0
            return (logs[0] + [ORDER_RANGE[0] - WIDTH_ORDER_RANGE[1]], logs[1] + [ORDER_RANGE[1]])
        return logs[0] + [ORDER_RANGE[0]], logs[1] + [ORDER_RANGE[1]]

    @property
    def exponents(self) -> list[tuple[float, ...]]:
        """The exponents of the coarse grid's starting points."""
        # n - m = 0 is where fewer heads start to win: a fit started far from it stays in the
        # flat region of a bound that truncates everything (measured on the ngram table).
        if self.design == "both":
            return [(1.0, 0.0), (2.0, 0.0), (4.0, 0.0), (1.0, 1.0), (2.0, 2.0), (2.0, 1.0),
                    (1.0, 2.0), (2.0, 4.0)]
        if self.design == "difference":
            return [(q,) for q in (-1.0, 0.0, 1.0, 2.0, 4.0)]
        return [(n,) for n in (1.0, 2.0, 4.0)]

    def constants(self, theta: np.ndarray) -> Constants:
        c_proj, c_head = math.exp(theta[0]), math.exp(theta[1])
        if self.design == "both":
            return Constants(c_proj, c_head, float(theta[2]), float(theta[3]))
        if self.design == "difference":
            order = max(float(theta[2]), ORDER_RANGE[0])
            return Constants(c_proj, c_head, order, order - float(theta[2]))
        return Constants(c_proj, c_head, float(theta[2]), self.held_width_order)

    def theta(self, c: Constants) -> np.ndarray:
        logs = [math.log(c.c_proj), math.log(c.c_head)]
        if self.design == "both":
            return np.array([*logs, c.order, c.width_order])
        if self.design == "difference":
            return np.array([*logs, c.order - c.width_order])
        return np.array([*logs, c.order])


def fit(settings: PlanSettings, observations: Sequence[Observation],
        design: WidthDesign | None = None) -> tuple[ConstantsFit, ConstantsFit]:
    """(raw, calibrated): the settings' own constants with only the scale fitted, and the least
    squares constants. The calibrated fit nests the raw one, so its R² is never lower; ``n``
    and ``m`` as ``width_design`` says the observations identify them, or as ``design`` says
    ("order": ``m`` held at the settings' value, the bound before §2.3)."""
    if len(observations) < 4:
        raise CalibrationError("calibration needs at least 4 architectures with a full-budget "
                               f"loss (3 constants + the scale); the study has {len(observations)}")
    return fit_groups([Group("", settings, tuple(observations))], design)


def fit_groups(groups: Sequence[Group], design: WidthDesign | None = None
               ) -> tuple[ConstantsFit, ConstantsFit]:
    """``fit`` over several tasks at once: one set of constants, a scale per group, each group's
    bounds under its own allocator inputs (its kernel, spectrum, input width). The raw
    constants, and ``m`` where it is held, are the first group's settings'.

    Raises:
        CalibrationError: no group, or fewer architectures than 3 constants and the groups'
            scales.
    """
    from scipy.optimize import least_squares

    observations = [o for g in groups for o in g.observations]
    if not groups or len(observations) < 3 + len(groups):
        raise CalibrationError(f"calibration over {len(groups)} groups needs at least "
                               f"{3 + len(groups)} architectures (3 constants + a scale per "
                               f"group); they have {len(observations)}")
    log_y = [np.log([o.loss for o in g.observations]) for g in groups]
    settings = groups[0].settings
    form = _Parametrisation(design or width_design([o.layer for o in observations]),
                            settings.width_order)

    def residuals(theta: np.ndarray) -> np.ndarray:
        constants = form.constants(theta)
        gaps = [y - np.log(bounds(g.settings, g.observations, constants))
                for y, g in zip(log_y, groups)]
        return np.concatenate([gap - gap.mean() for gap in gaps])

    given = Constants(settings.c_proj, settings.c_head, settings.order, settings.width_order)
    raw = _score(groups, given)
    low, high = form.box
    grid = [np.array([*c, *e]) for c in _LOG_C_GRID for e in form.exponents]
    starts = sorted(grid, key=lambda t: float((residuals(t) ** 2).sum()))[:3]
    starts.append(form.theta(given))
    best = raw
    for start in starts:
        x0 = np.clip(start, low, high)
        result = least_squares(residuals, x0, bounds=(low, high), diff_step=1e-3)
        candidate = _score(groups, form.constants(result.x))
        if candidate.r2 > best.r2:
            best = candidate
    return raw, dataclasses.replace(best, design=form.design)


# --- a plan calibrated on its own trainings ----------------------------------------------------


@dataclass(frozen=True)
class Recalibrated:
    """A default plan calibrated on trainings of it and the fixed rules: the fit, and the plan
    made again with the fitted constants where they explain the losses at all (R² > 0), else
    the default plan kept (``informative`` False)."""

    plan: Plan
    raw: ConstantsFit
    fitted: ConstantsFit

    @property
    def informative(self) -> bool:
        return self.fitted.r2 > 0


def mean_observations(arms: Mapping[str, ArchConfig], losses: Mapping[str, Mapping[int, float]],
                      seeds: Sequence[int]) -> list[Observation]:
    """One observation per distinct architecture of ``arms`` (by label; one that two labels
    share counts once): its first layer and its mean loss over ``seeds``, from ``losses`` (per
    ``arch_id``, the loss per seed).

    Raises:
        CalibrationError: an architecture without a finite positive loss on every seed.
    """
    out: list[Observation] = []
    seen: set[str] = set()
    for label, arch in arms.items():
        if arch.arch_id in seen:
            continue
        seen.add(arch.arch_id)
        values = [losses.get(arch.arch_id, {}).get(s, math.nan) for s in seeds]
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise CalibrationError.of([Problem(
                "losses", f"{label} ({arch.describe()})",
                f"needs a finite loss on every seed {list(seeds)}; has {values}")])
        out.append(Observation(arch.describe(), arch.layers[0], sum(values) / len(values),
                               len(out), len(values)))
    return out


def recalibrate(default: Plan, observations: Sequence[Observation]) -> Recalibrated:
    """``default`` (a plan and its settings) calibrated on ``observations`` of it and the fixed
    rules (``fit``, docs/theory.md §6). A fit no better than the losses' mean (R² <= 0: every
    arm predicted alike) carries no measurement; its constants would pick among ties, so the
    default plan stays.

    Raises:
        CalibrationError: too few distinct architectures to fit.
    """
    raw, fitted = fit(default.settings, observations)
    plan = (make_plan(with_constants(default.settings, fitted.constants)) if fitted.r2 > 0
            else default)
    return Recalibrated(plan, raw, fitted)


# --- reading the study -----------------------------------------------------------------------


def _bad(study: str, rule: str) -> CalibrationError:
    """The error for the study named ``study`` breaking ``rule`` (a problem of ``study``)."""
    return CalibrationError.of([Problem("study", repr(study), rule)])


def observations_from_study(url: str | None, study: str) -> tuple[PlanSettings,
                                                                   list[Observation]]:
    """The allocator inputs the search recorded and the best loss of each architecture."""
    from studies import engine, open_storage, query
    from studies.trials import TrialRecord

    eng = engine(open_storage(url, read_only=True))
    summaries = {s.name: s for s in query.list_studies(eng)}
    if study not in summaries:
        raise _bad(study, f"no such study; studies: {', '.join(summaries) or '(none)'}")
    summary = summaries[study]
    if summary.direction != "MINIMIZE":
        raise _bad(study, f"its metric is maximised ({summary.attrs.get('metric', '?')}); "
                          "calibration fits a loss")
    if "alloc_inputs" not in summary.attrs:
        raise _bad(study, "has no allocator inputs (study attr alloc_inputs); run it with "
                          "python -m workers.search")
    try:
        settings = PlanSettings.from_dict(json.loads(summary.attrs["alloc_inputs"]))
    except (ValueError, PlanError) as err:
        raise _bad(study, f"its recorded allocator inputs are unusable ({err})") from None
    _, trials = query.load_trials(eng, study)
    done = query.attach_archs(eng, query.eligible(trials))
    groups: dict[str, list[TrialRecord]] = {}
    for t in done:
        if t.arch is not None and t.value is not None and math.isfinite(t.value):
            groups.setdefault(t.arch.arch_id, []).append(t)
    out = []
    for records in groups.values():
        best = min(records, key=lambda t: (t.value, t.number))
        assert best.arch is not None and best.value is not None
        if best.value <= 0:
            raise _bad(study, f"trial {best.number} has loss {best.value:g}; log-loss needs "
                              "positive values")
        out.append(Observation(" | ".join(x.heads_str for x in best.arch.layers),
                               best.arch.layers[0], best.value, best.number, len(records)))
    return settings, sorted(out, key=lambda o: (o.layer.n_heads, o.label))


def write_constants(path: Path, study: str, architectures: int, fitted: ConstantsFit,
                    extra: Mapping[str, Any] | None = None) -> None:
    """The fitted constants for ``alloc.solve --constants``, with the fit's provenance
    (``study``: where the losses come from; ``extra``: more of it)."""
    meta = {"study": study, "architectures": architectures, "r2": fitted.r2,
            "spearman": fitted.spearman, "width_design": fitted.design, **(extra or {})}
    write_atomic(path, to_yaml(fitted.constants, fitted.scale, meta))


# --- report ------------------------------------------------------------------------------------


def _plan_summary(plan: Plan) -> dict[str, Any]:
    exact = plan.exact
    return {"exact": {"heads": exact.heads, "objective": exact.objective,
                      "groups": [{"offset": g.offset, "count": g.count, "dim": g.dim}
                                 for g in exact.groups]},
            "uniform": {"count": plan.uniform.count, "dim": plan.uniform.dim,
                        "objective": plan.uniform.objective},
            "extract_layer": plan.arch.layers[0].heads_str}


def _fit_dict(f: ConstantsFit) -> dict[str, Any]:
    return {**f.constants.as_flags(), "scale": f.scale, "r2": f.r2, "spearman": f.spearman}


DESIGN_NOTE = {
    "both": "n and m fitted apart (the first layers vary heads and head dimension apart)",
    "difference": "every first layer has one width, so only n - m is identified: the fit "
                  "reports the smallest m that fits (m = 0 unless n - m < 1)",
    "order": "m held (the first layers do not vary heads and head dimension apart)",
}


def calibration_report(study: str, settings: PlanSettings, observations: Sequence[Observation],
                       raw: ConstantsFit, calibrated: ConstantsFit) -> dict[str, Any]:
    rows = [{"architecture": o.label, "trial": o.trial, "trials": o.trials, "loss": o.loss,
             "raw": r, "calibrated": c}
            for o, r, c in zip(observations, raw.predicted, calibrated.predicted)]
    return {
        "study": study, "observations": rows, "raw": _fit_dict(raw),
        "calibrated": _fit_dict(calibrated),
        "width_design": {"design": calibrated.design, "note": DESIGN_NOTE[calibrated.design]},
        "allocation": {"raw": _plan_summary(make_plan(settings)),
                       "calibrated": _plan_summary(make_plan(
                           with_constants(settings, calibrated.constants)))},
        "inputs": {"budget": settings.budget, "kernel": settings.kernel,
                   "input_dim": settings.input_dim, "seq_len": settings.seq_len},
    }


def render(rep: dict[str, Any]) -> str:
    rows = [[r["architecture"], r["trial"], r["trials"], f"{r['loss']:.4g}", f"{r['raw']:.4g}",
             f"{r['calibrated']:.4g}"] for r in rep["observations"]]
    table = render_table(["architecture", "best trial", "trials", "measured", "raw pred.",
                          "calibrated pred."], rows,
                         right=[False, True, True, True, True, True])
    fits = render_table(
        ["constants", "c_proj", "c_head", "n", "m", "scale", "R² (log)", "Spearman"],
        [[name, f"{f['c_proj']:.4g}", f"{f['c_head']:.4g}", f"{f['order']:.3g}",
          f"{f['width_order']:.3g}", f"{f['scale']:.4g}", f"{f['r2']:.3f}",
          f"{f['spearman']:.3f}"]
         for name, f in (("raw", rep["raw"]), ("calibrated", rep["calibrated"]))],
        right=[False] + [True] * 7)
    alloc = render_table(
        ["constants", "extraction layer", "exact heads", "uniform layer"],
        [[name, a["extract_layer"], a["exact"]["heads"],
          f"{a['uniform']['count']} head{'s' if a['uniform']['count'] != 1 else ''} of "
          f"{a['uniform']['dim']}"]
         for name, a in (("raw", rep["allocation"]["raw"]),
                         ("calibrated", rep["allocation"]["calibrated"]))],
        right=[False, False, True, False])
    inp = rep["inputs"]
    return "\n".join([
        f"{PROG}: study {rep['study']} ({len(rows)} architectures, best loss of each)", "",
        table, "", fits, f"width order: {rep['width_design']['note']}", "",
        f"re-solved allocation (D={inp['budget']}, kernel {inp['kernel']}, d_in "
        f"{inp['input_dim']}, N {inp['seq_len']})", alloc])


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--storage", help="SQLAlchemy URL (default: $OPTUNA_STORAGE, then "
                                     "sqlite:///studies.db)")
    p.add_argument("--study", required=True, help="study whose losses to fit")
    p.add_argument("--out", type=Path, help="write the fitted constants (YAML) here")
    p.add_argument("--plot", type=Path, help="measured vs predicted loss (PNG)")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for flag, path in (("--out", args.out), ("--plot", args.plot)):
            if path is not None:
                check_writable(flag, path)
        settings, observations = observations_from_study(args.storage, args.study)
        raw, calibrated = fit(settings, observations)
    except TransformerAllocError as err:
        return fail(PROG, err.text(flag_names(parser)))
    rep = calibration_report(args.study, settings, observations, raw, calibrated)
    if args.out is not None:
        write_constants(args.out, args.study, len(observations), calibrated)
    if args.plot is not None:
        from alloc.plot import plot_calibration  # matplotlib only when asked for

        plot_calibration(rep, args.plot)
        wrote(PROG, args.plot)
    print(render(rep) if args.format == "table" else dump(rep, args.format))
    if args.out is not None:
        print(f"{PROG}: wrote {args.out}; re-solve with: python -m alloc.solve --budget "
              f"{settings.budget} --kernel {settings.kernel} --input-dim {settings.input_dim} "
              f"--seq-len {settings.seq_len} --align {settings.align} --constants {args.out}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
