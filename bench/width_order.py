"""python -m bench.width_order [--noise CSV] [--tradeoff CSV] [--leave-one-out] [--format F]

The bound's width order ``m`` (docs/theory.md §2.3) fitted to head-count grids measured here, next
to the fit with ``m`` held at 0 (the bound before it): the ngram table's points with an MLP at lr
3e-3 (``bench.table_noise``'s CSV: the table's seed-0 value and the three-seed mean of each) and
the attention-only heads-vs-head-dimension grid (``experiments.tradeoff``'s CSV, best of
two learning rates and two seeds). Per fit: the design (what the layers identify of ``n`` and
``m``), the constants, R² of log-loss, Spearman, and the bound's best uniform layer and plan under
them. No training: the losses are read from the CSVs.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from alloc import (
    ConstantsFit,
    Observation,
    PlanSettings,
    WidthDesign,
    fit,
    make_plan,
    with_constants,
)
from arch import HeadGroup, LayerSpec
from common.cli import Parser, add_format, dump, fail, render_table
from common.errors import TransformerAllocError, UsageError

PROG = "bench.width_order"
RESULTS = Path("docs/results")
# The allocator inputs both grids were searched with (workers.search.seeding.plan_settings on
# the ngram task at D = 256: ngram:4, d_in 64, length 64, align 8).
def ngram_settings(mlp_ratio: float) -> PlanSettings:
    return PlanSettings(budget=256, layers=1, seq_len=64, input_dim=64, kernel="ngram:4", align=8,
                        mlp_ratio=mlp_ratio)


def ngram_observations(path: Path, column: str) -> list[Observation]:
    """The ngram table's one-layer points with an MLP (ratio 2), their ``column`` loss."""
    out: list[Observation] = []
    for row in csv.DictReader(path.open()):
        point = json.loads(row["point"])
        if row["table"] != "ngram" or point.get("L0.mlp_ratio") != 2.0:
            continue
        heads, dim = int(point["L0.g0.count"]), int(point["L0.g0.v_dim"])
        layer = LayerSpec("mhsa", (HeadGroup(heads, dim),), mlp_ratio=2.0)
        out.append(Observation(layer.heads_str, layer, float(row[column]), len(out), 3))
    return out


def tradeoff_observations(path: Path) -> list[Observation]:
    """The attention-only grid's best loss per head count."""
    out: list[Observation] = []
    for row in csv.DictReader(path.open()):
        layer = LayerSpec("mhsa", (HeadGroup(int(row["heads"]), int(row["head_dim"])),),
                          mlp_ratio=0.0)
        out.append(Observation(layer.heads_str, layer, float(row["best_loss"]), len(out),
                               int(row["trials"])))
    return out


def fit_row(name: str, settings: PlanSettings, observations: list[Observation],
            design: WidthDesign | None) -> dict[str, Any]:
    """One fit's constants, quality and the plan it gives."""
    _, cal = fit(settings, observations, design)
    return {"data": name, "m": "held at 0" if design else "fitted", **_summary(settings, cal),
            "measured": {o.label: o.loss for o in observations},
            "predicted": dict(zip((o.label for o in observations), cal.predicted))}


def _summary(settings: PlanSettings, f: ConstantsFit) -> dict[str, Any]:
    plan = make_plan(with_constants(settings, f.constants))
    c = f.constants
    return {"design": f.design, "c_proj": c.c_proj, "c_head": c.c_head, "order": c.order,
            "width_order": c.width_order, "r2": f.r2, "spearman": f.spearman,
            "uniform": f"{plan.uniform.count}x{plan.uniform.dim}",
            "plan": plan.arch.layers[0].heads_str}


def leave_one_out(noise: Path) -> list[dict[str, Any]]:
    """The ngram MLP fit (seed 0) without each point in turn: does the rest predict it?"""
    settings, obs = ngram_settings(2.0), ngram_observations(noise, "table_value")
    rows = []
    for i, left in enumerate(obs):
        _, cal = fit(settings, obs[:i] + obs[i + 1:])
        rows.append({"without": left.label, **_summary(settings, cal)})
    return rows


def run(noise: Path, tradeoff: Path) -> list[dict[str, Any]]:
    for flag, path in (("--noise", noise), ("--tradeoff", tradeoff)):
        if not path.is_file():
            raise UsageError(f"{flag} {str(path)!r}: no such file")
    mlp = ngram_settings(2.0)
    attention_only = ngram_settings(0.0)
    data = [("ngram MLP, seed 0", mlp, ngram_observations(noise, "table_value")),
            ("ngram MLP, 3-seed mean", mlp, ngram_observations(noise, "mean")),
            ("attention-only grid", attention_only, tradeoff_observations(tradeoff))]
    held: WidthDesign = "order"
    return [fit_row(name, s, obs, design) for name, s, obs in data for design in (None, held)]


def render(rows: list[dict[str, Any]]) -> str:
    table = render_table(
        ["data", "m", "design", "c_proj", "c_head", "n", "m value", "R²", "Spearman",
         "uniform", "plan"],
        [[r["data"], r["m"], r["design"], f"{r['c_proj']:.3g}", f"{r['c_head']:.3g}",
          f"{r['order']:.3g}", f"{r['width_order']:.3g}", f"{r['r2']:.3f}",
          f"{r['spearman']:.3f}", r["uniform"], r["plan"]] for r in rows],
        right=[False, False, False] + [True] * 6 + [False, False])
    losses = render_table(
        ["data", "m", *rows[0]["measured"]],
        [[r["data"], "measured", *(f"{v:.4f}" for v in r["measured"].values())]
         for r in rows[::2] if r["data"] != "attention-only grid"]
        + [[r["data"], r["m"], *(f"{v:.4f}" for v in r["predicted"].values())]
           for r in rows if r["data"] != "attention-only grid"])
    return f"{table}\n\n{losses}"


def render_loo(rows: list[dict[str, Any]]) -> str:
    return render_table(
        ["ngram MLP, seed 0, without", "n", "m", "m - n", "R²", "uniform"],
        [[r["without"], f"{r['order']:.3g}", f"{r['width_order']:.3g}",
          f"{r['width_order'] - r['order']:+.3f}", f"{r['r2']:.3f}", r["uniform"]] for r in rows],
        right=[False, True, True, True, True, False])


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--noise", type=Path, default=RESULTS / "search_efficiency" / "table_noise.csv",
                   help="bench.table_noise's CSV (default: %(default)s)")
    p.add_argument("--tradeoff", type=Path, default=RESULTS / "tradeoff" / "tradeoff.csv",
                   help="experiments.tradeoff's CSV (default: %(default)s)")
    p.add_argument("--leave-one-out", action="store_true",
                   help="also refit the ngram MLP points without each one in turn")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rows = run(args.noise, args.tradeoff)
        loo = leave_one_out(args.noise) if args.leave_one_out else []
    except TransformerAllocError as err:
        return fail(PROG, str(err))
    if args.format == "table":
        print(render(rows) + (f"\n\n{render_loo(loo)}" if loo else ""))
    else:
        print(dump({"fits": rows, "leave_one_out": loo}, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
