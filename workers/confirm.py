"""python -m workers.confirm --storage URL --study S --eval tokens/ [--top K] [--trials N ...]

A student search picks its best student on the held-out windows every trial is scored on, so
that student's margin over the fixed allocations is measured on the same text that chose it
(the winner's curse: the best of many noisy scores is optimistic). This command scores the
study's fixed allocations (the allocator's plan, uniform widths, Palu's shares), its K best
sampled students and any trials named, and the teacher, on windows the search never saw: of
another source, or of the study's own held-out source after the tokens it scored. Each student
is rebuilt from the plan its trial wrote (what ``studies export --trial N`` copies), and every
difference is paired by window against the plan with a 95% bootstrap interval. Nothing is
written: the study is read, the students are built in memory.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.cli import (
    Parser,
    add_format,
    dump,
    fail,
    fault,
    flag_names,
    int_in,
    render_table,
)
from common.errors import TransformerAllocError
from userdata import DataSpec
from workers.search import CONFIRM_TOKENS, CONFIRM_TOP

if TYPE_CHECKING:
    from workers.search import Confirmation, ConfirmRequest

PROG = "workers.confirm"


# --- the command ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--storage", help="SQLAlchemy URL (default: $OPTUNA_STORAGE, then "
                                     "sqlite:///studies.db)")
    p.add_argument("--study", help="the student search's study (default: the only study)")
    p.add_argument("--eval", type=Path, required=True, metavar="TOKENS",
                   help="token data in the teacher's vocabulary (a folder of train.bin and "
                        "val.bin) whose validation split gives the new windows; the study's own "
                        "held-out data is read after the windows the search scored")
    p.add_argument("--eval-tokens", type=int_in(1), default=CONFIRM_TOKENS, metavar="N",
                   help="tokens of new windows at most (default: %(default)s)")
    p.add_argument("--top", type=int_in(0), default=CONFIRM_TOP, metavar="K",
                   help="the K best sampled students by the search's own windows (default: "
                        "%(default)s)")
    p.add_argument("--trials", type=int_in(0), nargs="+", default=[], metavar="N",
                   help="more trials to score")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_format(p)
    return p


def request_of(args: argparse.Namespace) -> ConfirmRequest:
    from workers.search import ConfirmRequest

    return ConfirmRequest(args.storage, args.study, DataSpec(str(args.eval)), args.eval_tokens,
                          args.top, tuple(args.trials), args.quiet)


def render(result: Confirmation) -> str:
    rows = [["-" if r.number is None else r.number, r.label,
             f"{r.kv_cache:,}" if r.kv_cache else "-",
             "-" if r.search_loss is None else f"{r.search_loss:.4f}", f"{r.loss:.4f}",
             f"{math.exp(r.loss):.2f}", "-" if r.label == "plan" else str(r.vs_plan),
             "-" if r.label == result.best_fixed else str(r.vs_fixed)]
            for r in result.rows]
    skipped = f", after the search's first {result.skipped:,} tokens" if result.skipped else ""
    return (f"study {result.study} on {result.windows} new windows of {result.seq_len} tokens "
            f"of {result.source}{skipped}; paired by window (95% bootstrap interval; below 0: "
            f"better) against the plan and the best fixed allocation here "
            f"({result.best_fixed})\n" + render_table(
                ["trial", "student", "KV bytes/token", "search loss", "new loss", "perplexity",
                 "vs plan", "vs best fixed"], rows,
                right=[True, False, True, True, True, True, False, False]))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = flag_names(parser)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    from studies import StorageFaultError
    from workers.search import confirm

    try:
        result = confirm(request_of(args))
    except StorageFaultError as err:
        return fault(PROG, err.text(names))
    except TransformerAllocError as err:
        return fail(PROG, err.text(names))
    print(render(result) if args.format == "table" else dump(result.to_dict(), args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
