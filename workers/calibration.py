"""The calibrated plan, trained: ``calibrate_plan(CalibrationRequest) -> Calibration``, what
``python -m workers.calibrate`` runs.

On the user's data, at one width and depth: the data profiled once (``workers.search``'s
``profile_for``, with its pilot) and the default plan made (``alloc``); the plan and every fixed
rule of ``alloc.heuristics`` trained at the calibration seeds, as points of one study through
the search (Ray Tune, FIFO, every trial fully trained; the seed is the trial's ``train.seed``,
so the study's trials pair by seed and ``python -m studies seeds`` reads them); the bound's
constants fitted to their mean losses (``alloc.calibrate.recalibrate``) and the plan made again;
then the later layers' rule checked: the calibrated plan against its twin (its first layer in
every layer) at the same seeds, trained where the first study has not trained them, in a second
study (``STUDY-check``: a study is one search over one space, and this plan is known only after
the first study's fit). Where the twin is not beaten the later layers copy the first. Both
studies resume (``resume``): a finished trial is never trained again. The plan (an
``ArchConfig`` file ``workers.train --arch`` reads) and its constants (``alloc.solve
--constants``'s file) are written once, at the end; nothing is written on a failure.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alloc import (
    PLAN,
    Plan,
    calibrate,
    mean_observations,
    recalibrate,
    rule_archs,
    twin_arch,
)
from arch import MAX_DEPTH, MAX_WIDTH, ArchConfig
from common.cli import check_writable
from common.errors import Problem, UsageError
from common.files import write_atomic
from common.progress import say
from search_spaces import FixedSuggester, SearchSpace, parse_space
from userdata import TaskSpec
from workers.errors import CalibrationStopped, TaskError

log = logging.getLogger(__name__)

TWIN = "twin"  # the calibrated plan's first layer in every layer
CHECK = "check"  # the later layers' study: STUDY-check
# Seeds start here, above the seeds an evaluation of the plan uses (0, 1, ...): no loss a
# verdict reads enters a fit (experiments.heldout's protocol).
CALIBRATION_SEED = 1000
SEEDS, MAX_SEEDS = 3, 20
STEPS = 400  # a calibration training's (experiments.heldout's)
RULE_UNIT = 8  # the fixed rules give every layer 1 to 8 heads of equal width


@dataclass(frozen=True)
class CalibrationRequest:
    """A calibration: the data, the shape, the trainings and where they are recorded."""

    task: TaskSpec  # the user's data (its window: ``params["length"]``)
    budget: int  # the width D
    layers: int
    out: Path  # the plan's ArchConfig YAML; its constants beside it (``constants_path``)
    study: str = "calibrate"
    storage: str | None = None  # SQLAlchemy URL (default: $OPTUNA_STORAGE, then studies.db)
    seeds: int = SEEDS  # calibration seeds CALIBRATION_SEED .. + seeds - 1
    steps: int | None = None  # per training (default: ``STEPS``; smoke size: the search's)
    batch_size: int = 16
    mlp_ratio: float = 4.0
    profile: Path | None = None  # the data's profile (default: made now, with its pilot)
    pilot_steps: int | None = None
    resume: bool = False
    smoke_test: bool = False
    quiet: bool = False
    storage_path: Path = Path("ray_results")  # Ray's results and the profile made now
    max_concurrent: int | None = None

    @property
    def seed_list(self) -> tuple[int, ...]:
        return tuple(range(CALIBRATION_SEED, CALIBRATION_SEED + self.seeds))

    @property
    def check_study(self) -> str:
        return f"{self.study}-{CHECK}"

    @property
    def constants_path(self) -> Path:
        return self.out.with_name(f"{self.out.stem}-constants{self.out.suffix or '.yaml'}")




@dataclass(frozen=True)
class LaterCheck:
    """The calibrated plan against its twin at the calibration seeds (mean losses)."""

    plan: str
    twin: str
    plan_loss: float
    twin_loss: float

    @property
    def keeps_rule(self) -> bool:
        """The later layers' rule stays only where the plan is lower than its twin."""
        return self.plan_loss < self.twin_loss


@dataclass(frozen=True)
class Calibration:
    """What the written plan rests on."""

    arch: ArchConfig  # the plan written
    default_plan: str
    calibrated_plan: str  # before the later layers' check
    recalibrated: calibrate.Recalibrated
    losses: Mapping[str, float]  # per label (the default plan and each rule), mean over seeds
    plan_loss: float  # the calibrated plan's, over the same seeds
    seeds: tuple[int, ...]
    studies: tuple[str, ...]
    later: LaterCheck | None  # None: the calibrated plan is its own twin
    out: Path
    constants: Path
    trials: Mapping[str, int] = field(default_factory=dict)  # per study, its trials

    def to_dict(self) -> dict[str, Any]:
        fitted = self.recalibrated.fitted
        return {
            "plan": self.arch.describe(), "out": str(self.out), "constants": str(self.constants),
            "default_plan": self.default_plan, "calibrated_plan": self.calibrated_plan,
            "fit": {**fitted.constants.as_flags(), "r2": fitted.r2, "spearman": fitted.spearman,
                    "width_design": fitted.design,
                    "informative": self.recalibrated.informative},
            "losses": dict(self.losses), "calibrated_plan_loss": self.plan_loss,
            "seeds": list(self.seeds),
            "studies": list(self.studies), "trials": dict(self.trials),
            "later_layers": None if self.later is None else {
                **dataclasses.asdict(self.later),
                "verdict": "rule" if self.later.keeps_rule else "first layer's heads"}}


# --- the input, checked before any work ----------------------------------------------------------


def check(request: CalibrationRequest, existing: set[str]) -> None:
    """Refuse bad input in one line before anything is trained or written: the shape, the
    seeds, the output path and the studies (``existing``: the storage's study names).

    Raises:
        UsageError: the field, its value and the rule.
    """
    bad = [Problem("budget", request.budget, f"must be a multiple of {RULE_UNIT} in "
                   f"{RULE_UNIT}..{MAX_WIDTH} (the fixed rules give every layer 1 to 8 heads of "
                   "equal width)")] if (request.budget % RULE_UNIT or not
                                        RULE_UNIT <= request.budget <= MAX_WIDTH) else []
    if not 2 <= request.layers <= MAX_DEPTH:
        bad.append(Problem("layers", request.layers, f"must be in 2..{MAX_DEPTH} (the later "
                           "layers' rule is checked)"))
    if not 1 <= request.seeds <= MAX_SEEDS:
        bad.append(Problem("seeds", request.seeds, f"must be in 1..{MAX_SEEDS}"))
    if request.task.data is None:
        bad.append(Problem("task.data", None, "required: the corpus to calibrate on"))
    if bad:
        raise UsageError.of(bad[:1])
    check_writable("out", request.out)
    check_writable("out", request.constants_path)
    studies = (request.study, request.check_study)
    if not request.resume and (found := [s for s in studies if s in existing]):
        raise UsageError.of([Problem("study", found[0], "already exists; pass {resume} to "
                                     "continue it, or choose another {study}",
                                     shown=repr(found[0]))])
    if request.resume and request.study not in existing:
        raise UsageError.of([Problem("resume", True, f"no study {request.study!r} to continue; "
                                     "run without {resume} to start it", shown="")])


def existing_studies(url: str) -> set[str]:
    """The study names in the storage ``url`` (none where its SQLite file does not exist)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from studies import engine, open_storage, query

    try:
        parsed = make_url(url)
    except ArgumentError:  # open_storage says what is wrong with it
        parsed = None
    if (parsed is not None and parsed.get_backend_name() == "sqlite"
            and not Path(parsed.database or "").exists()):
        return set()
    return {s.name for s in query.list_studies(engine(open_storage(url, read_only=True)))}


# --- the trainings: points of a space through the search -----------------------------------------


def arms_space(arms: Mapping[str, ArchConfig], request: CalibrationRequest,
               name: str) -> SearchSpace:
    """The space whose points are ``arms`` at every calibration seed: per layer, the heads of
    each arm there (``heads: ["1x32", "4x8"]``), its kind, MLP and role fixed; the seed a
    choice of ``train.seed``. Random sampling, but the search runs only the points it is
    given."""
    first = next(iter(arms.values()))
    # Layers where every arm has one configuration share a rule (a later layer of a rule or a
    # twin is its first), so the points stay few at any depth.
    columns: dict[tuple[Any, ...], list[int]] = {}
    for i in range(first.n_layers):
        columns.setdefault(tuple(a.layers[i] for a in arms.values()), []).append(i)
    layers = []
    for column, indices in columns.items():
        layer = column[0]
        rule: dict[str, Any] = {"layers": indices, "attention": [layer.attention],
                                "mlp_ratio": [layer.mlp_ratio], "role": layer.role,
                                "heads": sorted({x.heads_str for x in column}),
                                "shared": len(indices) > 1}
        if layer.eta != 1.0:
            rule["eta"] = layer.eta
        layers.append(rule)
    model = {k: getattr(first, k) for k in ("positional", "norm", "mlp", "causal",
                                             "tie_embeddings")}
    steps = request.steps or STEPS
    return parse_space({
        "name": name, "budget": first.d_model, "depth": first.n_layers, "sampler": "random",
        "description": "a plan and the fixed rules at the calibration seeds (workers.calibrate)",
        "model": model, "layers": layers,
        "train": {"steps": steps, "eval_every": steps, "batch_size": request.batch_size,
                  "seed": list(request.seed_list)}}, source=name)


def as_trained(space: SearchSpace, arch: ArchConfig, task_io: Any) -> ArchConfig:
    """``arch`` as the search builds it for the task (its input, output and length)."""
    return space.sample(FixedSuggester(space.encode(arch)), task_io)[0]


def train_arms(request: CalibrationRequest, study: str, arms: Mapping[str, ArchConfig],
               task: Any, profile: Path, resume: bool,
               only: Sequence[ArchConfig] | None = None) -> int:
    """Every distinct arch of ``arms`` (or of ``only``, some of them: the space is still all
    of theirs) at every calibration seed, as the study's points, through the search (FIFO:
    every trial fully trained); on ``resume`` only the points it lacks. Returns the study's
    trials.

    Raises:
        SearchError: the search refused (e.g. the study is another search's).
    """
    from workers.search import SearchOptions, run_search, training_budget

    space = training_budget(arms_space(arms, request, study), request.smoke_test, request.steps)
    distinct = {a.arch_id: a for a in (arms.values() if only is None else only)}.values()
    points = tuple(space.encode(a, {"seed": s}) for s in request.seed_list for a in distinct)
    options = SearchOptions(scheduler="fifo", sampler="random", profile=profile,
                            quiet=request.quiet, storage_path=request.storage_path,
                            max_concurrent=request.max_concurrent, points=points)
    summary = run_search(space, task, storage=request.storage, study=study,
                         trials=len(points), resume=resume, options=options)
    if summary.status.name != "COMPLETED":
        raise CalibrationStopped.of([Problem("study", study, f"the search ended "
                                             f"{summary.status}; continue it with {{resume}}",
                                             shown=repr(study))])
    return sum(summary.counts.values())


def study_losses(url: str, studies: Sequence[str]) -> dict[str, dict[int, float]]:
    """Per ``arch_id``, the loss of each seed (``train.seed``) its finished trials measured in
    ``studies``."""
    from studies import engine, open_storage, query

    eng = engine(open_storage(url, read_only=True))
    out: dict[str, dict[int, float]] = {}
    for name in studies:
        _, trials = query.load_trials(eng, name)
        for t in query.attach_archs(eng, query.eligible(trials)):
            if t.arch_id is not None and t.value is not None:
                out.setdefault(t.arch_id, {})[int(t.train.get("seed", 0))] = float(t.value)
    return out


# --- the calibration -----------------------------------------------------------------------------


def calibrate_plan(request: CalibrationRequest) -> Calibration:
    """Profile, plan, train the plan and the fixed rules, fit, re-plan, check the later layers,
    write the plan (module docstring).

    Raises:
        UsageError: bad input, before any work; TaskError, DataError: unusable data;
        SearchError: a study that is another search's; CalibrationStopped: the search stopped
        (Ctrl-C); CalibrationError: a training without a loss on every seed (one that
        failed), or too few distinct architectures to fit.
    """
    from studies import resolve_url
    from workers.search import SearchPlan, plan_settings, profile_for, profile_path
    from workers.taskargs import resolve_task
    from workers.tasks import ArrayTask, TextTask

    url = resolve_url(request.storage)
    request = dataclasses.replace(request, storage=url)
    check(request, existing_studies(url))
    task = resolve_task(request.task)
    if task is None:
        raise TaskError("task: the data is required")
    given = request.profile
    if given is None and request.resume and isinstance(task, TextTask | ArrayTask):
        made = profile_path(task, request.storage_path)  # the first run's: the same plan
        given = made if made.exists() else None
    profiled = profile_for(task, given, request.storage_path,
                           (request.budget, request.layers, request.mlp_ratio),
                           request.pilot_steps, request.quiet)
    if profiled is None:  # a generated task: its declared inputs
        raise UsageError.of([Problem("task.data", request.task.data, "must be token data or "
                                     "vectors to profile")])
    default = SearchPlan.make(plan_settings(request.budget, request.layers, task,
                                            profiled.inputs, request.mlp_ratio)).plan
    say(f"calibrate: default plan {default.arch.describe()}; training it and "
        f"{len(rule_archs(default.arch)) - 1} fixed rules at seeds {list(request.seed_list)}",
        quiet=request.quiet)
    trials = {request.study: train_arms(request, request.study, rule_archs(default.arch), task,
                                        profiled.path, request.resume)}
    return _fit_and_check(request, url, task, default, profiled.path, trials)


def _fit_and_check(request: CalibrationRequest, url: str, task: Any, default: Plan,
                   profile: Path, trials: dict[str, int]) -> Calibration:
    """The fit on the first study's losses, the later layers' check (the calibrated plan and
    its twin trained in the check study where the first has not trained them), and the plan
    written."""
    rules = rule_archs(default.arch)
    space = arms_space(rules, request, request.study)
    arms = {label: as_trained(space, a, task.io) for label, a in rules.items()}
    studies = [request.study]
    losses = study_losses(url, studies)
    recalibrated = recalibrate(default, mean_observations(arms, losses, request.seed_list))
    plan = recalibrated.plan.arch
    pair = {PLAN: plan, TWIN: twin_arch(plan)}
    if plan.layers == pair[TWIN].layers:  # its later layers are its first: nothing to check
        del pair[TWIN]
    pair_space = arms_space(pair, request, request.check_study)
    pair = {label: as_trained(pair_space, a, task.io) for label, a in pair.items()}
    missing = [a for a in pair.values()
               if any(s not in losses.get(a.arch_id, {}) for s in request.seed_list)]
    if missing:
        say(f"calibrate: the calibrated plan {plan.describe()}"
            + (f" against its twin {pair[TWIN].describe()}" if TWIN in pair else "")
            + f"; training {', '.join(a.describe() for a in missing)}", quiet=request.quiet)
        trials[request.check_study] = train_arms(
            request, request.check_study, pair, task, profile,
            request.check_study in existing_studies(url), missing)
        studies.append(request.check_study)
        losses = study_losses(url, studies)
    means = {o.label: o.loss for o in mean_observations(pair, losses, request.seed_list)}
    later = None if TWIN not in pair else LaterCheck(
        pair[PLAN].describe(), pair[TWIN].describe(), means[pair[PLAN].describe()],
        means[pair[TWIN].describe()])
    observed = {o.label: o.loss for o in mean_observations(arms, losses, request.seed_list)}
    result = Calibration(
        arch=pair[PLAN] if later is None or later.keeps_rule else pair[TWIN],
        default_plan=arms[PLAN].describe(), calibrated_plan=pair[PLAN].describe(),
        recalibrated=recalibrated,
        losses={label: observed[a.describe()] for label, a in arms.items()},
        plan_loss=means[pair[PLAN].describe()], seeds=request.seed_list,
        studies=tuple(studies), later=later, out=request.out,
        constants=request.constants_path, trials=trials)
    write_plan(result, url)
    return result


def write_plan(result: Calibration, url: str) -> None:
    """The plan's ``ArchConfig`` (with a header saying what it rests on) and its constants,
    each written atomically, once."""
    from studies import redact

    fitted = result.recalibrated.fitted
    later = ("none (the plan's later layers are its first)" if result.later is None else
             f"{'rule kept' if result.later.keeps_rule else 'first layer copied'} (plan "
             f"{result.later.plan_loss:.4f}, twin {result.later.twin_loss:.4f})")
    header = [f"# python -m workers.calibrate: studies {', '.join(result.studies)} in "
              f"{redact(url)}, seeds {result.seeds[0]}-{result.seeds[-1]}",
              f"# default plan {result.default_plan}; fit R² {fitted.r2:.3f} "
              f"({'informative' if result.recalibrated.informative else 'default plan kept'})",
              f"# later layers: {later}",
              f"# constants: {result.constants}"]
    calibrate.write_constants(result.constants, ", ".join(result.studies),
                              len(fitted.bound), fitted, {"plan": result.arch.describe()})
    write_atomic(result.out, "\n".join(header) + "\n" + result.arch.to_yaml())
