"""python -m workers.search --space aot_vs_standard.yaml --task modadd [--smoke-test]

Search per-layer configurations with Ray Tune while Optuna records every trial in the study
database: a function trainable on ``workers.train``, Optuna's TPE sampler (random, or the space's
grid) asking the study, ASHA stopping bad trials early, and the allocator's plan plus the uniform
baselines evaluated first. ``--resume`` continues a study after Ctrl-C or a killed driver:
finished trials are kept, trials that were running are failed and retried from their last
checkpoint, nothing is left RUNNING. A password in ``--storage`` is moved to ``$PGPASSWORD``
before anything is pickled or logged (``~/.pgpass`` and service files work too).

This module reads the flags and reports; the flags become one checked ``SearchRequest``
(``workers.search.request``) that ``workers.search.driver.execute`` runs, both imported with
Optuna and torch once the flags are read, so that ``--help`` needs neither.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from arch import MAX_WIDTH, SMOKE_TRIAL
from common.cli import Parser, add_format, dump, fail, fault, flag_names, int_in, number
from common.errors import TransformerAllocError, UsageError, shell_word
from search_spaces import SAMPLERS, is_student_space
from workers.search.options import DEFAULT_TRIALS, SearchOptions
from workers.taskargs import TASK_FLAGS, add_task_args, task_spec

if TYPE_CHECKING:
    from workers.search.driver import SearchSummary
    from workers.search.request import SearchRequest
    from workers.search.students import StudentRequest

PROG = "workers.search"
SMOKE_PILOT_STEPS = 20  # --smoke-test: the data's pilot profile only checks that it runs
SMOKE_TRIALS = 6


def build_parser() -> argparse.ArgumentParser:
    d = SearchOptions()
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--space", required=True,
                   help="search-space YAML: a path or a file shipped in search_spaces/")
    add_task_args(p, required=False)  # a space's data: stands in for them
    p.add_argument("--profile", type=Path, default=d.profile,
                   help="allocator inputs measured from the data (python -m workers.profile "
                        "--out); default with --data: the data profiled now")
    p.add_argument("--study", help="study name (default: SPACE-TASK)")
    p.add_argument("--storage", help="SQLAlchemy URL (default: $OPTUNA_STORAGE, then "
                                     "sqlite:///studies.db)")
    p.add_argument("--trials", type=int_in(1),
                   help=f"trials in the study in all (default: {DEFAULT_TRIALS}; the grid "
                        f"size for grid spaces; {SMOKE_TRIALS} with --smoke-test)")
    p.add_argument("--budget", type=int_in(1, MAX_WIDTH),
                   help="width budget D (default: the space's)")
    p.add_argument("--steps", type=int_in(1), help="training steps per trial (default: the "
                                                   "space's)")
    p.add_argument("--address", default=d.address,
                   help="Ray cluster: auto or ray://host:port (default: a local Ray instance)")
    p.add_argument("--cpus-per-trial", type=number(0, strict=True), default=d.cpus_per_trial)
    p.add_argument("--gpus-per-trial", type=number(0), default=d.gpus_per_trial,
                   help="fractions share a GPU; > 0 trains on CUDA")
    p.add_argument("--max-concurrent", type=int_in(1), default=d.max_concurrent,
                   help="trials at once (default: as many as the resources allow)")
    p.add_argument("--sampler", choices=SAMPLERS, default=d.sampler,
                   help="tpe (after the allocator's seeds), random, grid (every point, then "
                        "TPE), or prior (the allocator's bound as a prior that learns from the "
                        "trials: docs/guide/search.md); default: the space's sampler")
    p.add_argument("--prior-temperature", type=number(0, strict=True),
                   default=d.prior_temperature,
                   help="--sampler prior: the prior's spread (its best point is e^(1/T) times "
                        "as likely as its worst)")
    p.add_argument("--warm-start", metavar="STUDY", default=d.warm_start,
                   help="start from another study of --storage: its calibrated constants, and "
                        "its finished trials when it measured the same task")
    p.add_argument("--scheduler", choices=("asha", "fifo"), default=d.scheduler,
                   help="asha stops bad trials early; fifo trains every trial fully")
    p.add_argument("--seed", type=int_in(0), default=d.seed, help="sampler, task and model seed")
    p.add_argument("--resume", action="store_true",
                   help="continue the study: retry trials that were running, run the rest")
    p.add_argument("--smoke-test", action="store_true",
                   help=f"smoke-size task, {SMOKE_TRIAL['steps']} steps per trial, "
                        f"{SMOKE_TRIALS} trials: runs in about a minute")
    p.add_argument("--storage-path", type=Path, default=d.storage_path,
                   help="Ray's experiment directory")
    p.add_argument("--heartbeat-interval", type=int_in(1), default=d.heartbeat_interval,
                   help="seconds between the driver's trial heartbeats")
    add_student_args(p)
    add_fault_args(p, d)
    add_worker_args(p, d)
    p.add_argument("--quiet", action="store_true", default=d.quiet,
                   help="no progress on stderr (the time estimate, then a bar on a terminal, "
                        "else a line per finished trial); errors, the interrupt's advice and "
                        "the result still print")
    add_format(p)
    return p


def add_student_args(p: argparse.ArgumentParser) -> None:
    """A student search's flags: the teacher, the held-out data, the KV cache budget (the
    calibration data is ``--data``; the space a student space, ``search_spaces/students/``)."""
    p.add_argument("--teacher", type=Path,
                   help="search the students of this pretrained checkpoint (a transformers "
                        "folder, a GGUF file or our .pt) with a student space: "
                        "docs/guide/search.md")
    p.add_argument("--eval", type=Path, metavar="TOKENS",
                   help="--teacher: the held-out data every student is scored on (read like "
                        "--data, its validation split)")
    p.add_argument("--kv-cache", type=number(0, strict=True), metavar="F",
                   help="--teacher: the fraction of the teacher's KV cache a student may "
                        "spend at most (the budget)")


def add_fault_args(p: argparse.ArgumentParser, d: SearchOptions) -> None:
    """How long the search waits on a silent driver and on a lost database."""
    p.add_argument("--grace-period", type=int_in(2), default=d.grace_period,
                   help="seconds without heartbeat before a driver counts as dead: --resume "
                   "then takes its study over")
    p.add_argument("--storage-patience", type=int_in(0, 3600), default=d.storage_patience,
                   help="seconds a lost database connection is retried before the search "
                   "stops (exit 1; --resume continues it)")


def add_worker_args(p: argparse.ArgumentParser, d: SearchOptions) -> None:
    """What a worker keeps between trials and between evaluations (store_false flags: the
    option's default is on)."""
    p.add_argument("--no-reuse-actors", dest="reuse_actors", action="store_false",
                   default=d.reuse_actors, help="a new worker per trial")
    p.add_argument("--no-checkpoints", dest="checkpoints", action="store_false",
                   default=d.checkpoints,
                   help="no checkpoint per evaluation (a trial hit by a fault restarts at step 0)")


def setup(args: argparse.Namespace) -> SearchRequest | StudentRequest:
    """The search the flags describe, checked once (``SearchError`` or ``UsageError`` if bad)."""
    from workers.search.request import prepare, read_space

    options = SearchOptions(**{f.name: getattr(args, f.name)
                               for f in dataclasses.fields(SearchOptions) if f.name in args})
    if args.teacher is not None or is_student_space(args.space):
        return student_setup(args, options)
    for flag, value in (("--eval", args.eval), ("--kv-cache", args.kv_cache)):
        if value is not None:
            raise UsageError(f"{flag} {value}: only with --teacher (a student search)")
    space, data = read_space(args.space)
    task = task_spec(args, data)
    if not task.given:
        raise UsageError("--task or --data: one is required")
    # every option has its flag, under the field's name (``points`` has none: Python only)
    return prepare(space, task, storage=args.storage, study=args.study,
                   trials=args.trials or (SMOKE_TRIALS if args.smoke_test else None),
                   resume=args.resume, options=options, budget=args.budget,
                   smoke_test=args.smoke_test, steps=args.steps,
                   pilot_steps=SMOKE_PILOT_STEPS if args.smoke_test else None)


def student_setup(args: argparse.Namespace, options: SearchOptions) -> StudentRequest:
    """A student search the flags describe, checked once."""
    from userdata import data_spec
    from workers.search.students import prepare_student

    missing = [flag for flag, value in (("--teacher", args.teacher), ("--data", args.data),
                                        ("--eval", args.eval), ("--kv-cache", args.kv_cache))
               if value is None]
    if missing:
        raise UsageError(f"{missing[0]}: required by a student search (--space "
                         f"{args.space} --teacher DIR --data TOKENS --eval TOKENS "
                         "--kv-cache F)")
    if args.task is not None:
        raise UsageError(f"--task {args.task}: a student search reads --data, not a task")
    data = data_spec(args)
    assert data is not None  # --data was given
    return prepare_student(args.space, args.teacher, data,
                           dataclasses.replace(data, path=str(args.eval)), args.kv_cache,
                           storage=args.storage, study=args.study, trials=args.trials,
                           resume=args.resume, options=options, smoke_test=args.smoke_test)


def render(summary: SearchSummary) -> str:
    counts = ", ".join(f"{k.lower()} {v}" for k, v in sorted(summary.counts.items()))
    not_run = f"; {summary.not_run} grid point(s) not run" if summary.not_run else ""
    lines = [f"study {summary.study} ({summary.storage}): {summary.status}; {counts}{not_run}"]
    if summary.best is None:
        lines.append("no trial reached the full training budget")
        return "\n".join(lines)
    from studies import allocation_table

    lines += ["best per-layer allocation:", allocation_table(summary.best, summary.metric),
              f"export: {summary.export}"]
    return "\n".join(lines)



# the library's fields in this command's words: the task's, and the study's (workers.search.study)
FLAGS = {**TASK_FLAGS, "study": "--study", "resume": "--resume", "teacher": "--teacher",
         "eval": "--eval", "kv_cache": "--kv-cache", "data": "--data", "sampler": "--sampler",
         "storage_path": "--storage-path"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = flag_names(parser, **FLAGS)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    import optuna

    from studies import StorageFaultError
    from workers.errors import SearchFaultError
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with stdout_aside():
            summary = run_request(setup(args))
    except (StorageFaultError, SearchFaultError) as err:  # a fault, not bad input: --resume
        return fault(PROG, err.text(names))
    except TransformerAllocError as err:
        return fail(PROG, err.text(names))
    print(render(summary) if args.format == "table" else dump(summary.to_dict(), args.format))
    code, note = outcome(summary)
    if note:
        print(f"{PROG}: {note}", file=sys.stderr)
    return code


def run_request(request: SearchRequest | StudentRequest) -> SearchSummary:
    """Run a checked search: a student search's own driver, else the search's."""
    from workers.search.driver import execute
    from workers.search.students import StudentRequest, execute_student

    return execute_student(request) if isinstance(request, StudentRequest) else \
        execute(request)


RAY_DEATH_NOTICE = "A worker died or was killed"  # Ray's words; the search says it per trial


class _RayOutput(io.TextIOBase):
    """``sys.stdout`` while a search runs: what Python code writes there goes to ``stream``,
    except Ray's notice of a dead worker (the monitor's line names the trial and what the
    search did about it)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if RAY_DEATH_NOTICE not in text:
            self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def stdout_aside() -> Iterator[None]:
    """While the search runs, whatever is written to this process's stdout goes to stderr:
    Ray writes there (its driver thread's ``A worker died or was killed ...``, dropped; the
    processes it starts inherit the descriptor), and stdout is the result's alone (``--format
    json`` is one document). Ray stops before the block ends (``driver._execute``)."""
    sys.stdout.flush()
    saved, python = os.dup(1), sys.stdout
    os.dup2(2, 1)
    sys.stdout = _RayOutput(sys.stderr)
    try:
        yield
    finally:
        sys.stdout = python
        os.dup2(saved, 1)
        os.close(saved)


def outcome(summary: SearchSummary) -> tuple[int, str | None]:
    """The exit code of a search (130 interrupted, 1 when every trial that ran failed) and
    what to say of its failures."""
    from studies import SECRET_HINT, has_secret
    from studies.trials import NOT_TRAINED, TrialStatus

    interrupted = {TrialStatus.INTERRUPTED: 130, TrialStatus.TERMINATED: 143}  # 128 + signal
    failed = summary.counts.get("FAIL", 0) - len(summary.retried)  # a retried one ran again
    ran = sum(summary.counts.values()) - len(summary.retried) - sum(
        summary.counts.get(k, 0) for k in ("WAITING", "WARM_START",
                                           *(status.name for status in NOT_TRAINED)))
    where = (f"their errors: python -m studies errors --storage {shell_word(summary.storage)} "
             f"--study {shell_word(summary.study)}"
             + (f"; {SECRET_HINT}" if has_secret(summary.storage) else ""))
    if summary.status in interrupted:  # Ctrl-C, SIGTERM
        return interrupted[summary.status], None  # reported when it happened
    if failed and failed == ran:
        return 1, f"all {failed} trials failed ({where})"
    return 0, f"{failed} of {ran} trials failed ({where})" if failed else None


if __name__ == "__main__":
    sys.exit(main())
