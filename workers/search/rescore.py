"""A student study's students scored again on windows its search never saw (``confirm``):
what ``python -m workers.confirm`` prints and ``experiments.student_front`` builds on.

A student search picks its best student on the held-out windows every trial is scored on, so
that student's margin is measured on the text that chose it (the winner's curse). ``confirm``
scores the study's fixed allocations, its best sampled students, any trials named and the
teacher on other windows: of another source, or of the study's own held-out source after the
tokens its search scored. Each student is rebuilt from the plan its trial wrote, and every
difference is paired by window against the plan and the best fixed allocation there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import Problem, UsageError
from common.progress import say
from userdata import DataSpec

CONFIRM_TOP = 3  # the best sampled students scored again, by default
CONFIRM_TOKENS = 8192  # new tokens scored at most, by default
FIXED_LABELS = ("plan", "uniform", "palu")  # allocations made before the search measures any
LEARNED_LABELS = ("refit",)  # allocations made from the study's measured students


@dataclass(frozen=True)
class ConfirmRequest:
    """Which study's students are scored again, on what, and which of them."""

    storage: str | None
    study: str | None
    eval: DataSpec
    eval_tokens: int = CONFIRM_TOKENS
    top: int = CONFIRM_TOP
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
    label: str  # plan, uniform, palu, refit, sampled, teacher
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
    """The study's students and its teacher on the new windows, best first."""

    study: str
    teacher: str  # the teacher's path
    cache: str  # the study's measurements of it (``workers.search.student_cache``)
    kv_budget: float  # the study's KV cache budget, a fraction of the teacher's
    calibration: DataSpec  # the study's calibration source
    sample_tokens: int  # and the size of its sample
    source: str
    skipped: int  # tokens of the source's validation split passed over (the search's own)
    windows: int
    seq_len: int
    best_fixed: str  # the fixed allocation lowest on the new windows
    rows: tuple[Rescored, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "teacher": self.teacher, "kv_budget": self.kv_budget,
                "source": self.source, "skipped_tokens": self.skipped,
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

    from .student_cache import eval_windows, open_cache, window_losses
    from .student_trial import teacher_model

    eng = engine(open_storage(resolve_url(request.storage), read_only=True))
    name, attrs = _student_study(query.list_studies(eng), request.study)
    cache = open_cache(Path(str(attrs["cache"])))
    settings = cache.meta["settings"]
    seq_len = int(settings["seq_len"])
    own = Path(str(settings["eval"]["path"])).resolve() == Path(request.eval.path).resolve()
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
    return Confirmation(name, teacher, str(cache.folder), float(attrs["kv_budget"]),
                        DataSpec(**settings["data"]), int(settings["sample_tokens"]),
                        request.eval.path, skip, len(ids), seq_len, best,
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
    """The fixed allocations, the refit plan, the ``top`` best sampled trials on the search's
    windows, and
    the trials ``numbers`` (each once, in the ranking's order).

    Raises:
        UsageError: a number that is no complete trial with window losses, or no plan.
    """
    known = {c.number for c in ranked}
    missing = [n for n in numbers if n not in known]
    if missing:
        raise UsageError.of([Problem("trials", missing[0], "must be a complete trial of the "
                                     f"study (one of {sorted(known)})")])
    sampled = [c for c in ranked if c.label not in FIXED_LABELS + LEARNED_LABELS][:top]
    keep = {c.number for c in ranked if c.label in FIXED_LABELS + LEARNED_LABELS} | \
        {c.number for c in sampled} | set(numbers)
    if not any(c.label == "plan" for c in ranked):
        raise UsageError.of([Problem("study", "", "has no complete plan trial to pair "
                                     "against", shown="")])
    return [c for c in ranked if c.number in keep]


def _student(eng: Any, study: str, number: int, teacher: str, cache: Path) -> Any:
    """Trial ``number``'s student, built from the plan its trial wrote."""
    from search_spaces import Allocation
    from studies import query

    from .protocol import StudentJob, StudentSpec
    from .student_trial import build

    allocation = Allocation.from_dict(json.loads(str(query.trial_attr(eng, study, number,
                                                                       "allocation"))))
    folder = str(query.trial_attr(eng, study, number, "plan_folder"))
    student, _ = build(StudentJob(teacher, str(cache)), StudentSpec(allocation, folder))
    return student


def new_windows(found: Confirmation, eval_tokens: int) -> Any:
    """The windows ``found`` scored its students on, (W, T + 1) ids: for more students on the
    same text."""
    from .student_cache import eval_windows

    return eval_windows(DataSpec(found.source), found.seq_len, eval_tokens, skip=found.skipped)
