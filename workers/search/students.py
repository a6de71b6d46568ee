"""A search over the students of a pretrained checkpoint: ``prepare_student`` checks it once into
a ``StudentRequest``, ``execute_student`` runs it.

``python -m workers.search --space student_kv.yaml --teacher DIR --data tokens/ --eval tokens/
--kv-cache 0.25``: the teacher is measured once per study (``workers.search.student_cache``),
the study is multi-objective (held-out loss and KV cache bytes per token, both minimised), its
first trials are the fixed allocations (the allocator's curvature plan, uniform widths, Palu's
Fisher shares: ``fixed_allocations``), then the sampler (``prior``: the plan as its mode, or
TPE, or random) proposes per-layer widths and RoPE parts around the plan, each repaired to the
KV cache its point allows (``search_spaces.students``). Ray Tune runs the trials
(``workers.search.student_trial``) with ASHA on the held-out windows' parts; the study records
each student's allocation, its plan's folder (``studies export --trial N`` copies that plan)
and its loss on every held-out window, so the fixed allocations and the sampled ones compare
paired by window in the database.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from alloc import ModePrior
from alloc.compression import (
    CompressionError,
    DepthFit,
    Observation,
    aligned,
    check_kv_cache,
    fit_depth_scales,
    plan_for_kv_cache,
    rescaled,
    student_form,
)
from arch import ArchConfig, ModelIO, kv_cache_bytes, training_dtype
from common.errors import Problem, UsageError
from common.progress import say
from search_spaces import (
    STUDENT_SAMPLERS,
    Allocation,
    SearchSpace,
    SpaceError,
    StudentSpace,
    fit_allocation,
    read_student_space,
)
from studies import (
    STORAGE_ERRORS,
    Lease,
    StorageSettings,
    guarded,
    open_storage,
    reap_trials,
    records as rec,
    redact,
    resolve_url,
    secure_url,
)
from studies.trials import VAL_LOSS, Direction, TrialRecord, TrialStatus
from userdata import DataSpec, open_tokens
from workers.errors import SearchError
from workers.search.asking import MAX_REDRAWS, skip_duplicate, tell
from workers.search.checks import (
    check_gpus,
    check_study_name,
    check_writable_dir,
    trial_device,
)
from workers.search.driver import SearchSummary, _concurrency, run_trials, summarise
from workers.search.guard import GuardedSearcher
from workers.search.options import SearchOptions
from workers.search.protocol import TRIAL_KEY, StudentJob, StudentSpec
from workers.search.searcher import (
    Asked,
    Best,
    StudySearcher,
    finished_count,
    requeue_ray_failures,
)
from workers.search.student_cache import (
    CacheSettings,
    TeacherCache,
    ensure_cache,
    student_plan,
)
from workers.search.student_trial import WINDOWS
from workers.search.study import open_study, session_seed

# What a student trial records besides the searcher's attrs
ALLOCATION, PLAN_FOLDER, WINDOW_LOSSES = "allocation", "plan_folder", "window_losses"
FIXED = "fixed"  # a fixed allocation's JSON on its enqueued trial (its label is ``seed``)
PLAN = "plan"  # the allocator's fixed allocation: a point of the space too
REFIT = "refit"  # the plan refitted to the study's measured students (``refit_allocation``)
KIND = "student"  # the study attr ``kind`` of a student search
SMOKE_TRIALS = 6


@dataclass(frozen=True)
class StudentRequest:
    """A student search, checked: the space, what is measured once (``settings``), the KV cache
    budget, and the study."""

    space: StudentSpace
    settings: CacheSettings
    budget: float  # the KV cache fraction of the teacher's a student may spend at most
    rope: int  # the allocator's RoPE part per key/value head at the budget (0: latent form)
    storage: str
    study: str
    trials: int
    resume: bool
    options: SearchOptions

    @property
    def sampler(self) -> str:
        return self.options.sampler or self.space.sampler


def prepare_student(space: str | Path | StudentSpace, teacher: Path, data: DataSpec,
                    held_out: DataSpec, kv_cache: float, *, storage: str | None = None,
                    study: str | None = None, trials: int | None = None, resume: bool = False,
                    options: SearchOptions | None = None, smoke_test: bool = False
                    ) -> StudentRequest:
    """Check a student search once, before anything is measured or written.

    Raises:
        SearchError, UsageError, CheckpointError, DataError, CompressionError: one line each,
        naming the field, its value and the rule.
    """
    opts = options or SearchOptions()
    found = _space(space)
    if smoke_test:
        found = found.smoke()
    if study is not None:
        check_study_name(study)
    check_writable_dir("storage_path", opts.storage_path)
    check_gpus(opts)
    sampler = opts.sampler or found.sampler
    if sampler not in STUDENT_SAMPLERS:
        raise UsageError.of([Problem("sampler", sampler, "a student search samples with "
                                     + ", ".join(STUDENT_SAMPLERS))])
    arch, rope = _check_teacher(teacher, found, kv_cache)
    seq_len = min(found.seq_len, arch.max_seq_len)
    for field, spec in (("data", data), ("eval", held_out)):
        _check_tokens(field, spec, seq_len)
    name = study if study is not None else f"{found.name}-{teacher.name}"
    check_study_name(name)
    widest = min(g.qk_dim for layer in arch.layers for g in layer.heads)
    settings = CacheSettings(teacher.resolve(), data.resolved(), held_out.resolved(), seq_len,
                             found.sample_tokens, found.eval_tokens,
                             tuple(found.cached_ropes(rope, widest, kv_cache)), opts.seed)
    total = trials or (SMOKE_TRIALS if smoke_test else found.trials)
    return StudentRequest(found, settings, kv_cache, rope, resolve_url(storage), name, total,
                          resume, opts)


def _check_teacher(teacher: Path, space: StudentSpace, kv_cache: float
                   ) -> tuple[ArchConfig, int]:
    """The teacher's architecture and the plan's RoPE part at ``kv_cache``, once the space's
    form can cut it to ``kv_cache`` and to the space's smallest share of it."""
    from workers.checkpoints import read_arch

    form = student_form(space.form)
    if not form.latent:
        raise SearchError.of([Problem("space", space.form, "form: a student search plans a "
                                      "latent form (latent, or latent_rope beside a decoupled "
                                      "RoPE part); the compact form is not searched yet",
                                      shown="")])
    if not teacher.exists():
        raise UsageError.of([Problem("teacher", str(teacher), "no such file or folder")])
    arch = read_arch(teacher)
    if form.rope_part and arch.positional != "rope":
        raise SearchError.of([Problem("teacher", str(teacher), "a latent_rope student keeps "
                                      "RoPE: the teacher has none", shown="")])
    rope = rope_for(arch, kv_cache) if form.rope_part else 0
    check_kv_cache(arch, 1, kv_cache, form=form, rope_dim=min(space.rope_choices(rope, rope)))
    smallest = min(space.kv_choices(kv_cache))
    try:
        check_kv_cache(arch, 1, smallest, form=form, rope_dim=min(rope, 2))
    except CompressionError:
        raise SearchError.of([Problem("space", space.name, f"kv_shares: its smallest share of "
                                      f"kv_cache {kv_cache:g} ({smallest:g}) is below what a "
                                      f"{form.name} student can cache", shown="")]) from None
    return arch, rope


def _space(space: str | Path | StudentSpace) -> StudentSpace:
    if isinstance(space, StudentSpace):
        return space
    try:
        return read_student_space(space)
    except SpaceError as err:
        raise SearchError.of([Problem("space", "", str(err))]) from None


def _check_tokens(field: str, spec: DataSpec, seq_len: int) -> None:
    """Token data with at least one window in each split (a problem of ``field``)."""
    from userdata import DataError

    try:
        open_tokens(spec, seq_len + 1)
    except DataError as err:
        raise UsageError.of([Problem(field, spec.path, str(err), shown=repr(spec.path))]
                            ) from None


def rope_for(arch: ArchConfig, kv_cache: float) -> int:
    """The allocator's RoPE part per key/value head at ``kv_cache``: half of a layer's share of
    the budget, over its key/value heads, even (``experiments.kv_methods``' ``ours-mla``)."""
    g = arch.layers[0].heads[0]
    units = max(1, round(kv_cache * arch.kv_width / arch.n_layers))
    return max(2, min(g.qk_dim, units // (2 * g.kv_heads)) // 2 * 2)


# --- the fixed allocations ---------------------------------------------------------------------

def fixed_allocations(cache: TeacherCache, request: StudentRequest) -> dict[str, Allocation]:
    """The allocations every study compares, at the budget: ``plan`` (the allocator's curvature
    plan at the space's ``align``, ``workers.profile --latent --rope-dim R --kv-cache F``),
    ``uniform`` (every layer the same width) and ``palu`` (widths in proportion to each layer's
    Fisher information, Palu's shares), the latter two at the plan's RoPE part."""
    shape, budget, rope = cache.shape, request.budget, request.rope
    layers = len(shape.kv_heads)
    planned = plan_for_kv_cache(aligned(cache.plan(rope), request.space.align), budget)
    widths = tuple(planned.layers[i].latent_dim for i in range(layers))
    return {PLAN: Allocation(budget, widths, (rope,) * layers),
            "uniform": fit_allocation(budget, [1.0] * layers, [rope] * layers, shape),
            "palu": fit_allocation(budget, cache.fisher, [rope] * layers, shape)}


def refit_allocation(cache: TeacherCache, request: StudentRequest,
                     done: Sequence[FrozenTrial]) -> tuple[Allocation, DepthFit] | None:
    """The curvature plan made again with its loss estimates scaled by depth to fit the held-out
    losses of the complete students ``done`` (``alloc.compression.fit_depth_scales``), at the
    budget, the plan's RoPE part and the space's ``align``; None with too few students to fit,
    a fit that leaves a depth group free (a zero scale), or one that predicts left-out students
    no better than one scale for every layer (the plan itself)."""
    observed = []
    for t in done:
        chosen = Allocation.from_dict(json.loads(t.user_attrs[ALLOCATION]))
        observed.append(Observation(dict(enumerate(chosen.latent_dims)),
                                    dict(enumerate(chosen.rope_dims)), float(t.values[0])))
    plans = cache.plans()
    fit = fit_depth_scales(plans, observed, float(cache.meta["teacher_loss"]))
    if fit is None or not all(s > 0 for s in fit.scales) or not fit.trusted:
        return None
    planned = plan_for_kv_cache(aligned(rescaled(plans[request.rope], fit), request.space.align),
                                request.budget)
    widths = tuple(layer.latent_dim for layer in planned.layers)
    return Allocation(request.budget, widths, (request.rope,) * len(widths)), fit


# --- the searcher -------------------------------------------------------------------------------

class StudentSearcher(StudySearcher):
    """``StudySearcher`` for a student study: each trial's allocation from the space (or a
    fixed allocation's enqueued trial), its student's architecture and plan recorded, told
    with two values (held-out loss, KV cache bytes per token) and its window losses."""

    def __init__(self, request: StudentRequest, cache: TeacherCache, study: optuna.Study,
                 storage: optuna.storages.RDBStorage, fixed: Mapping[str, Allocation],
                 earlier: Sequence[FrozenTrial] | None = None) -> None:
        self.request, self.cache = request, cache
        # the complete students of earlier studies of the same measurements, read once
        self.earlier = list(earlier_students(request, storage, study.study_name, cache)
                            if earlier is None else earlier)
        self.fixed = [(label, a) for label, a in fixed.items()
                      if not any(t.user_attrs.get(rec.SEED) == label
                                 for t in study.get_trials(deepcopy=False))]
        self.plan = fixed[PLAN]
        super().__init__(_NO_SPACE, io=_NO_IO, study=study, storage=storage, metric=VAL_LOSS,
                         direction=Direction.MINIMIZE, steps=eval_parts(cache, request),
                         predict=lambda arch: None,
                         kv_dtype=training_dtype(trial_device(request.options)))

    def ask(self, key: str) -> dict[str, StudentSpec] | None:  # type: ignore[override]
        """A new trial: its allocation, its student recorded (architecture, KV cache, plan
        folder), and what the worker measures."""
        self._enqueue_fixed()
        self._enqueue_refit()
        trial, chosen = self._ask_new()
        arch = student_plan(self.cache, chosen).student
        folder = self.cache.student_folder(chosen)
        attrs = {**rec.trial_attrs(arch, status=TrialStatus.RUNNING, kv_dtype=self.kv_dtype),
                 ALLOCATION: json.dumps(chosen.to_dict()), PLAN_FOLDER: str(folder)}
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        self._beat(trial.number)
        self.asked[key] = Asked(trial, arch)
        return {TRIAL_KEY: StudentSpec(chosen, str(folder))}

    def _ask_new(self) -> tuple[Trial, Allocation]:
        """A trial whose allocation no other finished or running trial has (proposals of one
        are recorded as duplicates and asked again, ``MAX_REDRAWS`` times)."""
        for _ in range(MAX_REDRAWS):
            trial, chosen = self._ask_one()
            twin = self._twin(trial, chosen)
            if twin is None:
                return trial, chosen
            skip_duplicate(self.study, trial, twin)
        return self._ask_one()

    def _ask_one(self) -> tuple[Trial, Allocation]:
        """A trial and its allocation; a point no student fits (RoPE parts the budget cannot
        hold) is recorded as a failed trial and asked again."""
        while True:
            with warnings.catch_warnings():  # heartbeats with ask/tell are the point here
                warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
                trial = self.study.ask()
            try:
                return trial, self._allocation_of(trial)
            except SpaceError as err:
                tell(self.study, trial, TrialState.FAIL, None,
                     {rec.STATUS: str(TrialStatus.FAILED), rec.ERROR: str(err)})

    def _allocation_of(self, trial: Trial) -> Allocation:
        """The trial's allocation: an enqueued fixed one, else the space's point (the plan's
        trial samples too: its params are recorded as they are suggested, so that the
        samplers learn from it)."""
        fixed = trial.user_attrs.get(FIXED)
        if fixed is None or trial.user_attrs.get(rec.SEED) == PLAN:
            sampled = self.request.space.sample(trial, self.plan, self.cache.shape,
                                                self.request.budget)
        return sampled if fixed is None else Allocation.from_dict(json.loads(fixed))

    def _twin(self, trial: Trial, chosen: Allocation) -> FrozenTrial | None:
        text = json.dumps(chosen.to_dict())
        return next((t for t in self.study.get_trials(deepcopy=False, states=(
            TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
            if t.number != trial.number and t.user_attrs.get(ALLOCATION) == text), None)

    def _enqueue_fixed(self) -> None:
        """The next fixed allocation, unless a trial is waiting (the plan with its point's
        params, so the samplers learn from it; the others, which are no point of the space,
        with none)."""
        while self.fixed and not self.study.get_trials(deepcopy=False,
                                                       states=(TrialState.WAITING,)):
            label, chosen = self.fixed.pop(0)
            params = self.request.space.modes(chosen, self.request.budget) \
                if label == PLAN else {}
            self.study.enqueue_trial(params, user_attrs={
                rec.SEED: label, FIXED: json.dumps(chosen.to_dict())})

    def _enqueue_refit(self) -> None:
        """Once the space's ``refit_after`` complete students of this teacher's measurements are
        known (this study's and earlier studies' of the same cache: a study that follows others
        has them at once), the plan refitted to them (``refit_allocation``), once, unless a
        trial is waiting; its fit goes on the trial (``refit``)."""
        after = self.request.space.refit_after
        trials = self.study.get_trials(deepcopy=False)
        if not after or any(t.user_attrs.get(rec.SEED) == REFIT for t in trials) or any(
                t.state == TrialState.WAITING for t in trials):
            return
        if len(_measured(trials)) + len(self.earlier) < after:
            return
        found = refit_allocation(self.cache, self.request, self._measured_students())
        if found is None:
            return
        chosen, fit = found
        self.study.enqueue_trial({}, user_attrs={rec.SEED: REFIT, FIXED: json.dumps(
            chosen.to_dict()), REFIT: json.dumps(fit.to_dict())})

    def _measured_students(self) -> list[FrozenTrial]:
        """Every complete student of this study and of the earlier studies of the same teacher
        measurements: what the refit learns from."""
        return _measured(self.study.get_trials(deepcopy=False)) + self.earlier

    def report(self, key: str, result: Mapping[str, Any]) -> None:
        """The last report (a multi-objective study records no intermediate values: the
        scheduler reads Tune's results)."""
        from workers.search.protocol import TrialReport

        report, run = TrialReport.from_result(result, self.metric), self._open(key)
        if report is not None and run is not None:
            run.last = report

    def outcome(self, run: Asked, record: TrialRecord
                ) -> tuple[float | Sequence[float] | None, Mapping[str, Any]]:
        attrs = dict(record.told_attrs())
        if record.value is None:
            return None, attrs
        windows = Path(str(run.trial.user_attrs[PLAN_FOLDER])) / WINDOWS
        if windows.is_file():
            attrs[WINDOW_LOSSES] = windows.read_text()
        return [record.value, float(kv_cache_bytes(run.arch, self.kv_dtype))], attrs

    def best_of(self, value: float, run: Asked) -> Best:
        return Best(value, run.trial.number, run.arch, _shown(run.trial.user_attrs))

    def best_so_far(self) -> Best | None:
        done = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.values and rec.ARCH in t.user_attrs]
        if not done:
            return None
        best = min(done, key=lambda t: t.values[0])
        return Best(float(best.values[0]), best.number, ArchConfig.from_json(
            best.user_attrs[rec.ARCH]), _shown(best.user_attrs))


def earlier_students(request: StudentRequest, storage: optuna.storages.BaseStorage, study: str,
                     cache: TeacherCache) -> list[FrozenTrial]:
    """The complete students of the storage's other studies of the same teacher measurements
    (their ``cache`` attr); none where the space never refits (only the refit reads them)."""
    found: list[FrozenTrial] = []
    if not request.space.refit_after:
        return found
    folder = str(cache.folder)
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name != study and summary.user_attrs.get("cache") == folder:
            other = optuna.load_study(study_name=summary.study_name, storage=storage)
            found += _measured(other.get_trials(deepcopy=False))
    return found


def prior_centre(request: StudentRequest, cache: TeacherCache, plan: Allocation,
                 earlier: Sequence[FrozenTrial]) -> tuple[Allocation, str]:
    """Where the ``prior`` sampler centres (and why, in words): the plan refitted to the
    ``earlier`` studies' students of the same measurements where the space refits
    (``refit_after``), they are as many and the fit is trusted (``refit_allocation``); else the
    plan itself."""
    after = request.space.refit_after
    if after and len(earlier) >= after:
        found = refit_allocation(cache, request, earlier)
        if found is not None:
            return found[0], f"the plan refitted to {len(earlier)} earlier students"
    return plan, "the plan"


def _measured(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The complete student trials (their allocation and loss recorded)."""
    return [t for t in trials if t.state == TrialState.COMPLETE and t.values
            and ALLOCATION in t.user_attrs]


def _shown(attrs: Mapping[str, Any]) -> str:
    """A student trial as a progress line names it: its label and its allocation's widths."""
    label = attrs.get(rec.SEED)
    widths = Allocation.from_dict(json.loads(attrs[ALLOCATION])).describe()
    return f"{label}: {widths}" if isinstance(label, str) else widths


_NO_SPACE: SearchSpace = None  # type: ignore[assignment]  # a student search has its own
_NO_IO: ModelIO = None  # type: ignore[assignment]


def eval_parts(cache: TeacherCache, request: StudentRequest) -> int:
    """Reports per trial: the space's ``eval_chunks``, at most one per held-out window."""
    return max(1, min(request.space.eval_chunks, int(cache.meta["eval_windows"])))


def student_sampler(request: StudentRequest, centre: Allocation, seed: int
                    ) -> optuna.samplers.BaseSampler:
    """The request's sampler: ``prior`` (``centre`` as its mode, then TPE: ``prior_centre``),
    ``tpe`` or ``random``; each seeded with ``seed`` (``session_seed``)."""
    if request.sampler == "prior":
        return ModePrior(request.space.modes(centre, request.budget), seed=seed)
    if request.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


# --- the driver ---------------------------------------------------------------------------------

def describe_student_search(request: StudentRequest, cache: TeacherCache) -> dict[str, Any]:
    """Keyword arguments of ``studies.records.study_attrs`` for this search."""
    return {"task": f"student of {request.settings.teacher.name}", "metric": VAL_LOSS,
            "space_name": request.space.name, "space_hash": request.space.hash,
            "task_fields": json.dumps({"cache": cache.meta["key"], "kv_cache": request.budget},
                                      sort_keys=True),
            "steps": eval_parts(cache, request), "seed": request.options.seed,
            "recipe": KIND, "kind": KIND, "teacher": str(request.settings.teacher),
            "cache": str(cache.folder), "kv_budget": request.budget,
            "teacher_kv_units": cache.shape.teacher_units,
            "teacher_loss": cache.meta["teacher_loss"], "other_metrics": [rec.KV_CACHE]}


def execute_student(request: StudentRequest) -> SearchSummary:
    """Run a checked student search: the study's lease taken, the teacher measured once (or its
    measurements found), the study opened (or resumed), the trials it lacks run through Ray
    Tune, and the study summarised.

    Raises:
        SearchError: the study is not this search's; StorageError, LeaseError,
        StorageFaultError: as ``workers.search.execute``.
    """
    opts = request.options
    heartbeats = StorageSettings(heartbeat_interval=opts.heartbeat_interval,
                                 grace_period=opts.grace_period, retries=1)
    probe = open_storage(request.storage, heartbeats, patience=opts.storage_patience)
    lease = Lease(probe.engine, request.study, ttl=opts.grace_period)
    try:
        guarded(lambda: lease.acquire(take_stale=request.resume), request.storage,
                opts.storage_patience)
        return _execute(request, probe, lease, heartbeats)
    finally:
        with contextlib.suppress(*STORAGE_ERRORS):
            lease.release()
        probe.engine.dispose()


def _execute(request: StudentRequest, probe: optuna.storages.RDBStorage, lease: Lease,
             heartbeats: StorageSettings) -> SearchSummary:
    opts, url = request.options, request.storage
    cache = ensure_cache(request.settings, opts.storage_path, opts.quiet)
    fixed = fixed_allocations(cache, request)
    study = guarded(lambda: _open(request, cache, probe), url, opts.storage_patience)
    remaining = request.trials - finished_count(study)
    if remaining <= 0:
        print(f"study {request.study} already has its {request.trials} trials", file=sys.stderr)
        return summarise(StudentSearcher(request, cache, study, probe, fixed), request.study,
                         url, TrialStatus.COMPLETED)
    from workers.search import tune

    with tune.session(opts.address):
        url = secure_url(url)
        rdb = open_storage(url, heartbeats, patience=opts.storage_patience)
        seed = session_seed(opts.seed, len(study.trials))
        earlier = earlier_students(request, rdb, request.study, cache)
        centre, why = prior_centre(request, cache, fixed[PLAN], earlier)
        study = optuna.load_study(study_name=request.study, storage=rdb,
                                  sampler=student_sampler(request, centre, seed))
        searcher = GuardedSearcher(StudentSearcher(request, cache, study, rdb, fixed, earlier),
                                   url, lease, patience=opts.storage_patience)
        run = tune.TuneRun(name=f"{request.study}-{time.strftime('%Y%m%d-%H%M%S')}",
                           trials=remaining, steps=eval_parts(cache, request), eval_every=1,
                           options=opts, concurrent=_concurrency(opts, remaining))
        say(f"search {request.study}: {remaining} student(s) of {request.settings.teacher} "
            f"at KV cache {request.budget:g} ({request.space.name}, {request.sampler}"
            + (f" around {why}" if request.sampler == "prior" else "") + "), study in "
            f"{redact(url)}, Ray results in {opts.storage_path / run.name}", quiet=opts.quiet)
        status = run_trials(searcher, student_job(request, cache), run)
        return guarded(lambda: summarise(searcher.inner, request.study, url, status), url,
                       opts.storage_patience)


def _open(request: StudentRequest, cache: TeacherCache,
          storage: optuna.storages.RDBStorage) -> optuna.Study:
    """The study, created multi-objective (held-out loss, KV cache bytes per token) or loaded
    to resume (a dead driver's trials failed and retried)."""
    study = open_study(request.study, storage, request.storage,
                       describe_student_search(request, cache), Direction.MINIMIZE,
                       request.resume, more=(Direction.MINIMIZE,))
    if len(study.directions) != 2:
        raise SearchError.of([Problem("study", request.study, "is not a student search's "
                                      "study (one objective); choose a new name",
                                      shown=repr(request.study))])
    if request.resume:
        reaped = reap_trials(study, storage)
        if reaped:
            print(f"--resume: trials {reaped} of the last driver were still running: marked "
                  "interrupted and retried", file=sys.stderr)
        requeue_ray_failures(study)
    return study


def student_job(request: StudentRequest, cache: TeacherCache) -> StudentJob:
    opts = request.options
    return StudentJob(teacher=str(request.settings.teacher), cache=str(cache.folder),
                      seed=opts.seed, device=trial_device(opts),
                      threads=max(1, int(opts.cpus_per_trial)),
                      eval_chunks=eval_parts(cache, request),
                      distil_steps=request.space.distil_steps)


def run_student_search(space: str | Path | StudentSpace, teacher: Path, data: DataSpec,
                       held_out: DataSpec, kv_cache: float, **kwargs: Any) -> SearchSummary:
    """Search the students of ``teacher`` at ``kv_cache``: the Python face of ``workers.search
    --teacher`` (``kwargs``: ``prepare_student``'s)."""
    return execute_student(prepare_student(space, teacher, data, held_out, kv_cache, **kwargs))
