"""python -m experiments.heldout [--smoke-test] [--set held-out] [--corpus N] [--data P]
[--constants FILE | --calibrate [--check-later-layers]]

Is the allocator's plan better than the head counts practitioners fix, on corpora no rule was
tuned on? For each corpus (the registry's development and held-out corpora,
``userdata.corpora``, or yours with ``--data``) the plan is made from that corpus as a user
makes it (``alloc.profile --data DIR --budget 64 --layers 2 --mlp-ratio 2 --seq-len 64``, with
its pilot, then ``alloc.solve --budget 64 --layers 2 --mlp-ratio 2 --profile``) and trained
beside every fixed rule of ``alloc.heuristics`` (heads of 64, one head per 32 dimensions, 1, 2,
4 or 8 heads in every layer) at the same width, depth and MLP: 2 layers, D = 64, MLP 2x, windows
of 64 bytes, 400 steps of 16 windows with ``arch.training``'s recipe, 3 seeds. Seeds are
**paired**: seed s fixes the initial weights, the batches' order and the validation windows of
every model alike, so each difference is measured seed by seed. Per corpus the headline is the
plan against the best fixed rule there (lowest mean): the mean paired difference with its 95%
interval, the one-sided paired t-test's p that the plan is worse, and a verdict (``worse``: p <
5%; ``better``: the interval below 0; else ``inconclusive``), beside the seeds' SD and the 1%
margin. Over the held-out corpora: the mean relative difference with its interval over corpora.
Development and held-out corpora are summarised apart, and only held-out ones judge (the
protocol of ``userdata.corpora``). Every training is kept in ``CORPUS/runs.csv`` under
``--out``, so a re-run trains only what is missing (run corpora in parallel with ``--corpus``,
then ``--no-train`` over all of them for the report). Writes ``heldout.csv`` (per corpus and model),
``heldout_corpora.csv`` (per corpus), ``heldout_sets.csv``, ``heldout_runs.csv`` and
``heldout.txt``. ``--constants FILE`` plans with the bound's constants of FILE (``alloc.solve
--constants``'s format; fitted on the development ledgers by
``experiments.heldout_fit``): the rules' trainings are reused from the ledgers, only a
plan that changed trains, and the tables are named for the file (``heldout-STEM.txt``, ...), so
the default constants' stay. ``--calibrate --check-later-layers`` keeps the later layers'
rule only where the calibrated plan beats its twin (its first layer in every layer) on the
calibration's own seeds (tables ``heldout-calibratedN-checked.*``). ``--later-heads first``
gives the later layers layer 0's heads, their ``qk_dim`` narrowed by the saturation rule alone,
instead of as many heads as the distinct patterns a pilot measured (tables
``heldout-laterfirst*``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc import (
    HEURISTICS,
    CalibrationError,
    Constants,
    PilotRequest,
    Plan,
    calibrate,
    read_allocator_inputs,
    read_constants,
    rule_archs,
    twin_arch,
    write_profile,
)
from arch import ArchConfig, TrainConfig
from common.cli import int_in
from common.errors import UsageError
from common.files import write_atomic, write_csv
from experiments import harness, heldout_report as report
from experiments.corpora import plan_from_profile
from experiments.heldout_report import PLAN
from userdata import DTYPES, DataSpec, corpora as registry
from userdata.corpora import HELD_OUT, ROLES, Role
from workers.calibration import CALIBRATION_SEED, TWIN
from workers.tasks import Task, make_data_task

NAME = "heldout"
# The calibration's seeds (CALIBRATION_SEED and up, the product's) are above every evaluation
# seed (--seeds is at most 50): no loss a verdict reads ever enters a fit.
ALL = "all"
CALIBRATED = "calibrated"  # the tables' stem with --calibrate
CHECKED = "checked"  # and with --check-later-layers
# The later layers' heads (--later-heads): as many as the distinct attention patterns measured
# there (docs/theory.md §4.1), or layer 0's, only their qk_dim narrowed (§4).
PATTERNS, FIRST = "patterns", "first"
LATER_HEADS = (PATTERNS, FIRST)
LEDGER_COLUMNS = ("corpus", "model", "arch", "arch_id", "seed", "recipe", "steps", "val_loss",
                  "val_loss_se", "params", "status", "wall_s")


@dataclass(frozen=True)
class Sizes:
    """One run's sizes: the models', the data's, the training's and the pilot's."""

    budget: int  # the width D of every model
    depth: int
    mlp_ratio: float
    length: int  # training window, and the offsets profiled
    megabytes: float  # of each registered corpus
    steps: int
    batch_size: int
    eval_batches: int
    pilot_steps: int
    seeds: int  # seeds 0..seeds-1, paired across the models
    # Steps of a second pilot whose later-layer patterns replace the first one's (0: none).
    pattern_pilot_steps: int = 0


SMOKE = Sizes(budget=16, depth=2, mlp_ratio=2.0, length=16, megabytes=0.03, steps=4,
              batch_size=4, eval_batches=4, pilot_steps=8, seeds=2)
FULL = Sizes(budget=64, depth=2, mlp_ratio=2.0, length=64, megabytes=2.0, steps=400,
             batch_size=16, eval_batches=128, pilot_steps=PilotRequest.steps, seeds=3)


@dataclass(frozen=True)
class Entry:
    """A corpus of this run: a registered one (written under ``--out``) or the user's
    (``path``; held-out: no rule was tuned on it)."""

    name: str
    role: Role
    kind: str
    path: Path | None = None


# --- the corpora ---------------------------------------------------------------------------------


def entries(args: argparse.Namespace) -> tuple[Entry, ...]:
    """The corpora the flags name: ``--set`` and ``--corpus`` (registered), ``--data`` (yours);
    none of them: every registered corpus.

    Raises:
        UsageError: an unknown corpus, or a ``--data`` whose name is taken.
    """
    names = list(args.corpus or [])
    if args.set is not None:
        names += [n for role in (ROLES if args.set == ALL else (args.set,))
                  for n in registry.names(role)]
    if not names and not args.data:
        names = list(registry.CORPORA)
    chosen = [Entry(c.name, c.role, c.kind)
              for c in (registry.corpus(n) for n in dict.fromkeys(names))]
    for path in args.data or []:
        name = Path(path).stem or Path(path).name
        if name in registry.CORPORA or name in {e.name for e in chosen}:
            raise UsageError(f"--data {str(path)!r}: its name {name!r} is taken (a registered "
                             "corpus or another --data); rename the file or folder")
        chosen.append(Entry(name, HELD_OUT, "your data", Path(path)))
    return tuple(chosen)


def data_of(entry: Entry, sizes: Sizes, out: Path, dtype: str) -> DataSpec:
    """Where the corpus is: the user's path, or the registered corpus written under ``out``."""
    if entry.path is not None:
        return DataSpec(str(entry.path), dtype=dtype)
    return DataSpec(str(registry.corpus(entry.name).write(out / "text", sizes.megabytes)))


def megabytes_of(spec: DataSpec) -> float:
    """The corpus's size on disk (a folder: its files)."""
    path = Path(spec.path)
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def task_for(spec: DataSpec, sizes: Sizes, seed: int) -> Task:
    """The corpus's windows; ``seed`` orders the batches and draws the validation windows."""
    return make_data_task(spec, length=sizes.length, seed=seed)


# --- the models ----------------------------------------------------------------------------------


def corpus_plan(spec: DataSpec, sizes: Sizes, out: Path, task: Task, quiet: bool,
                constants: Constants | None = None, later_heads: str = PATTERNS) -> Plan:
    """The corpus's plan: its profile with the pilot at the models' shape, then ``alloc.solve
    --profile``'s plan at that width and depth, with the bound's ``constants`` (None: the
    defaults). With ``sizes.pattern_pilot_steps`` the later layers' patterns (docs/theory.md
    §4.1) come from a second profile whose pilot trains that long, all else from the first;
    with ``later_heads`` FIRST no pattern is read, and the later layers keep layer 0's heads
    (the saturation rule still narrows their ``qk_dim``)."""
    rules: dict[str, Any] = {} if constants is None else constants.as_flags()
    if later_heads == FIRST:
        rules["patterns"] = None
    elif sizes.pattern_pilot_steps:
        long = profile_at(spec, sizes, out, sizes.pattern_pilot_steps, quiet)
        rules["patterns"] = read_allocator_inputs(long).patterns
    path = profile_at(spec, sizes, out, sizes.pilot_steps, quiet)
    return plan_from_profile(path, sizes.budget, sizes.depth, task, sizes.mlp_ratio, **rules)


def profile_path(sizes: Sizes, out: Path, steps: int) -> Path:
    return out / (f"profile-D{sizes.budget}-L{sizes.depth}-mlp{sizes.mlp_ratio:g}"
                  f"-T{sizes.length}-pilot{steps}.yaml")


def profile_at(spec: DataSpec, sizes: Sizes, out: Path, steps: int, quiet: bool) -> Path:
    """The corpus's profile with a pilot of ``steps`` at the models' shape, kept in ``out``
    (``profile_path``: a re-run reads it)."""
    from workers.profile import profile_data

    path = profile_path(sizes, out, steps)
    if not path.exists():
        pilot = PilotRequest(spec, budget=sizes.budget, layers=sizes.depth,
                             mlp_ratio=sizes.mlp_ratio, steps=steps, quiet=quiet)
        write_profile(profile_data(spec, seq_len=sizes.length, pilot=pilot), path)
    return path


def untrained(args: argparse.Namespace, sizes: Sizes, chosen: Sequence[Entry]) -> None:
    """With ``--no-train``, refuse a corpus never profiled under ``--out``: its pilot would
    train (the usual cause: a corpus registered after that folder's runs).

    Raises:
        UsageError: the first such corpus.
    """
    steps = [s for s in (sizes.pilot_steps, sizes.pattern_pilot_steps) if s]
    for entry in chosen:
        for count in steps:
            path = profile_path(sizes, args.out / entry.name, count)
            if not path.exists():
                raise UsageError(f"--no-train: corpus {entry.name!r} has no profile {path} to "
                                 "read (run it without --no-train first, or choose the corpora "
                                 "with --corpus)")


models = rule_archs  # the plan and every fixed rule at its shape, by label (alloc's)


def twin_of(arms: Mapping[str, ArchConfig]) -> str:
    """The first rule whose model has the plan's first layer in every layer, where the plan's
    later layers differ from it ("": none): the two differ only in what the later layers' rule
    (docs/theory.md §4, §4.1) chose."""
    plan, twin = arms[PLAN], twin_arch(arms[PLAN])
    return next((label for label, arch in arms.items() if label != PLAN
                 and arch.arch_id == twin.arch_id != plan.arch_id), "")


def train_config(sizes: Sizes, seed: int) -> TrainConfig:
    """The recipe every model of a run trains with: ``arch.training``'s (its warmup, and the
    width rule's learning rate at D, fixed here so the ledger records it), ``seed`` its
    initial weights."""
    return TrainConfig(steps=sizes.steps, batch_size=sizes.batch_size, eval_every=sizes.steps,
                       eval_batches=sizes.eval_batches, seed=seed).for_width(sizes.budget)


def recipe_id(sizes: Sizes) -> str:
    """What a ledger row was trained with (the recipe and the window), seed aside: a row of
    another recipe (an earlier warmup or learning rate) is never read as this one's."""
    fields = {**train_config(sizes, 0).to_dict(), "seed": None, "length": sizes.length}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


# --- the trainings, kept in a ledger -------------------------------------------------------------


def read_ledger(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def train_one(args: argparse.Namespace, sizes: Sizes, corpus: str, task: Task, label: str,
              arch: ArchConfig, seed: int) -> dict[str, Any]:
    """One model trained with ``seed``: its ledger row (a run that diverged has no loss)."""
    from workers.training import Trainer

    trainer = Trainer(arch, task, train_config(sizes, seed))
    result = harness.train(trainer, f"{corpus}: {label} ({arch.describe()}), seed {seed}", args)
    loss = result.val_loss if result.status == "completed" else None
    return {"corpus": corpus, "model": label, "arch": arch.describe(), "arch_id": arch.arch_id,
            "seed": seed, "recipe": recipe_id(sizes), "steps": result.steps,
            "val_loss": "" if loss is None else loss,
            "val_loss_se": "" if result.val_loss_se is None else result.val_loss_se,
            "params": result.trainable_params, "status": result.status,
            "wall_s": round(result.wall_s, 2)}


def train_all(args: argparse.Namespace, sizes: Sizes, corpus: str, spec: DataSpec,
              arms: Mapping[str, ArchConfig], ledger: Path, seeds: Sequence[int]
              ) -> list[dict[str, str]]:
    """Every distinct model of ``arms`` with every one of ``seeds``, those not in ``ledger``
    trained and added to it one by one (none with ``--no-train``); returns the rows of these
    models, this recipe and ``seeds`` (a ledger also holds other plans' and other widths'
    trainings: the recipe does not name the width)."""
    rows, recipe = read_ledger(ledger), recipe_id(sizes)
    done = {(r["arch_id"], int(r["seed"])) for r in rows if r["recipe"] == recipe}
    distinct: dict[str, tuple[str, ArchConfig]] = {}  # a model two rules share: trained once
    for label, arch in arms.items():
        distinct.setdefault(arch.arch_id, (label, arch))
    for seed in () if args.no_train else seeds:
        missing = [(label, arch) for key, (label, arch) in distinct.items()
                   if (key, seed) not in done]
        task = task_for(spec, sizes, seed) if missing else None
        for label, arch in missing:
            assert task is not None
            rows.append({k: str(v) for k, v in train_one(args, sizes, corpus, task, label,
                                                         arch, seed).items()})
            write_csv(ledger, rows)
    return [r for r in rows if r["recipe"] == recipe and int(r["seed"]) in seeds
            and r["arch_id"] in distinct]


def losses_of(arms: Mapping[str, ArchConfig], rows: Sequence[Mapping[str, str]]
              ) -> dict[str, dict[int, float]]:
    """Per label, its loss per seed (NaN: that training diverged)."""
    by_arch: dict[str, dict[int, float]] = {}
    for r in rows:
        by_arch.setdefault(r["arch_id"], {})[int(r["seed"])] = (
            float(r["val_loss"]) if r["val_loss"] else math.nan)
    return {label: by_arch.get(arch.arch_id, {}) for label, arch in arms.items()}


def observations_of(arms: Mapping[str, ArchConfig], rows: Sequence[Mapping[str, str]],
                    seeds: Sequence[int], hint: str) -> list[calibrate.Observation]:
    """The calibration's observations (docs/theory.md §6) from one corpus's ledger rows of one
    recipe: each distinct arm of ``arms``, its first layer and its mean loss over ``seeds``
    (``alloc.calibrate.mean_observations``).

    Raises:
        UsageError: an arm without a finite loss on every seed (``hint`` says how to train it).
    """
    by_arch: dict[str, dict[int, float]] = {}
    for r in rows:
        by_arch.setdefault(r["arch_id"], {})[int(r["seed"])] = (
            float(r["val_loss"]) if r["val_loss"] else math.nan)
    try:
        return calibrate.mean_observations(arms, by_arch, seeds)
    except CalibrationError as err:
        raise UsageError(f"{err}: the ledger has no finite loss on every seed "
                         f"{seeds_text(seeds)}; train it first ({hint})") from None


def seeds_text(seeds: Sequence[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def params_of(arms: Mapping[str, ArchConfig], rows: Sequence[Mapping[str, str]]
              ) -> dict[str, int]:
    by_arch = {r["arch_id"]: int(r["params"]) for r in rows}
    return {label: by_arch[arch.arch_id] for label, arch in arms.items()
            if arch.arch_id in by_arch}


# --- the plan calibrated on the corpus itself ----------------------------------------------------


def corpus_constants(args: argparse.Namespace, entry: Entry) -> Constants:
    """The corpus's own constants file ``--out/CORPUS/--corpus-constants`` (e.g. the
    ``constants-calibrated5.yaml`` a ``--calibrate`` run wrote at another width).

    Raises:
        UsageError: the corpus has no such file.
        ConstantsError: the file is not a constants file.
    """
    path = args.out / entry.name / args.corpus_constants
    if not path.is_file():
        raise UsageError(f"--corpus-constants {args.corpus_constants!r}: {entry.name} has no "
                         f"{path} (run heldout --calibrate on it first)")
    return read_constants(path)


def calibration_seeds(count: int) -> tuple[int, ...]:
    return tuple(range(CALIBRATION_SEED, CALIBRATION_SEED + count))


def later_layers_check(arms: Mapping[str, ArchConfig], rows: Sequence[Mapping[str, str]],
                       seeds: Sequence[int]) -> report.LaterLayersCheck | None:
    """The calibrated plan (``arms[PLAN]``) against its twin (``arms[TWIN]``) on the
    calibration's trainings ``rows`` at ``seeds``: their mean losses (None: the plan is its own
    twin, its later layers already copy its first).

    Raises:
        UsageError: either without a finite loss on every seed (``--no-train`` before the twin
            trained).
    """
    if arms[PLAN].arch_id == arms[TWIN].arch_id:
        return None
    plan, twin = observations_of(arms, rows, seeds,
                                 "heldout --calibrate --check-later-layers without --no-train")
    return report.LaterLayersCheck(arms[PLAN].describe(), arms[TWIN].describe(), plan.loss,
                                   twin.loss)


def calibrated_plan(args: argparse.Namespace, sizes: Sizes, corpus: str, spec: DataSpec,
                    default: Plan, out: Path) -> tuple[ArchConfig, report.Calibration]:
    """The corpus's plan with the bound's constants fitted on its own trainings
    (``alloc.calibrate``'s fit, docs/theory.md §6): the default plan and every fixed rule
    trained at the calibration seeds (kept in the corpus's ledger), their mean losses fitted
    with the default plan's allocator inputs, and the plan made again with the fitted
    constants (written to ``out/constants-calibratedN.yaml``, with ``run_tag``'s name at other
    sizes, e.g. ``constants-DW-calibratedN.yaml`` at ``--budget W``; ``alloc.solve
    --constants``'s format) where they explain the losses at all (R² > 0), else the default
    plan kept. With ``--check-later-layers`` that plan and its twin train at the calibration
    seeds too (where not trained yet), and where the twin is not beaten there
    (``later_layers_check``) the plan's later layers copy its first.

    Raises:
        UsageError: a calibration training missing with ``--no-train``.
        CalibrationError: the fit has too few distinct arms.
    """
    arms, seeds = models(default.arch), calibration_seeds(args.calibration_seeds)
    rows = train_all(args, sizes, corpus, spec, arms, out / "runs.csv", seeds)
    observations = observations_of(arms, rows, seeds, "heldout --calibrate without --no-train")
    recalibrated = calibrate.recalibrate(default, observations)
    plan, fitted, informative = recalibrated.plan, recalibrated.fitted, recalibrated.informative
    later = None
    if args.check_later_layers:  # the plan the verdict would judge, and its twin
        pair = {PLAN: plan.arch, TWIN: twin_arch(plan.arch)}
        later = later_layers_check(pair, train_all(args, sizes, corpus, spec, pair,
                                                   out / "runs.csv", seeds), seeds)
    arch = plan.arch if later is None or later.keeps_rule else twin_arch(plan.arch)
    by_arch = {o.label: o.loss for o in observations}
    losses = {label: by_arch[a.describe()] for label, a in arms.items()}
    calibration = report.Calibration(
        corpus=corpus, seeds=seeds, losses=losses, default_plan=default.arch.describe(),
        plan=arch.describe(), constants=fitted.constants, r2=fitted.r2,
        spearman=fitted.spearman, design=fitted.design, informative=informative,
        pick=min(HEURISTICS, key=lambda label: losses[label]), later=later)
    calibrate.write_constants(out / f"constants{run_tag(args)}-{CALIBRATED}{len(seeds)}.yaml",
                              f"{out / 'runs.csv'} (seeds {seeds_text(seeds)})",
                              len(observations), fitted,
                              {"corpus": corpus, "recipe": recipe_id(sizes)})
    return arch, calibration


# --- the experiment ------------------------------------------------------------------------------


def sizes_of(args: argparse.Namespace) -> Sizes:
    """The run's sizes: full or smoke, with ``--seeds``, ``--steps``, ``--budget``,
    ``--layers``, ``--pilot-steps`` and ``--pattern-pilot-steps``."""
    return dataclasses.replace(SMOKE if args.smoke_test else FULL,
                               **{k: v for k, v in (("seeds", args.seeds), ("steps", args.steps),
                                                    ("budget", args.budget),
                                                    ("depth", args.layers),
                                                    ("pilot_steps", args.pilot_steps),
                                                    ("pattern_pilot_steps",
                                                     args.pattern_pilot_steps)) if v})


def corpus_result(args: argparse.Namespace, sizes: Sizes, entry: Entry,
                  constants: Constants | None = None) -> dict[str, Any]:
    """The corpus written (or read), profiled and planned (with ``constants``, or calibrated on
    the corpus with ``--calibrate``), the plan and every fixed rule trained with every seed
    (or read from its ledger), and the plan judged."""
    out = args.out / entry.name
    out.mkdir(parents=True, exist_ok=True)
    spec = data_of(entry, sizes, out, args.data_dtype)
    plan = corpus_plan(spec, sizes, out, task_for(spec, sizes, 0), args.quiet, constants,
                       args.later_heads)
    arch, calibration = plan.arch, None
    if args.calibrate:
        arch, calibration = calibrated_plan(args, sizes, entry.name, spec, plan, out)
    arms = models(arch)
    rows = train_all(args, sizes, entry.name, spec, arms, out / "runs.csv", range(sizes.seeds))
    verdict, table = report.judge(entry.name, entry.role, entry.kind, megabytes_of(spec),
                                  losses_of(arms, rows),
                                  {label: a.describe() for label, a in arms.items()},
                                  params_of(arms, rows), twin_of(arms))
    return {"verdict": verdict, "models": table, "runs": rows, "calibration": calibration}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    sizes = sizes_of(args)
    if args.check_later_layers and not args.calibrate:
        raise UsageError("--check-later-layers: needs --calibrate (it reads the calibration's "
                         "trainings)")
    if args.later_heads == FIRST and args.pattern_pilot_steps:
        raise UsageError(f"--pattern-pilot-steps {args.pattern_pilot_steps}: with --later-heads "
                         f"{FIRST} no pattern is read (the later layers keep layer 0's heads)")
    chosen = entries(args)  # a bad --corpus, --data or --constants: before any work
    constants = None if args.constants is None else read_constants(args.constants)
    if sizes.budget % 8:
        raise UsageError(f"--budget {sizes.budget}: not a multiple of 8 (the fixed rules give "
                         "every layer 1 to 8 heads of equal width)")
    own = {e.name: corpus_constants(args, e) for e in chosen} if args.corpus_constants else {}
    if args.no_train:
        untrained(args, sizes, chosen)
    if args.threads:
        torch.set_num_threads(args.threads)
    harness.prepare(args)
    results = []
    with harness.runs(args, NAME, len(chosen), "corpora") as bar:
        for k, entry in enumerate(chosen, start=1):
            bar.write(f"{NAME}: corpus {k}/{len(chosen)}: {entry.name} ({entry.role}): "
                      "profile, plan, and the plan and every fixed rule trained")
            results.append(corpus_result(args, sizes, entry, own.get(entry.name, constants)))
            bar.update(1)
            bar.event(f"{entry.name} done")
    verdicts = [r["verdict"] for r in results]
    models = [row for r in results for row in r["models"]]
    holm = report.holm_by_corpus(verdicts)
    result = {"sizes": dataclasses.asdict(sizes), "recipe": train_config(sizes, 0).to_dict(),
              "later_heads": args.later_heads,
              "corpora": [{**dataclasses.asdict(v), "p_worse_holm": holm[v.corpus]}
                          for v in verdicts],
              "models": models,
              "sets": {role: None if s is None else dataclasses.asdict(s)
                       for role, s in report.sets(verdicts).items()},
              "rules": [dataclasses.asdict(r) for role in ROLES
                        for r in report.against_rules(models, role)],
              "out": str(args.out), "stem": stem_of(args),
              "constants": None if constants is None else {
                  "file": str(args.constants), **constants.as_flags()},
              "corpus_constants": args.corpus_constants,
              "calibrations": [report.calibration_row(c, r["models"]) for r in results
                               if (c := r["calibration"]) is not None]}
    write_outputs(result, [row for r in results for row in r["runs"]], args.out)
    return result


def stem_of(args: argparse.Namespace) -> str:
    """The tables' name: ``heldout``; ``heldout-STEM`` for the plans of a constants file (or of
    each corpus's, ``--corpus-constants``); ``heldout-calibratedN`` for the plans calibrated on
    each corpus with N seeds; ``run_tag``'s sizes (``-DW``, ``-stepsS``, ``-pilotP``) after
    ``heldout`` at another ``--budget``, ``--steps`` or ``--pilot-steps``."""
    base = f"{NAME}{run_tag(args)}"
    if args.calibrate:
        checked = f"-{CHECKED}" if args.check_later_layers else ""
        return f"{base}-{CALIBRATED}{args.calibration_seeds}{checked}"
    if args.corpus_constants is not None:
        return f"{base}-{Path(args.corpus_constants).stem}"
    return base if args.constants is None else f"{base}-{args.constants.stem}"


def run_tag(args: argparse.Namespace) -> str:
    """What names a run of other sizes or later layers (its tables and calibrated constants):
    ``-DW`` at another ``--budget`` W, ``-LN`` at another ``--layers`` N, ``-stepsS`` at
    another ``--steps`` S, ``-pilotP`` at another ``--pilot-steps`` P, ``-patternsP`` with
    ``--pattern-pilot-steps`` P, ``-laterfirst`` with ``--later-heads first``, nothing at the
    defaults, given or not (a ledger keeps every size's trainings apart by their recipe and
    their architecture, and a profile is named for its pilot and shape; the tables and
    constants need the name, one per size)."""
    sizes, defaults = sizes_of(args), SMOKE if args.smoke_test else FULL
    tags = (("-D", "budget"), ("-L", "depth"), ("-steps", "steps"), ("-pilot", "pilot_steps"),
            ("-patterns", "pattern_pilot_steps"))
    sized = "".join(f"{tag}{value}" for tag, field in tags
                    if (value := getattr(sizes, field)) != getattr(defaults, field))
    return sized + (f"-later{FIRST}" if args.later_heads == FIRST else "")


def write_outputs(result: dict[str, Any], runs: list[dict[str, str]], out: Path) -> None:
    stem = result["stem"]
    write_csv(out / f"{stem}.csv", result["models"])
    write_csv(out / f"{stem}_corpora.csv", result["corpora"])
    write_csv(out / f"{stem}_sets.csv", [{"set": role, **s}
                                         for role, s in result["sets"].items() if s is not None])
    write_csv(out / f"{stem}_runs.csv", runs)
    if result["rules"]:
        write_csv(out / f"{stem}_rules.csv", result["rules"])
    if result["calibrations"]:
        write_csv(out / f"{stem}_calibration.csv", result["calibrations"])
    write_atomic(out / f"{stem}.txt", report.render(result) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--set", choices=(*ROLES, ALL),
                        help="the registered corpora of this role (default, with no --corpus "
                             "and no --data: all)")
    parser.add_argument("--corpus", action="append", metavar="NAME",
                        help=f"a registered corpus (repeatable): {', '.join(registry.CORPORA)}")
    parser.add_argument("--data", action="append", type=Path, metavar="PATH",
                        help="your corpus (repeatable), held-out: a UTF-8 text file or folder "
                             "of *.txt, or a folder with nanoGPT's train.bin/val.bin")
    parser.add_argument("--data-dtype", choices=DTYPES, default=DataSpec.dtype,
                        help="token type of --data's .bin files")
    parser.add_argument("--seeds", type=int_in(2, 50), metavar="N",
                        help=f"paired seeds 0..N-1 (default: {FULL.seeds}, {SMOKE.seeds} with "
                             "--smoke-test)")
    parser.add_argument("--steps", type=int_in(1), metavar="STEPS",
                        help=f"training steps of every model (default: {FULL.steps}); tables "
                             "heldout-stepsS.*")
    parser.add_argument("--pilot-steps", type=int_in(1), metavar="STEPS",
                        help=f"steps of the pilot each corpus's profile trains (default: "
                             f"{FULL.pilot_steps}, alloc.profile's); tables heldout-pilotP.*")
    parser.add_argument("--pattern-pilot-steps", type=int_in(1), metavar="STEPS",
                        help="the later layers' patterns from a second pilot of STEPS (e.g. "
                             "the training's length), the rest of the profile from the first; "
                             "tables heldout-patternsP.*")
    parser.add_argument("--later-heads", choices=LATER_HEADS, default=PATTERNS,
                        help="the later layers' heads: as many as the distinct attention "
                             "patterns the pilot measured there (default), or layer 0's, only "
                             "their qk_dim narrowed by the saturation rule; tables "
                             f"heldout-later{FIRST}*")
    parser.add_argument("--no-train", action="store_true",
                        help="train nothing: the report from the ledgers alone, on the seeds "
                             "every model of a corpus has (e.g. while other runs still train)")
    plans = parser.add_mutually_exclusive_group()
    plans.add_argument("--constants", type=Path, metavar="FILE",
                       help="plan with the bound's constants of FILE (alloc.solve "
                            "--constants's YAML, e.g. experiments.heldout_fit's); the "
                            "tables are named heldout-STEM (default: the allocator's "
                            "constants, tables heldout.*)")
    plans.add_argument("--calibrate", action="store_true",
                       help="plan each corpus with the bound's constants fitted on its own "
                            "trainings (the default plan and every fixed rule at seeds "
                            f"{CALIBRATION_SEED} and up, which no verdict reads); tables "
                            f"heldout-{CALIBRATED}N.* for N --calibration-seeds")
    plans.add_argument("--corpus-constants", metavar="NAME",
                       help="plan each corpus with the constants in its own folder's file NAME "
                            "(e.g. constants-calibrated5.yaml, which --calibrate writes): "
                            "constants calibrated at one width, judged at another --budget; "
                            "tables heldout-STEM.*")
    parser.add_argument("--layers", type=int_in(2, 48), metavar="N",
                        help=f"the depth of every model (default: {FULL.depth}; its profile and "
                             "plans are its own); tables heldout-LN.*")
    parser.add_argument("--budget", type=int_in(16, 4096), metavar="D",
                        help=f"the width of every model, a multiple of 8 (default: "
                             f"{FULL.budget}; its profile and plans are its own); tables "
                             "heldout-DD.*")
    parser.add_argument("--check-later-layers", action="store_true",
                        help="with --calibrate: train the calibrated plan and its twin (its "
                             "first layer in every layer) at the calibration seeds too, and keep "
                             "the later layers' rule only where the plan beats the twin there; "
                             f"tables heldout-{CALIBRATED}N-{CHECKED}.*")
    parser.add_argument("--calibration-seeds", type=int_in(1, 20), default=5, metavar="N",
                        help="seeds of the --calibrate trainings (default: %(default)s)")
    parser.add_argument("--threads", type=int_in(1), metavar="N",
                        help="torch's CPU threads (default: torch's; 1 when several runs share "
                             "the cores)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return harness.main(build_parser(), argv, run, report.render)


if __name__ == "__main__":
    sys.exit(main())
