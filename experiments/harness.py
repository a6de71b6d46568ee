"""What every experiment shares: its command line, its output folder (CSV table, PNG plot,
study database), its progress on stderr (``--quiet`` silences it), and a search through
``workers.search.run_search``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.cli import Parser, add_format, dump, fail, fault, flag_names
from common.errors import TransformerAllocError, UsageError
from common.progress import Progress
from search_spaces import SearchSpace
from userdata import data_flags
from workers.errors import SearchFaultError

if TYPE_CHECKING:
    from workers.search import SearchSummary
    from workers.tasks import Task
    from workers.training import Trainer, TrainResult

RESULTS = Path("results")


def build_parser(name: str, doc: str, studies: bool = False) -> argparse.ArgumentParser:
    """``--smoke-test``, ``--out``, ``--format``, and ``--storage`` for experiments that search
    (``studies``); experiments add their own flags."""
    p = Parser(prog=f"python -m experiments.{name}", description=doc.split("\n\n")[1])
    p.add_argument("--smoke-test", action="store_true",
                   help="tiny sizes (tests): runs in well under a minute")
    p.add_argument("--out", type=Path, default=RESULTS / name,
                   help="folder for the CSV table and the PNG plot"
                        + (" and the study database" if studies else ""))
    if studies:
        p.add_argument("--storage",
                       help="SQLAlchemy URL of the study database (default: SQLite in --out)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (each stage and run, the trainings' steps, the "
                        "searches' trials: a bar on a terminal, else a line per event); "
                        "errors and the result still print")
    add_format(p)
    return p


def runs(args: argparse.Namespace, name: str, total: int, what: str = "runs",
         start: str = "") -> Progress:
    """The progress of an experiment's ``total`` runs (students, searches, corpora): mark each
    done with ``update(1)`` then ``event("...")`` (``run 3/25 ...``, the time left)."""
    return Progress(name, total=total, unit=what, quiet=args.quiet, start=start)


def train(trainer: Trainer, desc: str, args: argparse.Namespace) -> TrainResult:
    """``trainer.run()`` (resumed where its checkpoint was) with the trainer's progress."""
    from workers.training import describe_run, run_with_progress

    return run_with_progress(trainer, desc, args.quiet, start=describe_run(trainer))


def prepare(args: argparse.Namespace) -> None:
    """Create the output folder."""
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {str(args.out)!r}: exists and is not a folder")
    args.out.mkdir(parents=True, exist_ok=True)


def storage_url(args: argparse.Namespace, name: str) -> str:
    """``--storage``, else a SQLite file ``NAME.db`` in the output folder."""
    return str(args.storage or f"sqlite:///{(args.out / f'{name}.db').resolve()}")


def study_exists(url: str, study: str) -> bool:
    import optuna

    from studies import open_storage

    return study in optuna.get_all_study_names(storage=open_storage(url))


def search(space: SearchSpace, task: Task, trials: int, url: str, study: str, results: Path,
           scheduler: str = "fifo", profile: Path | None = None,
           quiet: bool = False, points: tuple[Mapping[str, Any], ...] = ()) -> SearchSummary:
    """``workers.search.run_search`` into ``study``; an existing study is resumed, so a re-run
    continues where an interrupted one stopped. Its progress on stderr unless ``quiet``;
    ``points``: only these points of the space (``SearchOptions.points``)."""
    import optuna

    from workers.search import SearchOptions, run_search

    # Imported here, not by ``main``: an experiment that trains no search (heldout) runs where
    # Optuna is not installed (a bare GPU box).
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summary = run_search(space, task, storage=url, study=study, trials=trials,
                         resume=study_exists(url, study),
                         options=SearchOptions(scheduler=scheduler, storage_path=results,
                                               profile=profile, quiet=quiet,
                                               points=points))
    if summary.status != "completed":  # Ctrl-C, a full disk: the study keeps what finished
        raise SearchFaultError(f"search {study} ended {summary.status}; its finished trials "
                               "are kept: run the same command again to continue it")
    return summary


def main(parser: argparse.ArgumentParser, argv: list[str] | None,
         run: Callable[[argparse.Namespace], dict[str, Any]],
         render: Callable[[dict[str, Any]], str]) -> int:
    """Parse, run, print the table (or JSON/YAML); bad input is one line and exit code 2, a
    search that stopped (Ctrl-C, a full disk) one line and exit code 1."""
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except SearchFaultError as err:
        return fault(parser.prog, str(err))
    except TransformerAllocError as err:
        return fail(parser.prog, err.text(flag_names(parser, **data_flags(parser))))
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0
