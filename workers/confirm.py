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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from common.errors import Problem, TransformerAllocError, UsageError
from common.progress import say
from userdata import DataSpec

PROG = "workers.confirm"
TOP = 3
EVAL_TOKENS = 8192
FIXED_LABELS = ("plan", "uniform", "palu")


@dataclass(frozen=True)
class ConfirmRequest:
    """Which study's students are scored again, on what, and which of them."""

    storage: str | None
    study: str | None
    eval: DataSpec
    eval_tokens: int = EVAL_TOKENS
    top: int = TOP
    trials: tuple[int, ...] = ()
    quiet: bool = False


@dataclass(frozen=True)
class Paired:
    """A mean difference of losses paired by window and its 95% bootstrap interval (below 0:
    better)."""

    difference: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.difference:+.4f} [{self.low:+.4f}, {self.high:+.4f}]"


@dataclass(frozen=True)
class Rescored:
    """One student on the new windows: its loss on each, against the plan and against the
    best fixed allocation on these windows."""

    number: int | None  # None: the teacher
    label: str  # plan, uniform, palu, sampled, teacher
    kv_cache: int | None  # bytes per token
    search_loss: float | None  # its loss on the search's own windows
    losses: tuple[float, ...]
    vs_plan: Paired
    vs_fixed: Paired

    @property
    def loss(self) -> float:
        return sum(self.losses) / len(self.losses)


@dataclass(frozen=True)
class Confirmation:
    study: str
    source: str
    skipped: int  # tokens of the source's validation split passed over (the search's own)
    windows: int
    seq_len: int
    best_fixed: str  # the fixed allocation lowest on the new windows
    rows: tuple[Rescored, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "source": self.source, "skipped_tokens": self.skipped,
                "windows": self.windows, "seq_len": self.seq_len,
                "best_fixed": self.best_fixed, "trials": [
                    {"number": r.number, "label": r.label, "kv_cache": r.kv_cache,
                     "search_loss": r.search_loss, "loss": r.loss,
                     "perplexity": math.exp(r.loss),
                     "vs_plan": {"difference": r.vs_plan.difference,
                                 "interval": [r.vs_plan.low, r.vs_plan.high]},
                     "vs_best_fixed": {"difference": r.vs_fixed.difference,
                                       "interval": [r.vs_fixed.low, r.vs_fixed.high]}}
                    for r in self.rows]}


def confirm(request: ConfirmRequest) -> Confirmation:
    """Score the chosen students of a student study on windows its search never saw.

    Raises:
        UsageError: not a student study, or no plan trial; StorageError, QueryError,
        DataError: one line each.
    """
    from common.stats import paired_bootstrap
    from studies import engine, open_storage, query, resolve_url
    from workers.search.student_cache import eval_windows, open_cache, window_losses
    from workers.search.student_trial import teacher_model

    eng = engine(open_storage(resolve_url(request.storage), read_only=True))
    name, attrs = _student_study(query.list_studies(eng), request.study)
    cache = open_cache(Path(str(attrs["cache"])))
    seq_len = int(cache.meta["settings"]["seq_len"])
    own = Path(str(cache.meta["settings"]["eval"]["path"])).resolve() == \
        Path(request.eval.path).resolve()
    skip = int(cache.meta["eval_windows"]) * seq_len if own else 0  # the search's windows
    ids = eval_windows(request.eval, seq_len, request.eval_tokens, skip=skip)
    _, ranked = query.compare_windows(eng, name)
    chosen = choose(ranked, request.top, request.trials)
    say(f"confirm: the teacher and {len(chosen)} students of {name} on {len(ids)} windows of "
        f"{seq_len} tokens of {request.eval.path}"
        + (f" after the search's first {skip:,}" if skip else ""), quiet=request.quiet)
    teacher = str(attrs["teacher"])
    scored = [(None, "teacher", None, None, window_losses(teacher_model(teacher), ids))]
    for i, c in enumerate(chosen, 1):
        student = _student(eng, name, c.number, teacher, cache.folder)
        scored.append((c.number, c.label or "sampled", c.kv_cache, c.loss,
                       window_losses(student, ids)))
        say(f"confirm: {i}/{len(chosen)} students scored (trial {c.number})",
            quiet=request.quiet)
    fixed = {label: losses for _, label, _, _, losses in scored if label in FIXED_LABELS}
    best = min(fixed, key=lambda label: float(fixed[label].mean()))
    rows = [Rescored(number, label, kv, search, tuple(float(v) for v in losses),
                     Paired(*paired_bootstrap(losses, fixed["plan"])),
                     Paired(*paired_bootstrap(losses, fixed[best])))
            for number, label, kv, search, losses in scored]
    return Confirmation(name, request.eval.path, skip, len(ids), seq_len, best,
                        tuple(sorted(rows, key=lambda r: r.loss)))


def _student_study(summaries: Sequence[Any], study: str | None) -> tuple[str, dict[str, Any]]:
    """The study's name and attrs: named, or the storage's only one; a student search's."""
    by_name = {s.name: s for s in summaries}
    name = study if study is not None else (next(iter(by_name)) if len(by_name) == 1 else "")
    if name not in by_name or by_name[name].attrs.get("kind") != "student":
        raise UsageError.of([Problem("study", name, "must name a student search's study "
                                     "(workers.search --teacher) in the storage")])
    return name, dict(by_name[name].attrs)


def choose(ranked: Sequence[Any], top: int, numbers: Sequence[int]) -> list[Any]:
    """The fixed allocations, the ``top`` best sampled trials on the search's windows, and
    the trials ``numbers`` (each once, in the ranking's order).

    Raises:
        UsageError: a number that is no complete trial with window losses, or no plan.
    """
    known = {c.number for c in ranked}
    missing = [n for n in numbers if n not in known]
    if missing:
        raise UsageError.of([Problem("trials", missing[0], "must be a complete trial of the "
                                     f"study (one of {sorted(known)})")])
    sampled = [c for c in ranked if c.label not in FIXED_LABELS][:top]
    keep = {c.number for c in ranked if c.label in FIXED_LABELS} | \
        {c.number for c in sampled} | set(numbers)
    if not any(c.label == "plan" for c in ranked):
        raise UsageError.of([Problem("study", "", "has no complete plan trial to pair "
                                     "against", shown="")])
    return [c for c in ranked if c.number in keep]


def _student(eng: Any, study: str, number: int, teacher: str, cache: Path) -> Any:
    """Trial ``number``'s student, built from the plan its trial wrote."""
    import json

    from search_spaces import Allocation
    from studies import query
    from workers.search.protocol import StudentJob, StudentSpec
    from workers.search.student_trial import build

    allocation = Allocation.from_dict(json.loads(str(query.trial_attr(eng, study, number,
                                                                       "allocation"))))
    folder = str(query.trial_attr(eng, study, number, "plan_folder"))
    student, _ = build(StudentJob(teacher, str(cache)), StudentSpec(allocation, folder))
    return student


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
    p.add_argument("--eval-tokens", type=int_in(1), default=EVAL_TOKENS, metavar="N",
                   help="tokens of new windows at most (default: %(default)s)")
    p.add_argument("--top", type=int_in(0), default=TOP, metavar="K",
                   help="the K best sampled students by the search's own windows (default: "
                        "%(default)s)")
    p.add_argument("--trials", type=int_in(0), nargs="+", default=[], metavar="N",
                   help="more trials to score")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_format(p)
    return p


def request_of(args: argparse.Namespace) -> ConfirmRequest:
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
