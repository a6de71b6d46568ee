"""python -m experiments.heldout_sets --stem STEM DIR [DIR ...]

The held-out experiment's verdicts pooled over several of its runs: sets of corpora registered
and run apart (``heldout --out DIR``, one folder per set) read back from each folder's
``STEM.csv`` (the models' rows) and, where the plans were calibrated, ``STEM_calibration.csv``,
and summed up over all their corpora, development and held-out apart: the plan against each
fixed rule used on every corpus, against the best rule of each corpus, and against the rule each
corpus's calibration picks, each a mean of relative differences with its 95% interval over the
corpora. Nothing is trained or written.

One ``--stem`` names the same run in every folder (its sizes, steps and plan mode: ``heldout``
names its tables by them), so runs of other sizes are never pooled.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, dump, fail, fault, flag_names
from common.errors import Problem, TransformerAllocError, UsageError, excerpt
from experiments.heldout_report import (
    RULES_TITLE,
    SET_TITLES,
    against_picks,
    against_rules,
    rules_table,
)
from userdata.corpora import ROLES

PROG = "experiments.heldout_sets"
# What the pooled sums read of a models' table (``heldout_report.model_row``'s columns)
MODEL_COLUMNS = ("corpus", "role", "model", "arch", "loss", "plan_minus_this", "plan_minus_high",
                 "p_plan_worse", "best_rule")


def read_rows(path: Path, columns: Sequence[str] = ()) -> list[dict[str, str]]:
    """A table's rows.

    Raises:
        UsageError: the table lacks one of ``columns`` (not the table asked for).
    """
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise UsageError.of([Problem("stem", excerpt(str(path)), "not a heldout models' "
                                         f"table (no column {', '.join(missing)})")])
        return list(reader)


def folder_rows(folder: Path, stem: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """One run's models' rows and its calibrations' rows (none where it did not calibrate).

    Raises:
        UsageError: the folder holds no ``STEM.csv``.
    """
    models = folder / f"{stem}.csv"
    if not models.is_file():
        raise UsageError.of([Problem("dirs", excerpt(str(folder)),
                                     f"holds no {stem}.csv (heldout --out writes one per run)")])
    calibrations = folder / f"{stem}_calibration.csv"
    return (read_rows(models, MODEL_COLUMNS),
            read_rows(calibrations, ("role", "plan_minus_pick_relative"))
            if calibrations.is_file() else [])


def pooled(folders: Sequence[Path], stem: str) -> dict[str, Any]:
    """Every folder's run named ``stem``, summed up over all their corpora per role.

    Raises:
        UsageError: a folder without the run, or a corpus in two folders (counted twice).
    """
    models: list[dict[str, str]] = []
    calibrations: list[dict[str, str]] = []
    seen: dict[str, Path] = {}
    for folder in folders:
        rows, calibrated = folder_rows(folder, stem)
        for corpus in dict.fromkeys(r["corpus"] for r in rows):
            if corpus in seen:
                raise UsageError.of([Problem(
                    "dirs", excerpt(str(folder)),
                    f"corpus {corpus!r} is also in {seen[corpus]}: a corpus counts once")])
            seen[corpus] = folder
        models += rows
        calibrations += calibrated
    return {"stem": stem, "folders": [str(f) for f in folders],
            "corpora": {role: sorted({r["corpus"] for r in models if r["role"] == role})
                        for role in ROLES},
            "rules": [asdict(r) for role in ROLES for r in against_rules(models, role)],
            "picks": {role: line for role in ROLES if (line := against_picks(calibrations, role))}}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['stem']} pooled over {', '.join(result['folders'])}"]
    for role in ROLES:
        rules = [r for r in result["rules"] if r["role"] == role]
        if not rules:
            continue
        lines += ["", f"{SET_TITLES[role]}: {', '.join(result['corpora'][role])}",
                  RULES_TITLE, rules_table(rules)]
        if role in result["picks"]:
            lines.append(result["picks"][role])
    if not result["rules"]:
        lines.append("no set has two corpora: nothing to pool")
    return "\n".join(lines)


def build_parser() -> Parser:
    parser = Parser(prog=f"python -m {PROG}", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                        help="a heldout --out folder (one per set of corpora)")
    parser.add_argument("--stem", required=True,
                        help="the run's tables' name in every folder, e.g. "
                             "heldout-steps1200-calibrated5-checked")
    add_format(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = pooled(args.dirs, args.stem)
    except TransformerAllocError as err:
        return fail(PROG, err.text(flag_names(parser, dirs="DIR")))
    except OSError as err:  # a table that could not be read: a fault, not the input
        return fault(PROG, f"reading the tables: {err}")
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
