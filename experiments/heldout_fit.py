"""python -m experiments.heldout_fit [--out DIR] [--write FILE] [--smoke-test]

The held-out protocol's fitting step: the bound's constants (``alloc.calibrate``'s ``fit``,
docs/theory.md §6) fitted on the **development** corpora's ledgers of
``experiments.heldout`` only, to be judged on the held-out corpora with ``heldout
--constants FILE``. Per development corpus, every arm the experiment trains there at the
allocator's default constants (the plan and each fixed rule, a model two rules share once) is
an observation: its first layer and its loss, the mean over the paired seeds (the calibration's
``Observation``). The corpora keep their own allocator inputs (profile) and their own scale;
the constants are shared (``alloc.calibrate.fit_groups``). At one width D the heads and the
head dimension of a layer are tied, so only ``n - m`` is identified (``width_design``:
"difference"). Trains nothing: the ledgers must hold every seed of every arm (run ``heldout
--set development`` first). A held-out corpus's row never enters the fit
(``userdata.corpora.require_role``). ``--write`` writes the constants (``alloc.solve
--constants``'s YAML, with the fit's provenance).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from alloc import calibrate, make_plan, with_constants
from arch import ArchConfig
from common.cli import Parser, add_format, check_writable, int_in, render_table
from experiments import harness, heldout as experiment
from userdata import DataSpec, corpora as registry
from userdata.corpora import DEVELOPMENT, HELD_OUT, Role, require_role

NAME = "heldout_fit"
PROG = f"python -m experiments.{NAME}"


def role_of(row: Mapping[str, str]) -> Role:
    """A ledger row's corpus's role: the registry's, else held-out (a user's ``--data``)."""
    entry = registry.CORPORA.get(row["corpus"])
    return HELD_OUT if entry is None else entry.role


def ledger_observations(
    rows: Sequence[Mapping[str, str]], arms: Mapping[str, ArchConfig], seeds: int
) -> list[calibrate.Observation]:
    """The calibration's observations from one development corpus's ledger rows (one recipe):
    each distinct arm of ``arms``, its first layer and its mean loss over seeds ``0..seeds-1``.

    Raises:
        ProtocolError: a row of a held-out corpus (only development data is fitted on).
        UsageError: an arm without a finite loss on every seed (train it first).
    """
    require_role(rows, DEVELOPMENT, role_of, lambda r: r["corpus"])
    return experiment.observations_of(arms, rows, range(seeds), "heldout --set development")


def development_group(
    args: argparse.Namespace, sizes: experiment.Sizes, name: str
) -> calibrate.Group:
    """One development corpus: its allocator inputs (its profile, read from ``--out``) and its
    arms' observations from its ledger."""
    entry = experiment.Entry(name, registry.corpus(name).role, registry.corpus(name).kind)
    out = args.out / name
    spec = experiment.data_of(entry, sizes, out, DataSpec.dtype)
    plan = experiment.corpus_plan(spec, sizes, out, experiment.task_for(spec, sizes, 0), args.quiet)
    recipe = experiment.recipe_id(sizes)
    rows = [r for r in experiment.read_ledger(out / "runs.csv") if r["recipe"] == recipe]
    return calibrate.Group(
        name,
        plan.settings,
        tuple(ledger_observations(rows, experiment.models(plan.arch), sizes.seeds)),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = experiment.sizes_of(args)
    if args.write is not None:
        check_writable("--write", args.write)
    groups = [development_group(args, sizes, name) for name in registry.names(DEVELOPMENT)]
    raw, fitted = calibrate.fit_groups(groups)
    result = report(groups, raw, fitted, sizes)
    if args.write is not None:
        calibrate.write_constants(
            args.write,
            f"{args.out} (heldout ledgers)",
            len(result["observations"]),
            fitted,
            {
                "corpora": [g.name for g in groups],
                "seeds": sizes.seeds,
                "recipe": experiment.recipe_id(sizes),
                "scales": {r["corpus"]: r["scale"] for r in result["plans"]},
            },
        )
        result["wrote"] = str(args.write)
    return result


def report(
    groups: Sequence[calibrate.Group],
    raw: calibrate.ConstantsFit,
    fitted: calibrate.ConstantsFit,
    sizes: experiment.Sizes,
) -> dict[str, Any]:
    """The observations with both fits' predictions, the constants, and each corpus's plan
    under the default and the fitted constants."""
    observations = [(g, o) for g in groups for o in g.observations]
    fit_k = fitted.scales or (fitted.scale,) * len(observations)
    rows = [
        {"corpus": g.name, "architecture": o.label, "loss": o.loss, "raw": r, "calibrated": c}
        for (g, o), r, c in zip(observations, raw.predicted, fitted.predicted)
    ]
    scales = dict(zip((g.name for g, _ in observations), fit_k))
    plans = [
        {
            "corpus": g.name,
            "default": make_plan(g.settings).arch.describe(),
            "fitted": make_plan(with_constants(g.settings, fitted.constants)).arch.describe(),
            "scale": scales[g.name],
        }
        for g in groups
    ]
    return {
        "sizes": {"budget": sizes.budget, "depth": sizes.depth, "seeds": sizes.seeds},
        "observations": rows,
        "design": fitted.design,
        "note": calibrate.DESIGN_NOTE[fitted.design],
        "fits": {
            name: {**f.constants.as_flags(), "r2": f.r2, "spearman": f.spearman}
            for name, f in (("default", raw), ("fitted", fitted))
        },
        "plans": plans,
    }


def render(result: dict[str, Any]) -> str:
    obs = render_table(
        ["corpus", "architecture", "mean loss", "default pred.", "fitted pred."],
        [
            [
                r["corpus"],
                r["architecture"],
                f"{r['loss']:.4f}",
                f"{r['raw']:.4f}",
                f"{r['calibrated']:.4f}",
            ]
            for r in result["observations"]
        ],
        right=[False, False, True, True, True],
    )
    fits = render_table(
        ["constants", "c_proj", "c_head", "n", "m", "n - m", "R² (log)", "Spearman"],
        [
            [
                name,
                f"{f['c_proj']:.4g}",
                f"{f['c_head']:.4g}",
                f"{f['order']:.3g}",
                f"{f['width_order']:.3g}",
                f"{f['order'] - f['width_order']:+.3g}",
                f"{f['r2']:.3f}",
                f"{f['spearman']:.3f}",
            ]
            for name, f in result["fits"].items()
        ],
        right=[False] + [True] * 7,
    )
    plans = render_table(
        ["corpus", "default constants' plan", "fitted constants' plan"],
        [[p["corpus"], p["default"], p["fitted"]] for p in result["plans"]],
    )
    s = result["sizes"]
    lines = [
        f"bound's constants fitted on the development corpora's ledgers (D = {s['budget']}, "
        f"{s['depth']} layers, mean loss over seeds 0-{s['seeds'] - 1}; a scale per corpus)",
        "",
        obs,
        "",
        fits,
        f"width order: {result['note']}",
        "",
        plans,
    ]
    if "wrote" in result:
        lines.append(
            f"\nwrote {result['wrote']}; judge it on the held-out corpora with: python "
            f"-m experiments.heldout --constants {result['wrote']}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    parser.add_argument(
        "--smoke-test",
        action="store_true",
        help="the ledgers of heldout --smoke-test (tiny sizes, tests)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=harness.RESULTS / experiment.NAME,
        help="the heldout run's --out, whose development ledgers are read (default: %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_format(parser)
    parser.add_argument(
        "--write",
        type=Path,
        metavar="FILE",
        help="write the fitted constants here (YAML for alloc.solve --constants "
        "and heldout --constants)",
    )
    parser.add_argument(
        "--seeds",
        type=int_in(2, 50),
        metavar="N",
        help=f"paired seeds 0..N-1 (default: {experiment.FULL.seeds})",
    )
    parser.add_argument(
        "--steps",
        type=int_in(1),
        metavar="STEPS",
        help=f"the recipe's steps (default: {experiment.FULL.steps})",
    )
    # the experiment's default width, depth, pilot and later layers: its ledgers' plans
    parser.set_defaults(budget=None, layers=None, pilot_steps=None, pattern_pilot_steps=None,
                        later_heads=experiment.PATTERNS)
    return parser


def main(argv: list[str] | None = None) -> int:
    return harness.main(build_parser(), argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
