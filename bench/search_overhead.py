"""python -m bench.search_overhead [--trials 6] [--steps 300]

Orchestration overhead of ``workers.search``: the same trials run (a) as a plain loop calling the
trainer, (b) through the launcher (Ray Tune, the study searcher writing to SQLite, a checkpoint
per evaluation), with and without actor reuse, one trial at a time so the comparison is work for
work. Reports the overhead per trial and as a fraction of wall time, and what it would be for
30 s trials.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arch import ArchConfig
from common.cli import Parser, add_format, dump, int_in, render_table
from search_spaces import FixedSuggester, load_space


def launcher(url: str, results: Path, study: str, args: argparse.Namespace, reuse: bool,
             checkpoints: bool = True) -> float:
    from workers.search import SearchOptions, run_search, training_budget

    space = training_budget(load_space(args.space), steps=args.steps)
    options = SearchOptions(scheduler="fifo", max_concurrent=1, storage_path=results,
                            reuse_actors=reuse, checkpoints=checkpoints)
    start = time.perf_counter()
    summary = run_search(space, args.task, storage=url, study=study, trials=args.trials,
                         options=options)
    if summary.status != "completed":
        raise SystemExit(f"launcher ended {summary.status}")
    return time.perf_counter() - start


def plain_loop(url: str, study: str, args: argparse.Namespace) -> float:
    """Train the very trials the launcher ran, in a loop, in this process."""
    import optuna
    import torch

    from arch import TrainConfig
    from workers.tasks import make_task
    from workers.training import Trainer

    torch.set_num_threads(1)  # what a 1-CPU trial gets
    trials = optuna.load_study(study_name=study, storage=url).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))
    task = make_task(args.task, "paper", 0)
    start = time.perf_counter()
    space = load_space(args.space)
    space = space.with_train(steps=args.steps, eval_every=min(int(space.fixed_train(
        "eval_every")), args.steps))
    for t in trials:  # the launcher's own arch and hyper-parameters for each trial
        _, train = space.sample(FixedSuggester(t.params), task.io)
        arch = ArchConfig.from_json(t.user_attrs["arch"])
        Trainer(arch, task, TrainConfig(**train)).run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.search_overhead", description=__doc__.split("\n\n")[1])
    p.add_argument("--trials", type=int_in(1), default=6)
    p.add_argument("--steps", type=int_in(1), default=300, help="training steps per trial")
    p.add_argument("--space", default="heads_vs_dim.yaml")
    p.add_argument("--task", default="ngram")
    add_format(p)
    args = p.parse_args(argv)
    from workers.search import start_ray

    start = time.perf_counter()
    start_ray()
    ray_start = time.perf_counter() - start
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        modes = {"launcher, actor reuse, checkpoints": (True, True),
                 "launcher, actor reuse, --no-checkpoints": (True, False),
                 "launcher, --no-reuse-actors, checkpoints": (False, True)}
        walls = {mode: launcher(url, Path(tmp) / "ray", f"m{n}", args, *flags)
                 for n, (mode, flags) in enumerate(modes.items())}
        loop = plain_loop(url, "m0", args)
    for mode, wall in walls.items():
        per_trial = (wall - loop) / args.trials
        rows.append({"mode": mode, "wall_s": wall,
                     "trial_s": loop / args.trials, "overhead_per_trial_s": per_trial,
                     "overhead_fraction": per_trial / (wall / args.trials),
                     "fraction_at_30s_trials": per_trial / (30 + per_trial)})
    result = {"ray_init_s": ray_start, "plain_loop_s": loop, "trials": args.trials,
              "steps": args.steps, "rows": rows}
    if args.format != "table":
        print(dump(result, args.format))
        return 0
    print(f"{args.trials} trials of {args.steps} steps ({args.space} on {args.task}); plain loop "
          f"{loop:.1f} s ({loop / args.trials:.2f} s per trial); ray.init {ray_start:.1f} s "
          "(once per search, not counted)")
    print(render_table(["mode", "wall s", "overhead/trial s", "fraction", "at 30 s trials"],
                       [[r["mode"], f"{r['wall_s']:.1f}", f"{r['overhead_per_trial_s']:.2f}",
                         f"{r['overhead_fraction']:.1%}", f"{r['fraction_at_30s_trials']:.1%}"]
                        for r in rows], right=[False, True, True, True, True]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
