"""python -m experiments.student_front --storage URL --study S --eval tokens/ [--methods ...]

A student search's pick against the published KV cache conversions at the same budget, on
windows the search never saw: ``workers.confirm`` scores the study's fixed allocations, its
best sampled students and the teacher there, then each method of ``experiments.kv_methods``
(Palu, MHA2MLA, TransMLA, plain SVD, ...) is fitted on a calibration sample of the study's own
calibration source and size (random windows of its training split, seed 0) and scored on the
same windows. Every row is paired by window against the search's pick (its best student by the
search's own windows, sampled or refitted): below 0, the row is better than the pick.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.cli import dump, fail, fault, flag_names, int_in, render_table
from common.errors import Problem, TransformerAllocError, UsageError
from common.files import write_atomic
from common.progress import say
from experiments import harness
from userdata import DataSpec
from workers.search import Confirmation, ConfirmRequest, Rescored, confirm

NAME = "student_front"
METHODS = ("palu", "mha2mla", "transmla", "svd")
ALIGN, SMOKE_ALIGN = 8, 2  # the methods' width step (kv_compress's)


@dataclass(frozen=True)
class FrontRow:
    """One student on the new windows, against the search's pick."""

    name: str  # trial N (label), or a method's name
    kv_cache: int | None  # bytes per token (float32)
    loss: float
    difference: float
    low: float
    high: float


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Confirm the study, then score each method on the same windows."""
    import torch

    from arch import kv_cache_bytes
    from common.stats import paired_bootstrap
    from experiments.kv_methods import METHODS as ALL
    from workers.search import new_windows, teacher_model, window_losses

    unknown = [m for m in args.methods if m not in ALL]
    if unknown:
        raise UsageError.of([Problem("methods", unknown[0], f"must be one of {', '.join(ALL)}")])
    found = confirm(ConfirmRequest(args.storage, args.study, DataSpec(str(args.eval)),
                                   args.eval_tokens, args.top, quiet=args.quiet))
    pick = _pick(found)
    budget = found.kv_budget
    ids = new_windows(found, args.eval_tokens)
    teacher = teacher_model(found.teacher)
    cal = _calibration(teacher, found, SMOKE_ALIGN if args.smoke_test else ALIGN, args.quiet)
    rows = [FrontRow(_label(r), r.kv_cache, r.loss,
                     *paired_bootstrap(r.losses, pick.losses)) for r in found.rows]
    for i, method in enumerate(args.methods, 1):
        torch.manual_seed(0)
        student = ALL[method](teacher, cal, budget)
        if student is None:
            say(f"{NAME}: {method} has no student at {budget:g}", quiet=args.quiet)
            continue
        losses = window_losses(student.eval(), ids)
        rows.append(FrontRow(method, kv_cache_bytes(student.arch), float(np.mean(losses)),
                             *paired_bootstrap(losses, pick.losses)))
        say(f"{NAME}: {i}/{len(args.methods)} methods scored ({method})", quiet=args.quiet)
    return {"study": found.study, "source": found.source, "skipped_tokens": found.skipped,
            "windows": found.windows, "seq_len": found.seq_len, "kv_cache": budget,
            "pick": _label(pick), "rows": [
                {"name": r.name, "kv_cache": r.kv_cache, "loss": r.loss,
                 "perplexity": math.exp(r.loss), "vs_pick": r.difference,
                 "interval": [r.low, r.high]} for r in sorted(rows, key=lambda r: r.loss)]}


def _pick(found: Confirmation) -> Rescored:
    """The search's pick: its best student by the search's own windows, of those it made
    (sampled, or refitted to the others)."""
    sampled = [r for r in found.rows if r.label in ("sampled", "refit")
               and r.search_loss is not None]
    if not sampled:
        raise UsageError.of([Problem("study", found.study, "has no complete sampled student "
                                     "to compare", shown="")])
    return min(sampled, key=lambda r: r.search_loss or math.inf)


def _label(row: Rescored) -> str:
    return row.label if row.number is None else f"trial {row.number} ({row.label})"


def _calibration(teacher: Any, found: Confirmation, align: int, quiet: bool) -> Any:
    """``kv_methods``' calibration on random windows of the study's calibration source's
    training split, as many tokens as the study's sample (seed 0)."""
    import torch

    from experiments.kv_methods import calibrate
    from userdata import open_tokens

    seq_len = found.seq_len
    tokens = open_tokens(found.calibration, seq_len + 1).train
    rng = np.random.default_rng(0)
    count = max(1, found.sample_tokens // seq_len)
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=count)
    ids = torch.stack([torch.from_numpy(np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64))
                       for s in starts])
    return calibrate(teacher, ids[:, :-1], ids[:, 1:], 0, align, quiet)


def render(result: dict[str, Any]) -> str:
    rows = [[r["name"], f"{r['kv_cache']:,}" if r["kv_cache"] else "-", f"{r['loss']:.4f}",
             f"{r['perplexity']:.2f}",
             "-" if r["name"] == result["pick"] else
             f"{r['vs_pick']:+.4f} [{r['interval'][0]:+.4f}, {r['interval'][1]:+.4f}]"]
            for r in result["rows"]]
    skipped = f" after the search's first {result['skipped_tokens']:,} tokens" \
        if result["skipped_tokens"] else ""
    return (f"study {result['study']} at KV cache {result['kv_cache']:g}, on {result['windows']} "
            f"new windows of {result['seq_len']} tokens of {result['source']}{skipped}; paired "
            f"by window against the search's pick, {result['pick']} (95% bootstrap interval; "
            "below 0: better than the pick)\n" + render_table(
                ["student", "KV bytes/token", "loss", "perplexity", "vs the pick"], rows,
                right=[False, True, True, True, False]))


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--storage", help="the student search's SQLAlchemy URL (default: "
                                          "$OPTUNA_STORAGE, then sqlite:///studies.db)")
    parser.add_argument("--study", help="the student search's study (default: the only one)")
    parser.add_argument("--eval", type=Path, required=True, metavar="TOKENS",
                        help="token data of the new windows (workers.confirm's --eval)")
    parser.add_argument("--eval-tokens", type=int_in(1), default=8192, metavar="N")
    parser.add_argument("--top", type=int_in(1), default=3, metavar="K",
                        help="the study's K best sampled students confirmed")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help="experiments.kv_methods' methods (default: %(default)s)")
    args = parser.parse_args(argv)
    names = flag_names(parser)
    from studies import StorageFaultError

    try:
        result = run(args)
    except StorageFaultError as err:
        return fault(f"experiments.{NAME}", err.text(names))
    except TransformerAllocError as err:
        return fail(f"experiments.{NAME}", err.text(names))
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / f"{NAME}.json", dump(result, "json"))
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
