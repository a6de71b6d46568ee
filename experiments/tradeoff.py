"""python -m experiments.tradeoff [--smoke-test] [--out results/tradeoff] [--steps 2000]

Heads vs head dimension (Yu et al., 2025, §6.1): at a fixed width D, one attention layer of H heads
of dimension D/H, H in {1, 2, 4, ..., D/4}, trained on the ngram task (y_t = x_{t-1} + ... + x_{t-4}
+ noise) for every learning rate and seed; the best loss per H estimates the approximation error (as
in the paper). The grid runs through ``workers.search`` into a study; ``alloc.calibrate`` then fits
the bound's constants to it. Writes ``tradeoff.csv`` (H, d, best loss, raw and calibrated
prediction), ``tradeoff.png`` (loss vs H) and ``constants.yaml``, and prints the measured best H
next to the H the raw and the calibrated allocator predict.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc import calibrate
from common.cli import int_in, render_table
from common.files import write_csv, write_yaml
from common.plots import new_figure, write_figure
from experiments import harness
from search_spaces import load_space
from workers.search import training_budget
from workers.tasks import make_task

NAME = "tradeoff"
STUDY = "tradeoff-ngram"


@dataclass(frozen=True)
class Sizes:
    budget: int
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]


SMOKE = Sizes(budget=32, lrs=(1.0e-2,), seeds=(0, 1))
FULL = Sizes(budget=256, lrs=(1.0e-3, 3.0e-3), seeds=(0, 1))


def space_data(budget: int, lrs: list[float], seeds: list[int], steps: int) -> dict[str, Any]:
    """The shipped ``heads_vs_dim.yaml`` at ``budget``, H up to D/4, every lr and seed."""
    shipped = load_space("heads_vs_dim").data
    heads = [2**k for k in range(budget.bit_length()) if 2**k <= budget // 4]
    return {**shipped, "name": NAME, "budget": budget,
            "description": "Yu et al. (2025) §6.1: H heads of D/H at fixed D",
            "layers": [{**shipped["layers"][0], "heads": heads}],
            "train": {**shipped["train"], "steps": steps, "eval_every": max(1, steps // 20),
                      "lr": lrs, "seed": seeds}}


def table(observations: list[calibrate.Observation], raw: calibrate.ConstantsFit,
          cal: calibrate.ConstantsFit) -> list[dict[str, Any]]:
    """One row per head count H (one head group of d = D/H per architecture)."""
    rows = []
    for o, r, c in zip(observations, raw.predicted, cal.predicted):
        (group,) = o.layer.heads
        rows.append({"heads": group.count, "head_dim": group.v_dim, "trials": o.trials,
                     "best_trial": o.trial, "best_loss": o.loss, "raw_prediction": r,
                     "calibrated_prediction": c})
    return sorted(rows, key=lambda r: r["heads"])


def best_heads(rows: list[dict[str, Any]], key: str) -> int:
    return int(min(rows, key=lambda r: (r[key], r["heads"]))["heads"])


def plot(rows: list[dict[str, Any]], rep: dict[str, Any], budget: int, path: Path) -> None:
    fig, ax = new_figure(1, (6.4, 4.4))
    heads = [r["heads"] for r in rows]
    ax.plot(heads, [r["best_loss"] for r in rows], "o-", color="k", lw=2,
            label="measured: best over lr and seed")
    raw, cal = rep["raw"], rep["calibrated"]
    ax.plot(heads, [r["raw_prediction"] for r in rows], "s--", color="C0",
            label=f"raw bound (c_proj 1, c_head 1, n 2) x scale; R² {raw['r2']:.2f}")
    ax.plot(heads, [r["calibrated_prediction"] for r in rows], "^-", color="C3",
            label=f"calibrated (c_proj {cal['c_proj']:.2g}, c_head {cal['c_head']:.2g}, "
                  f"n {cal['order']:.2g}); R² {cal['r2']:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(heads, [f"{h}\n(d={budget // h})" for h in heads])
    ax.set_xlabel(f"heads H (head dim d = {budget}/H)")
    ax.set_ylabel("validation MSE (ngram task)")
    ax.set_title(f"heads vs head dimension at D = {budget}")
    ax.legend(fontsize=8)
    write_figure(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workers.search import ray_session  # Ray: only when the experiment runs, not for --help

    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    url = harness.storage_url(args, NAME)
    steps = args.steps or (40 if args.smoke_test else 2000)
    data = space_data(sizes.budget, list(sizes.lrs), list(sizes.seeds), steps)
    path = write_yaml(args.out / "tradeoff_space.yaml", data)
    trials = len(data["layers"][0]["heads"]) * len(sizes.lrs) * len(sizes.seeds)
    grid = training_budget(load_space(path), args.smoke_test, steps)
    task = make_task("ngram", "smoke" if args.smoke_test else "paper")
    with ray_session():
        harness.search(grid, task, trials, url, STUDY, args.out / "ray_results",
                       quiet=args.quiet)
    settings, observations = calibrate.observations_from_study(url, STUDY)
    raw, cal = calibrate.fit(settings, observations)
    rep = calibrate.calibration_report(STUDY, settings, observations, raw, cal)
    rows = table(observations, raw, cal)
    write_csv(args.out / "tradeoff.csv", rows)
    calibrate.write_constants(args.out / "constants.yaml", STUDY, len(observations), cal)
    plot(rows, rep, settings.budget, args.out / "tradeoff.png")
    return {"budget": settings.budget, "input_dim": settings.input_dim, "steps": steps,
            "rows": rows, "measured_best_heads": best_heads(rows, "best_loss"),
            "raw_best_heads": best_heads(rows, "raw_prediction"),
            "calibrated_best_heads": best_heads(rows, "calibrated_prediction"),
            "raw": rep["raw"], "calibrated": rep["calibrated"],
            "allocation": rep["allocation"], "out": str(args.out)}


def render(result: dict[str, Any]) -> str:
    rows = [[r["heads"], r["head_dim"], r["trials"], f"{r['best_loss']:.4g}",
             f"{r['raw_prediction']:.4g}", f"{r['calibrated_prediction']:.4g}"]
            for r in result["rows"]]
    raw, cal = result["raw"], result["calibrated"]
    alloc = result["allocation"]
    return "\n".join([
        f"tradeoff: D={result['budget']}, d_in={result['input_dim']}, {result['steps']} steps",
        render_table(["H", "d", "trials", "best loss", "raw pred.", "calibrated pred."], rows),
        "",
        f"measured best H: {result['measured_best_heads']}; predicted best H among these: raw "
        f"{result['raw_best_heads']} (R² {raw['r2']:.2f}, Spearman {raw['spearman']:.2f}), "
        f"calibrated {result['calibrated_best_heads']} (R² {cal['r2']:.2f}, Spearman "
        f"{cal['spearman']:.2f})",
        f"allocator's uniform layer: raw {alloc['raw']['uniform']['count']} heads of "
        f"{alloc['raw']['uniform']['dim']}, calibrated {alloc['calibrated']['uniform']['count']}"
        f" heads of {alloc['calibrated']['uniform']['dim']}",
        f"wrote {result['out']}/tradeoff.csv, tradeoff.png, constants.yaml"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__, studies=True)
    parser.add_argument("--steps", type=int_in(1), help="training steps per trial "
                                                        "(default: 2000; 40 with --smoke-test)")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
