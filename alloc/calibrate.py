"""python -m alloc.calibrate --storage URL --study NAME [--out constants.yaml] [--plot fit.png]

Fit the bound's constants ``c_proj``, ``c_head`` and the order ``n`` to the losses a study measured
(docs/theory.md §6): least squares on log-loss, ``log y = log k + log E(arch; c_proj, c_head, n)``,
with the constants kept positive (fitted as logs), ``n`` in [1, 6] and the scale ``k`` (loss units
per unit of bound) solved in closed form. Each architecture counts once, with its best fully trained
loss over learning rates and seeds (the paper's estimate of the approximation error). Prints the fit
(R² of log-loss, Spearman rank correlation) next to the raw constants' fit, and the allocation
re-solved with the fitted constants next to the raw one; ``--out`` writes the constants for ``python
-m alloc.solve --constants``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alloc.constants import Constants, to_yaml
from alloc.errors import CalibrationError, PlanError
from alloc.plan import Plan, make_plan, predicted_error
from alloc.settings import PlanSettings
from arch import HeadGroup, LayerSpec
from common.cli import Parser, add_format, check_writable, dump, fail, render_table, wrote
from common.errors import TransformerAllocError
from common.files import write_atomic

PROG = "alloc.calibrate"


ORDER_RANGE = (1.0, 6.0)
LOG_C_RANGE = (-12.0, 12.0)  # c in [6e-6, 1.6e5]: wide, but keeps the optimiser finite
# Coarse grid over (log c_proj, log c_head, n) whose best points start the local fits.
_GRID = [(p, h, n) for p in (-4.0, -1.0, 2.0) for h in (-4.0, -1.0, 2.0)
         for n in (1.0, 2.0, 4.0)]


@dataclass(frozen=True)
class Observation:
    """One architecture's first layer and its best measured loss."""

    label: str
    layer: LayerSpec
    loss: float
    trial: int  # the trial that measured ``loss``
    trials: int  # fully trained trials of this architecture


@dataclass(frozen=True)
class ConstantsFit:
    constants: Constants
    scale: float
    r2: float  # of log-loss
    spearman: float
    bound: tuple[float, ...]  # E per observation under ``constants`` (unscaled)

    @property
    def predicted(self) -> tuple[float, ...]:
        """Predicted loss per observation: ``scale * E``."""
        return tuple(self.scale * e for e in self.bound)


def with_constants(settings: PlanSettings, constants: Constants) -> PlanSettings:
    return dataclasses.replace(settings, c_proj=constants.c_proj, c_head=constants.c_head,
                               order=constants.order)


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


def _score(settings: PlanSettings, observations: Sequence[Observation],
           constants: Constants) -> ConstantsFit:
    """Best scale for ``constants`` and the fit's quality."""
    from scipy.stats import spearmanr  # SciPy's stats and optimize take 0.5 s to import

    e = bounds(settings, observations, constants)
    log_y = np.log([o.loss for o in observations])
    gap = log_y - np.log(e)
    log_k = float(gap.mean())
    sse = float(((gap - log_k) ** 2).sum())
    sst = float(((log_y - log_y.mean()) ** 2).sum())
    r2 = 1.0 - sse / sst if sst > 0 else 1.0
    rho = float(spearmanr(e, log_y).statistic) if len(set(e.tolist())) > 1 else 0.0
    return ConstantsFit(constants, math.exp(log_k), r2, rho if math.isfinite(rho) else 0.0,
               tuple(e.tolist()))


def _constants(theta: np.ndarray) -> Constants:
    return Constants(math.exp(theta[0]), math.exp(theta[1]), float(theta[2]))


def fit(settings: PlanSettings, observations: Sequence[Observation]
        ) -> tuple[ConstantsFit, ConstantsFit]:
    """(raw, calibrated): the settings' own constants with only the scale fitted, and the least
    squares constants. The calibrated fit nests the raw one, so its R² is never lower."""
    from scipy.optimize import least_squares

    if len(observations) < 4:
        raise CalibrationError("calibration needs at least 4 architectures with a full-budget "
                               f"loss (3 constants + the scale); the study has {len(observations)}")
    log_y = np.log([o.loss for o in observations])

    def residuals(theta: np.ndarray) -> np.ndarray:
        gap = log_y - np.log(bounds(settings, observations, _constants(theta)))
        return gap - gap.mean()

    raw = _score(settings, observations, Constants(settings.c_proj, settings.c_head,
                                                   settings.order))
    starts = sorted(_GRID, key=lambda t: float((residuals(np.array(t)) ** 2).sum()))[:3]
    starts.append((math.log(settings.c_proj), math.log(settings.c_head), settings.order))
    low = [LOG_C_RANGE[0], LOG_C_RANGE[0], ORDER_RANGE[0]]
    high = [LOG_C_RANGE[1], LOG_C_RANGE[1], ORDER_RANGE[1]]
    best = raw
    for start in starts:
        x0 = np.clip(np.array(start, float), low, high)
        result = least_squares(residuals, x0, bounds=(low, high), diff_step=1e-3)
        candidate = _score(settings, observations, _constants(result.x))
        if candidate.r2 > best.r2:
            best = candidate
    return raw, best


# --- reading the study -----------------------------------------------------------------------


def observations_from_study(url: str | None, study: str) -> tuple[PlanSettings,
                                                                   list[Observation]]:
    """The allocator inputs the search recorded and the best loss of each architecture."""
    from studies import engine, open_storage, query
    from studies.trials import TrialRecord

    eng = engine(open_storage(url, read_only=True))
    summaries = {s.name: s for s in query.list_studies(eng)}
    if study not in summaries:
        raise CalibrationError(f"--study {study!r}: no such study; studies: "
                         f"{', '.join(summaries) or '(none)'}")
    summary = summaries[study]
    if summary.direction != "MINIMIZE":
        raise CalibrationError(f"--study {study!r}: its metric is maximised "
                         f"({summary.attrs.get('metric', '?')}); calibration fits a loss")
    if "alloc_inputs" not in summary.attrs:
        raise CalibrationError(f"--study {study!r}: has no allocator inputs (study attr "
                         "alloc_inputs); run it with python -m workers.search")
    try:
        settings = PlanSettings.from_dict(json.loads(summary.attrs["alloc_inputs"]))
    except (ValueError, PlanError) as err:
        raise CalibrationError(f"--study {study!r}: its recorded allocator inputs are unusable "
                               f"({err})") from None
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
            raise CalibrationError(f"--study {study!r}: trial {best.number} has loss "
                                   f"{best.value:g}; log-loss needs positive values")
        out.append(Observation(" | ".join(x.heads_str for x in best.arch.layers),
                               best.arch.layers[0], best.value, best.number, len(records)))
    return settings, sorted(out, key=lambda o: (o.layer.n_heads, o.label))


def write_constants(path: Path, study: str, architectures: int, fitted: ConstantsFit) -> None:
    """The fitted constants for ``alloc.solve --constants``, with the fit's provenance."""
    meta = {"study": study, "architectures": architectures, "r2": fitted.r2,
            "spearman": fitted.spearman}
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


def calibration_report(study: str, settings: PlanSettings, observations: Sequence[Observation],
                       raw: ConstantsFit, calibrated: ConstantsFit) -> dict[str, Any]:
    rows = [{"architecture": o.label, "trial": o.trial, "trials": o.trials, "loss": o.loss,
             "raw": r, "calibrated": c}
            for o, r, c in zip(observations, raw.predicted, calibrated.predicted)]
    return {
        "study": study, "observations": rows, "raw": _fit_dict(raw),
        "calibrated": _fit_dict(calibrated),
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
        ["constants", "c_proj", "c_head", "n", "scale", "R² (log)", "Spearman"],
        [[name, f"{f['c_proj']:.4g}", f"{f['c_head']:.4g}", f"{f['order']:.3g}",
          f"{f['scale']:.4g}", f"{f['r2']:.3f}", f"{f['spearman']:.3f}"]
         for name, f in (("raw", rep["raw"]), ("calibrated", rep["calibrated"]))],
        right=[False] + [True] * 6)
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
        table, "", fits, "",
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

    args = build_parser().parse_args(argv)
    try:
        for flag, path in (("--out", args.out), ("--plot", args.plot)):
            if path is not None:
                check_writable(flag, path)
        settings, observations = observations_from_study(args.storage, args.study)
        raw, calibrated = fit(settings, observations)
    except TransformerAllocError as err:
        return fail(PROG, str(err))
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
