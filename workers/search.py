"""python -m workers.search --space aot_vs_standard.yaml --task modadd [--smoke-test]

Search per-layer configurations with Ray Tune while Optuna records every trial in the study
database (SPEC §7): a function trainable on ``workers.train``, Optuna's TPE sampler (or the
space's grid) through ``OptunaSearch`` on the study's own storage, ASHA stopping bad trials early,
and the allocator's plan plus the uniform baselines evaluated first. ``--resume`` continues a
study after Ctrl-C or a killed driver: finished trials are kept, trials that were running are
failed and retried, nothing is left RUNNING. A password in ``--storage`` is moved to
``$PGPASSWORD`` before anything is pickled or logged (``~/.pgpass`` and service files work too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from alloc.plan import PlanSettings, baseline_arch, make_plan, predicted_error
from common.cli import Parser, UsageError, add_format, dump, fail, int_in, number
from search_spaces import ArchConfig, HeadGroup, LayerSpec, SearchSpace, SpaceError, load_space
from studies import query
from studies import records as rec
from studies.storage import (
    StorageError,
    StorageSettings,
    open_storage,
    reap_dead,
    redact,
    resolve_url,
)
from workers.tasks import Task, TaskError, make_task
from workers.train import parse_task_params

log = logging.getLogger(__name__)
PROG = "workers.search"
SMOKE_TRAIN = {"steps": 40, "eval_every": 10, "batch_size": 16, "eval_batches": 2}
SMOKE_TRIALS = 6


@dataclass(frozen=True)
class Job:
    """What every trial needs besides its sampled config (a plain dict reaches the workers)."""

    task: str
    size: str
    task_params: dict[str, Any]
    seed: int
    metric: str
    mode: str
    device: str
    threads: int
    inject: tuple[dict[str, str], ...] = ()


# --- the allocator's seeds ------------------------------------------------------------------------


def plan_settings(space: SearchSpace, task: Task) -> PlanSettings:
    """Allocator inputs for this space and task (the ngram/kernel tasks give the kernel)."""
    kernel = getattr(task, "kernel", PlanSettings.kernel)
    return PlanSettings(budget=space.budget, layers=space.depth, seq_len=task.seq_len,
                        input_dim=task.input_dim or space.budget, kernel=kernel,
                        align=min(8, space.budget))


def _fit_layer(space: SearchSpace, i: int, layer: LayerSpec) -> LayerSpec:
    """``layer`` moved into the space's rule for layer ``i`` where a field is not allowed."""
    rule = space.rule(i)
    kind = layer.attention if layer.attention in rule.attention else rule.attention[0]
    mlp = layer.mlp_ratio if layer.mlp_ratio in rule.mlp_ratio else rule.mlp_ratio[-1]
    heads = layer.heads
    if len(heads) == 1:  # a qk_dim the rule does not allow becomes the largest it does
        g = heads[0]
        qk = g.qk_dim if rule.qk.allows(kind, g.v_dim, g.qk_dim) else rule.qk.range(
            kind, g.v_dim)[1]
        heads = (HeadGroup(g.count, qk, g.v_dim),)
    return LayerSpec(kind, heads, mlp, rule.role, eta=rule.eta,
                     freeze_mlp=rule.freeze_mlp and mlp > 0)


def seeds(space: SearchSpace, settings: PlanSettings) -> list[tuple[str, dict[str, Any]]]:
    """(label, params) of the allocator's plan, its uniform plan and the 64-dim baseline.

    A seed the space cannot express (e.g. two head groups in a layer) is skipped with a warning.
    """
    plan = make_plan(settings)
    uniform = make_plan(dataclasses.replace(settings, uniform=True))
    candidates = [("allocator", plan.arch), ("allocator-uniform", uniform.arch),
                  ("baseline-64", baseline_arch(plan))]
    out: list[tuple[str, dict[str, Any]]] = []
    for label, arch in candidates:
        layers = tuple(_fit_layer(space, i, layer) for i, layer in enumerate(arch.layers))
        try:
            fitted = ArchConfig.from_dict({**arch.to_dict(), **space.model,
                                           "layers": [x.to_dict() for x in layers]})
            out.append((label, space.encode(fitted)))
        except (SpaceError, ValueError) as err:
            log.warning("seed %s is not in space %s, skipped: %s", label, space.name, err)
    return out


@dataclass(frozen=True)
class Predictor:
    """The allocator's predicted error of a sampled architecture (its first layer's bound);
    a picklable callable, since Ray pickles the searcher that holds it."""

    settings: PlanSettings

    def __call__(self, arch: ArchConfig) -> float:
        return predicted_error(self.settings, arch.layers[0])


# --- command line ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--space", required=True,
                   help="search-space YAML: a path or a file shipped in search_spaces/")
    p.add_argument("--task", required=True, help="task name (see python -m workers.train -h)")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a task parameter (repeatable)")
    p.add_argument("--study", help="study name (default: SPACE-TASK)")
    p.add_argument("--storage", help="SQLAlchemy URL (default: $OPTUNA_STORAGE, then "
                                     "sqlite:///studies.db)")
    p.add_argument("--trials", type=int_in(1),
                   help="trials in the study in all (default: 20; the grid size for grid "
                        f"spaces; {SMOKE_TRIALS} with --smoke-test)")
    p.add_argument("--budget", type=int_in(1), help="width budget D (default: the space's)")
    p.add_argument("--steps", type=int_in(1), help="training steps per trial (default: the "
                                                   "space's)")
    p.add_argument("--address", help="Ray cluster: auto or ray://host:port (default: a local "
                                     "Ray instance)")
    p.add_argument("--cpus-per-trial", type=number(0, strict=True), default=1.0)
    p.add_argument("--gpus-per-trial", type=number(0), default=0.0,
                   help="fractions share a GPU; > 0 trains on CUDA")
    p.add_argument("--max-concurrent", type=int_in(1),
                   help="trials at once (default: as many as the resources allow)")
    p.add_argument("--scheduler", choices=("asha", "fifo"), default="asha",
                   help="asha stops bad trials early; fifo trains every trial fully")
    p.add_argument("--seed", type=int_in(0), default=0, help="sampler, task and model seed")
    p.add_argument("--resume", action="store_true",
                   help="continue the study: retry trials that were running, run the rest")
    p.add_argument("--smoke-test", action="store_true",
                   help=f"smoke-size task, {SMOKE_TRAIN['steps']} steps per trial, "
                        f"{SMOKE_TRIALS} trials: runs in about a minute")
    p.add_argument("--storage-path", type=Path, default=Path("ray_results"),
                   help="Ray's experiment directory")
    p.add_argument("--heartbeat-interval", type=int_in(1), default=10,
                   help="seconds between the driver's trial heartbeats")
    p.add_argument("--grace-period", type=int_in(2), default=60,
                   help="seconds without heartbeat before a running trial counts as dead")
    p.add_argument("--no-reuse-actors", action="store_true", help="a new worker per trial")
    p.add_argument("--inject-failure", action="append", default=[], metavar="KIND:TEXT",
                   help=argparse.SUPPRESS)  # tests: see workers.trial.injected
    add_format(p)
    return p


def secure_url(url: str) -> str:
    """``url`` without its password, which moves to ``$PGPASSWORD`` (read by libpq itself)."""
    parsed = make_url(url)
    if parsed.password is None:
        return url
    os.environ["PGPASSWORD"] = str(parsed.password)
    # URL is a named tuple; ``URL.set(password=None)`` would keep the password (None = unset).
    return parsed._replace(password=None).render_as_string(hide_password=False)


@dataclass(frozen=True)
class Setup:
    space: SearchSpace
    task: Task
    job: Job
    study_name: str
    url: str
    trials: int
    settings: PlanSettings


def setup(args: argparse.Namespace) -> Setup:
    size = "smoke" if args.smoke_test else "paper"
    try:
        task_params = parse_task_params(args.task_param)
        space = load_space(args.space, args.budget)
        if args.smoke_test:
            space = space.with_train(**SMOKE_TRAIN)
        if args.steps:
            every = min(int(space.fixed_train("eval_every")), args.steps)
            space = space.with_train(steps=args.steps, eval_every=every)
        task = make_task(args.task, size, args.seed, **task_params)
    except SpaceError as err:
        raise UsageError(f"--space: {err}") from None
    except (TaskError, TypeError) as err:
        raise UsageError(f"--task: {err}") from None
    if args.gpus_per_trial > 0:
        import torch

        if not torch.cuda.is_available() and not args.address:
            raise UsageError(f"--gpus-per-trial {args.gpus_per_trial:g}: no CUDA device here")
    inject = []
    for item in args.inject_failure:
        kind, _, match = item.partition(":")
        if kind not in ("raise", "nan") or not match:
            raise UsageError(f"--inject-failure {item!r}: expected raise:TEXT or nan:TEXT")
        inject.append({"kind": kind, "match": match})
    trials = args.trials or (SMOKE_TRIALS if args.smoke_test else len(space.grid())
                             if space.sampler == "grid" else 20)
    job = Job(task.name, size, task_params, args.seed, task.metric,
              "max" if task.higher_is_better else "min",
              "cuda" if args.gpus_per_trial > 0 else "cpu",
              max(1, int(args.cpus_per_trial)), tuple(inject))
    study = args.study or f"{space.name}-{task.name}"
    return Setup(space, task, job, study, resolve_url(args.storage), trials,
                 plan_settings(space, task))


# --- the study --------------------------------------------------------------------------------


def describe_search(s: Setup) -> dict[str, Any]:
    """Keyword arguments of ``studies.records.study_attrs`` for this search."""
    return {"task": s.task.name, "metric": s.task.metric, "space_name": s.space.name,
            "space_hash": s.space.hash, "alloc_inputs": asdict(s.settings),
            "task_params": json.dumps(s.job.task_params), "task_size": s.job.size,
            "steps": s.space.fixed_train("steps"), "seed": s.job.seed}


def open_study(s: Setup, storage: optuna.storages.BaseStorage, resume: bool) -> optuna.Study:
    """Create the study, or load it for ``--resume`` after checking it is the same search."""
    direction = (optuna.study.StudyDirection.MAXIMIZE if s.job.mode == "max"
                 else optuna.study.StudyDirection.MINIMIZE)
    try:
        study = optuna.load_study(study_name=s.study_name, storage=storage)
    except KeyError:
        if resume:
            raise UsageError(f"--resume: no study {s.study_name!r} in "
                             f"{redact(s.url)}; run without --resume to start it") from None
        study = optuna.create_study(study_name=s.study_name, storage=storage,
                                    direction=direction)
        rec.set_study_attrs(study, **describe_search(s))
        return study
    if not resume and study.trials:
        raise UsageError(f"--study {s.study_name!r}: already has {len(study.trials)} trials in "
                         f"{redact(s.url)}; pass --resume to continue it or choose a new name")
    if study.trials and study.user_attrs.get("record_schema") != rec.RECORD_SCHEMA:
        raise UsageError(f"--resume: study {s.study_name!r} was written by an older version "
                         "whose trial records are not comparable (record_schema "
                         f"{study.user_attrs.get('record_schema')!r}, this code writes "
                         f"{rec.RECORD_SCHEMA}); start a new study")
    mine = rec.study_attrs(**describe_search(s))
    for key in ("task", "space_hash", "task_params", "task_size", "steps"):
        if key in study.user_attrs and study.user_attrs[key] != mine[key]:
            raise UsageError(f"--resume: study {s.study_name!r} was run with {key} = "
                             f"{study.user_attrs[key]!r}, this command gives {mine[key]!r}")
    if not study.trials:  # an empty study made elsewhere: describe it as ours
        rec.set_study_attrs(study, **describe_search(s))
    return study


def enqueue_start(study: optuna.Study, s: Setup) -> int:
    """Enqueue the allocator's seeds, or every point of a grid space (the seeds the space can
    express are among them); points already in the study are skipped.

    This is ``points_to_evaluate`` done so that a resumed search does not evaluate them twice.
    """
    before = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if s.space.sampler == "grid":
        for params in s.space.grid():
            study.enqueue_trial(params, skip_if_exists=True)
    else:
        for label, params in seeds(s.space, s.settings):
            study.enqueue_trial(params, user_attrs={"seed": label}, skip_if_exists=True)
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))) - before


# --- running ----------------------------------------------------------------------------------


def _describe(arch_json: str | None) -> str:
    if not arch_json:
        return "?"
    arch = ArchConfig.from_json(arch_json)
    return " | ".join(f"{x.attention} {x.heads_str}" + (f" mlp{x.mlp_ratio:g}" if x.mlp_ratio
                                                          else "") for x in arch.layers)


def make_monitor(searcher: Any, total: int, interval: float) -> Any:
    """A Tune callback: heartbeats for the open trials, and one progress line per finished
    trial (done / running / failed, best so far)."""
    from ray.tune import Callback

    class Monitor(Callback):
        def __init__(self) -> None:
            self.counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
            self.best: tuple[float, int, str] | None = None
            self.last_beat = 0.0

        def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
            if time.monotonic() - self.last_beat >= interval:
                searcher.beat()
                self.last_beat = time.monotonic()

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any,
                              **info: Any) -> None:
            self._finished(trials, trial, error=False)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any,
                           **info: Any) -> None:
            self._finished(trials, trial, error=True)

        def _finished(self, trials: list[Any], trial: Any, error: bool) -> None:
            state, value, _ = searcher.classify(trial.last_result, error)
            self.counts[state.name] += 1
            ot = searcher._ot_trials.get(trial.trial_id)
            if value is not None and ot is not None:
                better = self.best is None or (value > self.best[0] if searcher.mode == "max"
                                               else value < self.best[0])
                if better:
                    self.best = (value, ot.number, trial.config.get("arch"))
            running = sum(t.status == "RUNNING" and t is not trial for t in trials)
            done = sum(self.counts.values())
            best = (f"best {searcher.metric} {self.best[0]:.4g} (trial {self.best[1]}: "
                    f"{_describe(self.best[2])})" if self.best else "no full-budget trial yet")
            print(f"[{done}/{total}] {self.counts['COMPLETE']} complete, "
                  f"{self.counts['PRUNED']} stopped early, {self.counts['FAIL']} failed, "
                  f"{running} running; {best}", file=sys.stderr, flush=True)

    return Monitor()


def _trial_dirname(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def _ray_init(address: str | None) -> None:
    import ray

    if ray.is_initialized():  # called from Python (benchmarks, notebooks) after ray.init
        return
    ray.init(address=address, include_dashboard=False if address is None else None,
             log_to_driver=False, logging_level=logging.WARNING)


def run_search(s: Setup, args: argparse.Namespace, study: optuna.Study) -> str:
    """Run the remaining trials through Ray Tune; returns how the run ended."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from workers.searcher import StudySearcher, finished_count
    from workers.trial import run_trial

    remaining = s.trials - finished_count(study)
    if remaining <= 0:
        print(f"study {s.study_name} already has its {s.trials} trials", file=sys.stderr)
        return "completed"
    steps = int(s.space.fixed_train("steps"))
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.RandomSampler(seed=args.seed) if s.space.sampler == "random" else
        optuna.samplers.TPESampler(seed=args.seed, constant_liar=True))
    searcher = StudySearcher(s.space, io=s.task.io, study=study, metric=s.job.metric,
                             mode=s.job.mode, steps=steps, predict=Predictor(s.settings),
                             sampler=sampler)
    eval_every = int(s.space.fixed_train("eval_every"))
    scheduler = (ASHAScheduler(time_attr="step", metric=s.job.metric, mode=s.job.mode,
                               max_t=steps, grace_period=max(eval_every, steps // 9),
                               reduction_factor=3)
                 if args.scheduler == "asha" else FIFOScheduler())
    resources = {"cpu": args.cpus_per_trial, "gpu": args.gpus_per_trial}
    name = f"{s.study_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    tuner = tune.Tuner(
        tune.with_resources(run_trial, resources),
        param_space={"job": asdict(s.job)},
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                    num_samples=remaining,
                                    max_concurrent_trials=args.max_concurrent,
                                    reuse_actors=not args.no_reuse_actors,
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(
            name=name, storage_path=str(args.storage_path.resolve()), verbose=0,
            callbacks=[make_monitor(searcher, remaining, args.heartbeat_interval / 2)],
            failure_config=tune.FailureConfig(max_failures=1)))
    print(f"search {s.study_name}: {remaining} trial(s) of {s.space.name} on {s.task.name} "
          f"({steps} steps each), study in {redact(s.url)}, Ray results in "
          f"{args.storage_path / name}", file=sys.stderr, flush=True)
    status = "completed"
    try:
        tuner.fit()
    except KeyboardInterrupt:
        status = "interrupted"
    failed = searcher.abandon("interrupted")
    if failed:
        status = "interrupted"
        print(f"interrupted: trials {failed} failed and re-enqueued; continue with --resume",
              file=sys.stderr)
    return status


def summary(s: Setup, study: optuna.Study, storage: RDBStorage, status: str
            ) -> tuple[dict[str, Any], query.TrialRecord | None]:
    from workers.searcher import retried_numbers

    trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    out: dict[str, Any] = {"study": s.study_name, "storage": redact(s.url), "status": status,
                           "trials": counts, "retried": sorted(retried_numbers(trials)),
                           "best": None, "export": None}
    try:
        _, winners = query.top(storage.engine, s.study_name, 1)
    except query.QueryError:
        return out, None
    best = winners[0]
    out["best"] = {"number": best.number, "value": best.value,
                   "params_trainable": best.params_trainable,
                   "arch": best.arch.to_dict() if best.arch else None}
    out["export"] = (f"python -m studies export --storage {redact(s.url)} --study "
                     f"{s.study_name} --trial {best.number} --out best.yaml")
    return out, best


def render(result: dict[str, Any], best: query.TrialRecord | None) -> str:
    counts = ", ".join(f"{k.lower()} {v}" for k, v in sorted(result["trials"].items()))
    lines = [f"study {result['study']} ({result['storage']}): {result['status']}; {counts}"]
    if best is None:
        lines.append("no trial reached the full training budget")
        return "\n".join(lines)
    from studies.cli import allocation_table

    lines += ["best per-layer allocation:", allocation_table(best),
              f"export: {result['export']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our progress lines replace Ray's boxes
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # We record heartbeats for ask/tell trials ourselves (workers.searcher), on purpose.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    try:
        s = setup(args)
        settings = StorageSettings(heartbeat_interval=args.heartbeat_interval,
                                   grace_period=args.grace_period, retries=1)
        probe = open_storage(s.url, settings)  # fail fast, before Ray starts
        study = open_study(s, probe, args.resume)
    except (UsageError, StorageError) as err:
        return fail(PROG, str(err))
    if args.resume:
        alive = reap_dead(study, probe, args.grace_period + args.heartbeat_interval)
        if alive:
            return fail(PROG, f"--resume: trials {alive} of {s.study_name!r} still have a live "
                              "heartbeat; another driver is running this study")
    added = enqueue_start(study, s)
    if added:
        print(f"enqueued {added} starting point(s): " + ("the grid" if s.space.sampler == "grid"
              else "the allocator's plan, uniform baselines"), file=sys.stderr)
    _ray_init(args.address)
    # After Ray started its processes, so they never inherit the password.
    url = secure_url(s.url)
    s = dataclasses.replace(s, url=url)
    storage = open_storage(url, settings)
    study = optuna.load_study(study_name=s.study_name, storage=storage)
    status = run_search(s, args, study)
    result, best = summary(s, study, storage, status)
    print(render(result, best) if args.format == "table" else dump(result, args.format))
    return 130 if status == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
