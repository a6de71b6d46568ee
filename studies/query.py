"""Read-only queries on Optuna's own tables through SQLAlchemy Core.

``optuna.load_study(...).get_all_trials()`` rebuilds every trial with every attribute (seconds
for thousands of trials); these queries read only the columns they need, and fetch the
architecture JSON only for the trials they return. Nothing here writes: writes go through Optuna.

Winners are COMPLETE trials that reached the study's full training length (the largest
``steps_reached`` among complete trials): a trial stopped early is never reported over a fully
trained one, whatever its partial value.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from arch import ArchConfig, dtype_bytes
from common.errors import Problem, printable
from studies import records as rec, seeds
from studies.errors import QueryError
from studies.seeds import SeedComparison, SeedPoint
from studies.trials import OLD_KV_DTYPE, Direction, TrialRecord

_studies = sa.table("studies", sa.column("study_id"), sa.column("study_name"))
_directions = sa.table("study_directions", sa.column("study_id"), sa.column("direction"),
                       sa.column("objective"))
_study_attrs = sa.table("study_user_attributes", sa.column("study_id"), sa.column("key"),
                        sa.column("value_json"))
_trials = sa.table("trials", sa.column("trial_id"), sa.column("number"), sa.column("study_id"),
                   sa.column("state"), sa.column("datetime_start"),
                   sa.column("datetime_complete"))
_values = sa.table("trial_values", sa.column("trial_id"), sa.column("objective"),
                   sa.column("value"), sa.column("value_type"))
_trial_attrs = sa.table("trial_user_attributes", sa.column("trial_id"), sa.column("key"),
                        sa.column("value_json"))
_heartbeats = sa.table("trial_heartbeats", sa.column("trial_id"), sa.column("heartbeat"))
_params = sa.table("trial_params", sa.column("trial_id"), sa.column("param_name"),
                   sa.column("param_value"), sa.column("distribution_json"))
TRAIN_PREFIX = "train."  # a sampled training field's parameter name (``train.lr``)
_SMALL_ATTRS = tuple(k for k in rec.TRIAL_ATTRS if k != rec.ARCH)
# Optuna stores these as ENUM types on PostgreSQL: compare and read them as text.
_STATE = sa.cast(_trials.c.state, sa.String)
_VALUE_TYPE = sa.cast(_values.c.value_type, sa.String)
_DIRECTION = sa.cast(_directions.c.direction, sa.String)


# The x axes of a Pareto front: trainable parameters, or KV cache bytes per token.
PARETO_AXES = ("params", "kv_cache")
# A student search's study records its teacher's KV units per token (``studies best --kv-cache``)
TEACHER_KV_UNITS = "teacher_kv_units"


@dataclass(frozen=True)
class StudySummary:
    name: str
    direction: str
    counts: dict[str, int]
    best: float | None
    attrs: dict[str, Any]
    created: datetime | None
    updated: datetime | None


def _value(value: float | None, kind: str | None) -> float | None:
    if kind == "INF_POS":
        return float("inf")
    if kind == "INF_NEG":
        return float("-inf")
    return value


def record_warning(summary: StudySummary) -> str | None:
    """One line if the study predates trial records of the trained model (``RECORD_SCHEMA``)."""
    schema = summary.attrs.get("record_schema")
    if schema == rec.RECORD_SCHEMA:
        return None
    return (f"warning: study {summary.name!r} has record_schema {schema!r}, not "
            f"{rec.RECORD_SCHEMA}: it was written by an older version whose parameter counts "
            "(params_trainable/params_total) are unreliable")


def list_studies(engine: sa.Engine) -> list[StudySummary]:
    """Every study with trial counts by state, best value, description and dates."""
    with engine.connect() as conn:
        studies = conn.execute(sa.select(_studies.c.study_id, _studies.c.study_name)
                               .order_by(_studies.c.study_id)).all()
        directions: dict[int, str] = dict(conn.execute(sa.select(_directions.c.study_id, _DIRECTION)
                                       .where(_directions.c.objective == 0)).all())
        counts: dict[int, dict[str, int]] = {}
        for sid, state, n in conn.execute(sa.select(_trials.c.study_id, _STATE, sa.func.count())
                                          .group_by(_trials.c.study_id, _STATE)):
            counts.setdefault(sid, {})[state] = n
        dates = {sid: (lo, hi) for sid, lo, hi in conn.execute(
            sa.select(_trials.c.study_id, sa.func.min(_trials.c.datetime_start),
                      sa.func.max(_trials.c.datetime_complete)).group_by(_trials.c.study_id))}
        best = _best_values(conn, directions)
        attrs: dict[int, dict[str, Any]] = {}
        for sid, key, value in conn.execute(sa.select(_study_attrs.c.study_id, _study_attrs.c.key,
                                                      _study_attrs.c.value_json)):
            attrs.setdefault(sid, {})[key] = json.loads(value)
    return [StudySummary(name, str(directions.get(sid, "MINIMIZE")), counts.get(sid, {}),
                         best.get(sid), attrs.get(sid, {}), *dates.get(sid, (None, None)))
            for sid, name in studies]


def _best_values(conn: sa.Connection, directions: dict[int, str]) -> dict[int, float]:
    rows = conn.execute(sa.select(_trials.c.study_id, sa.func.min(_values.c.value),
                                  sa.func.max(_values.c.value))
                        .join(_values, _values.c.trial_id == _trials.c.trial_id)
                        .where(_STATE == "COMPLETE", _values.c.objective == 0,
                               _VALUE_TYPE == "FINITE")
                        .group_by(_trials.c.study_id))
    return {sid: (hi if _maximized(directions.get(sid)) else lo) for sid, lo, hi in rows}


def _maximized(direction: str | None) -> bool:
    """Whether Optuna's stored direction (a ``StudyDirection`` name) maximises."""
    return Direction.from_storage(direction) is Direction.MAXIMIZE


def _study(conn: sa.Connection, name: str) -> tuple[int, str]:
    row = conn.execute(sa.select(_studies.c.study_id).where(_studies.c.study_name == name)).first()
    if row is None:
        names = [n for (n,) in conn.execute(sa.select(_studies.c.study_name))]
        listed = ', '.join(printable(n) for n in names) if names else '(none)'
        raise QueryError.of([Problem("study", name, f"no such study; studies: {listed}",
                                     shown=repr(name))])
    direction = conn.execute(sa.select(_DIRECTION).where(
        _directions.c.study_id == row[0], _directions.c.objective == 0)).scalar()
    return int(row[0]), str(direction or "MINIMIZE")


def load_trials(engine: sa.Engine, study: str, states: tuple[str, ...] | None = ("COMPLETE",)
                ) -> tuple[str, list[TrialRecord]]:
    """The study's direction and its trials (small attrs only), in trial-number order."""
    with engine.connect() as conn:
        sid, direction = _study(conn, study)
        query = (sa.select(_trials.c.trial_id, _trials.c.number, _STATE, _values.c.value,
                           _VALUE_TYPE)
                 .outerjoin(_values, sa.and_(_values.c.trial_id == _trials.c.trial_id,
                                             _values.c.objective == 0))
                 .where(_trials.c.study_id == sid).order_by(_trials.c.number))
        if states is not None:
            query = query.where(_STATE.in_(states))
        rows = {tid: (number, state, _value(value, kind))
                for tid, number, state, value, kind in conn.execute(query)}
        attrs = (sa.select(_trial_attrs.c.trial_id, _trial_attrs.c.key, _trial_attrs.c.value_json)
                 .join(_trials, _trials.c.trial_id == _trial_attrs.c.trial_id)
                 .where(_trials.c.study_id == sid, _trial_attrs.c.key.in_(_SMALL_ATTRS)))
        found = _attrs_by_trial(conn.execute(attrs))
    return direction, [TrialRecord.from_attrs(tid, *row, found.get(tid, {}))
                       for tid, row in rows.items()]


def _attrs_by_trial(rows: Iterable[Any]) -> dict[int, dict[str, Any]]:
    """``(trial_id, key, value_json)`` rows as each trial's user attrs."""
    found: dict[int, dict[str, Any]] = {}
    for tid, key, value in rows:
        found.setdefault(tid, {})[key] = json.loads(value)
    return found


def attach_archs(engine: sa.Engine, trials: list[TrialRecord]) -> list[TrialRecord]:
    """The given trials with ``arch`` and ``train`` (the sampled training fields, which tell
    apart trials of one architecture) filled in (two queries)."""
    from optuna.distributions import json_to_distribution

    ids = [t.trial_id for t in trials if t.trial_id is not None]
    if not ids:
        return trials
    archs: dict[int, ArchConfig] = {}
    train: dict[int, dict[str, Any]] = {}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(_trial_attrs.c.trial_id, _trial_attrs.c.value_json)
                            .where(_trial_attrs.c.key == rec.ARCH,
                                   _trial_attrs.c.trial_id.in_(ids)))
        for tid, value in rows:
            archs[tid] = ArchConfig.from_json(json.loads(value))
        params = conn.execute(sa.select(_params.c.trial_id, _params.c.param_name,
                                        _params.c.param_value, _params.c.distribution_json)
                              .where(_params.c.trial_id.in_(ids),
                                     _params.c.param_name.startswith(TRAIN_PREFIX)))
        for tid, name, value, distribution in params:
            shown = json_to_distribution(distribution).to_external_repr(value)
            train.setdefault(tid, {})[name.removeprefix(TRAIN_PREFIX)] = shown
    return [t if t.trial_id is None else dataclasses.replace(
                t, arch=archs.get(t.trial_id, t.arch), train=train.get(t.trial_id, t.train))
            for t in trials]


def eligible(trials: list[TrialRecord]) -> list[TrialRecord]:
    """Complete trials with a value that reached the full length (max ``steps_reached``)."""
    done = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    full_steps = max((t.steps_reached for t in done if t.steps_reached is not None), default=None)
    return [t for t in done if full_steps is None or t.steps_reached in (None, full_steps)]


def _attr(key: str) -> sa.Subquery:
    return (sa.select(_trial_attrs.c.trial_id, _trial_attrs.c.value_json)
            .where(_trial_attrs.c.key == key).subquery())


def _eligible_rows(conn: sa.Connection, sid: int, *extra: str) -> sa.Select[Any]:
    """SELECT trial_id, number, value[, extra attrs as JSON] of the eligible trials (SQL)."""
    steps = _attr(rec.STEPS_REACHED)
    done = (sa.select(steps.c.value_json).distinct()
            .join(_trials, _trials.c.trial_id == steps.c.trial_id)
            .where(_trials.c.study_id == sid, _STATE == "COMPLETE"))
    reached = [json.loads(v) for (v,) in conn.execute(done)]
    full_steps = max((r for r in reached if r is not None), default=None)
    extras = [_attr(key) for key in extra]
    query = (sa.select(_trials.c.trial_id, _trials.c.number, _values.c.value,
                       *[a.c.value_json for a in extras])
             .join(_values, sa.and_(_values.c.trial_id == _trials.c.trial_id,
                                    _values.c.objective == 0))
             .outerjoin(steps, steps.c.trial_id == _trials.c.trial_id)
             .where(_trials.c.study_id == sid, _STATE == "COMPLETE", _VALUE_TYPE == "FINITE"))
    for a in extras:
        query = query.outerjoin(a, a.c.trial_id == _trials.c.trial_id)
    if full_steps is not None:  # never rank a trial stopped before the full length
        query = query.where(sa.or_(steps.c.trial_id.is_(None),
                                   steps.c.value_json.in_([json.dumps(full_steps), "null"])))
    return query


def _fill(engine: sa.Engine, rows: Sequence[tuple[int, int, float]]) -> list[TrialRecord]:
    """The COMPLETE trials ``(trial_id, number, value)`` with their small attrs and their
    architecture (three queries)."""
    with engine.connect() as conn:
        found = _attrs_by_trial(conn.execute(
            sa.select(_trial_attrs.c.trial_id, _trial_attrs.c.key, _trial_attrs.c.value_json)
            .where(_trial_attrs.c.trial_id.in_([tid for tid, _, _ in rows]),
                   _trial_attrs.c.key.in_(_SMALL_ATTRS))))
    return attach_archs(engine, [TrialRecord.from_attrs(tid, number, "COMPLETE", value,
                                                        found.get(tid, {}))
                                 for tid, number, value in rows])


def seed_points(engine: sa.Engine, study: str, pooled: Sequence[str] = ()
                ) -> tuple[str, list[SeedPoint]]:
    """The study's direction and its fully trained trials grouped into points told apart only
    by their seeds (``studies.seeds``), with the trials of the ``pooled`` studies (the same
    task, metric and direction: e.g. an arm trained later in a study of its own) joining them.

    Raises:
        QueryError: no complete trial yet; a pooled study of another task, metric or
            direction.
    """
    direction, trials = load_trials(engine, study)
    others = {name: _pooled_trials(engine, study, name, direction) for name in pooled}
    points = seeds.seed_points(attach_archs(engine, eligible(trials)), others)
    if not points:
        raise QueryError.of([Problem("study", study, "no complete trial yet", shown=repr(study))])
    return direction, points


def _pooled_trials(engine: sa.Engine, study: str, other: str, direction: str
                   ) -> list[TrialRecord]:
    """``other``'s fully trained trials, refused unless it measured what ``study`` did."""
    with engine.connect() as conn:
        _study(conn, other)  # QueryError: no such study, naming the others
    summaries = {s.name: s for s in list_studies(engine)}
    mine, theirs = summaries[study], summaries[other]
    for key in ("task", "metric"):
        if mine.attrs.get(key) != theirs.attrs.get(key):
            raise QueryError.of([Problem("with", other, f"its {key} "
                                         f"{theirs.attrs.get(key)!r} differs from "
                                         f"{mine.attrs.get(key)!r} (study {study!r}'s): its "
                                         "values do not compare",
                                         shown=repr(other))])
    other_direction, trials = load_trials(engine, other)
    if other_direction != direction:
        raise QueryError.of([Problem("with", other, f"it is {other_direction.lower()}d, study "
                                     f"{study!r} {direction.lower()}d", shown=repr(other))])
    return attach_archs(engine, eligible(trials))


def compare_seeds(engine: sa.Engine, study: str, against: int | None = None,
                  pooled: Sequence[str] = ()) -> list[SeedComparison]:
    """Every point of the study (and of the ``pooled`` studies: ``seed_points``) against the
    one holding trial ``against`` of the study (default: the point with the best mean), paired
    over their shared seeds (``studies.seeds.compare``).

    Raises:
        QueryError: no complete trial yet, or ``against`` in no point (not a fully trained
            trial).
    """
    direction, points = seed_points(engine, study, pooled)
    maximize = _maximized(direction)
    holding = [p for p in points if str(against) in p.trial_names]
    if against is not None and not holding:
        raise QueryError.of([Problem("against", against, "is not a fully trained trial of "
                                     f"study {study!r}")])
    reference = holding[0] if holding else \
        (max if maximize else min)(points, key=lambda p: p.value.mean)
    return seeds.compare(points, reference, maximize)


def top(engine: sa.Engine, study: str, k: int, kv_cache: float | None = None
        ) -> tuple[str, list[TrialRecord]]:
    """The ``k`` best eligible trials (ties: earlier trial first), ordered in SQL; with
    ``kv_cache``, only those caching at most that fraction of the teacher's KV cache per token
    (a student search's study, which records its teacher's units).

    Raises:
        QueryError: no such trial, or ``kv_cache`` on a study with no teacher.
    """
    with engine.connect() as conn:
        sid, direction = _study(conn, study)
        value = _values.c.value.desc() if _maximized(direction) else _values.c.value.asc()
        query = _eligible_rows(conn, sid).order_by(value, _trials.c.number)
        if kv_cache is None:
            rows = [tuple(r) for r in conn.execute(query.limit(k))]
        else:
            rows = _within(engine, conn, sid, study, kv_cache, value)[:k]
    if not rows:
        within = "" if kv_cache is None else f" within kv_cache {kv_cache:g}"
        raise QueryError.of([Problem("study", study, f"no complete trial{within} yet",
                                     shown=repr(study))])
    return direction, _fill(engine, [(tid, number, v) for tid, number, v in rows])


def _within(engine: sa.Engine, conn: sa.Connection, sid: int, study: str, kv_cache: float,
            order: Any) -> list[tuple[int, int, float]]:
    """The eligible rows, best first, whose student caches at most ``kv_cache`` of its
    teacher's KV units per token."""
    units = conn.execute(sa.select(_study_attrs.c.value_json).where(
        _study_attrs.c.study_id == sid, _study_attrs.c.key == TEACHER_KV_UNITS)).scalar()
    if units is None:
        raise QueryError.of([Problem("kv_cache", f"{kv_cache:g}", f"study {study!r} records no "
                                     "teacher's KV cache (only a student search's does)")])
    allowed = kv_cache * int(json.loads(units)) + 1e-9
    rows = conn.execute(_eligible_rows(conn, sid, rec.KV_CACHE, rec.KV_CACHE_DTYPE)
                        .order_by(order, _trials.c.number)).all()
    sizes = _kv_units(engine, rows)
    return [(tid, number, v) for tid, number, v, *_ in rows if sizes[tid] <= allowed]


def trial_attr(engine: sa.Engine, study: str, number: int, key: str) -> Any:
    """User attr ``key`` of trial ``number`` (None where it has none).

    Raises:
        QueryError: no such study or trial.
    """
    with engine.connect() as conn:
        sid, _ = _study(conn, study)
        tid = conn.execute(sa.select(_trials.c.trial_id).where(
            _trials.c.study_id == sid, _trials.c.number == number)).scalar()
        if tid is None:
            raise QueryError.of([Problem("trial", number, f"study {study!r} has no such trial")])
        value = conn.execute(sa.select(_trial_attrs.c.value_json).where(
            _trial_attrs.c.trial_id == tid, _trial_attrs.c.key == key)).scalar()
    return None if value is None else json.loads(value)


def pareto(engine: sa.Engine, study: str, x: str = "params") -> tuple[str, list[TrialRecord]]:
    """Trials no other eligible trial beats on both value and ``x``: trainable parameters
    (``params``) or the KV cache per token (``kv_cache``).

    The KV cache is compared in key/value units (bytes over the dtype's size), so trials
    recorded at different dtypes rank fairly; trials recorded before it existed get it from
    their architecture.
    """
    if x not in PARETO_AXES:
        raise QueryError.of([Problem("x", repr(x), f"must be one of {', '.join(PARETO_AXES)}")])
    keys = (rec.PARAMS_TRAINABLE,) if x == "params" else (rec.KV_CACHE, rec.KV_CACHE_DTYPE)
    with engine.connect() as conn:
        sid, direction = _study(conn, study)
        rows = conn.execute(_eligible_rows(conn, sid, *keys)).all()
    sizes = ({tid: json.loads(p) if p else 0 for tid, _, _, p in rows} if x == "params"
             else _kv_units(engine, rows))
    sign = -1.0 if _maximized(direction) else 1.0
    points = sorted((sizes[tid], sign * v, number, tid) for tid, number, v, *_ in rows)
    front, best_so_far = [], float("inf")
    for _, score, number, tid in points:  # fewest params first: keep strict improvements
        if score < best_so_far:
            front.append((tid, number, sign * score))
            best_so_far = score
    if not front:
        raise QueryError.of([Problem("study", study, "no complete trial yet", shown=repr(study))])
    return direction, _fill(engine, front)


def _kv_units(engine: sa.Engine, rows: Sequence[Any]) -> dict[int, int]:
    """Key/value units per token of ``(trial_id, number, value, kv_cache, dtype)`` rows: the
    recorded bytes over the dtype's size, else (older trials) the architecture's ``kv_width``
    (their architectures read in one query)."""
    units: dict[int, int] = {}
    old: list[TrialRecord] = []
    for tid, number, value, size, dtype in rows:
        size, dtype = (json.loads(size) if size else None), (json.loads(dtype) if dtype else None)
        if size is None:
            old.append(TrialRecord(tid, number, "COMPLETE", value))
        else:
            units[tid] = int(size) // dtype_bytes(str(dtype or OLD_KV_DTYPE))
    for trial in attach_archs(engine, old):
        assert trial.trial_id is not None  # read from the storage
        units[trial.trial_id] = trial.arch.kv_width if trial.arch is not None else 0
    return units


def layer_summary(trials: list[TrialRecord]) -> list[dict[str, Any]]:
    """Per depth across ``trials`` (with archs): the most common attention, heads and qk_dim."""
    depth = max((t.arch.n_layers for t in trials if t.arch), default=0)
    rows = []
    for i in range(depth):
        layers = [t.arch.layers[i] for t in trials if t.arch and i < t.arch.n_layers]
        row: dict[str, Any] = {"layer": i, "trials": len(layers)}
        for name, values in (("attention", [x.attention for x in layers]),
                             ("heads", [x.heads_str for x in layers]),
                             ("n_heads", [x.n_heads for x in layers]),
                             ("qk_dim", [max(g.qk_dim for g in x.heads) for x in layers]),
                             ("mlp_ratio", [x.mlp_ratio for x in layers])):
            winner, n = Counter(values).most_common(1)[0]
            row[name], row[f"{name}_share"] = winner, n / len(layers)
        rows.append(row)
    return rows


def theory(engine: sa.Engine, study: str) -> dict[str, Any]:
    """Allocator's predicted error vs measured value per eligible trial, with rank correlation."""
    _, trials = load_trials(engine, study)
    points = [(t.number, t.predicted_error, t.value) for t in eligible(trials)
              if t.predicted_error is not None]
    if len(points) < 2:
        raise QueryError.of([Problem("study", study, "needs at least two complete trials with a "
                                     "predicted_error", shown=repr(study))])
    predicted, measured = [p[1] for p in points], [p[2] for p in points]
    rho, undefined = None, None
    for name, xs in (("predicted error", predicted), ("measured value", measured)):
        if len(set(xs)) == 1:  # Spearman's rho is undefined (SciPy warns and returns nan)
            undefined = f"every {name} is {xs[0]:.6g}: the rank correlation is undefined"
    if undefined is None:
        from scipy.stats import spearmanr  # 0.5 s to import: the other queries need none

        rho = float(spearmanr(predicted, measured).statistic)
    return {"spearman": rho, "undefined": undefined, "n": len(points),
            "trials": [{"number": n, "predicted_error": p, "value": v} for n, p, v in points]}


FAILURE_ATTRS = (rec.STATUS, rec.ERROR, rec.STEPS_REACHED)  # what says why a trial failed


def failed_trials(engine: sa.Engine, study: str) -> list[TrialRecord]:
    """The study's FAIL trials in number order, with their status, error and steps reached
    (a duplicate proposal and a trial that was retried are failures too: their error says)."""
    with engine.connect() as conn:
        sid, _ = _study(conn, study)
        rows = conn.execute(sa.select(_trials.c.trial_id, _trials.c.number)
                            .where(_trials.c.study_id == sid, _STATE == "FAIL")
                            .order_by(_trials.c.number)).all()
        attrs = (sa.select(_trial_attrs.c.trial_id, _trial_attrs.c.key, _trial_attrs.c.value_json)
                 .join(_trials, _trials.c.trial_id == _trial_attrs.c.trial_id)
                 .where(_trials.c.study_id == sid, _STATE == "FAIL",
                        _trial_attrs.c.key.in_(FAILURE_ATTRS)))
        found = _attrs_by_trial(conn.execute(attrs))
    return [TrialRecord.from_attrs(tid, number, "FAIL", None, found.get(tid, {}))
            for tid, number in rows]


def find_trial(engine: sa.Engine, study: str, number: int | None) -> TrialRecord:
    """Trial ``number`` (any state), or the best eligible one when ``number`` is None."""
    if number is None:
        return top(engine, study, 1)[1][0]
    _, trials = load_trials(engine, study, states=None)
    match = attach_archs(engine, [t for t in trials if t.number == number])
    if not match:
        raise QueryError.of([Problem("trial", number, f"study {study!r} has no such trial")])
    if match[0].arch is None:
        raise QueryError.of([Problem("trial", number, "has no recorded architecture")])
    return match[0]


def beating_numbers(engine: sa.Engine, study: str) -> set[int]:
    """Numbers of the study's trials that ever recorded an Optuna heartbeat."""
    query = (sa.select(_trials.c.number)
             .join(_heartbeats, _heartbeats.c.trial_id == _trials.c.trial_id)
             .join(_studies, _studies.c.study_id == _trials.c.study_id)
             .where(_studies.c.study_name == study))
    with engine.connect() as conn:
        return set(conn.scalars(query))


WINDOW_LOSSES = "window_losses"  # a student trial's loss on every held-out window (JSON)


@dataclass(frozen=True)
class WindowComparison:
    """A trial's held-out loss against the reference trial's, paired by window: the mean
    difference and its 95% bootstrap interval (below 0: the trial is better)."""

    number: int
    label: str | None  # a fixed allocation's name (``plan``, ``uniform``, ``palu``), or None
    kv_cache: int | None  # bytes per token
    loss: float
    difference: float
    low: float
    high: float


def compare_windows(engine: sa.Engine, study: str, against: int | None = None
                    ) -> tuple[int, list[WindowComparison]]:
    """Every complete trial that recorded its window losses against trial ``against``
    (default: the one labelled ``plan``, the allocator's), paired by window, best first.

    Raises:
        QueryError: no such trials, or ``against`` without window losses.
    """
    from common.stats import paired_bootstrap

    with engine.connect() as conn:
        sid, _ = _study(conn, study)
        rows = conn.execute(_eligible_rows(conn, sid, WINDOW_LOSSES, rec.SEED, rec.KV_CACHE)
                            ).all()
    found = {number: (json.loads(json.loads(w)), json.loads(s) if s else None,
                      json.loads(kv) if kv else None)
             for _, number, _, w, s, kv in rows if w}
    reference = against if against is not None else next(
        (n for n, (_, label, _) in found.items() if label == "plan"), None)
    if reference is None or reference not in found:
        raise QueryError.of([Problem("against", reference, f"no complete trial of study "
                                     f"{study!r} with window losses (a student search's)")])
    base = found[reference][0]
    out = []
    for number, (losses, label, kv) in found.items():
        if len(losses) != len(base):
            continue
        diff, low, high = paired_bootstrap(losses, base)
        out.append(WindowComparison(number, label, kv, sum(losses) / len(losses), diff, low,
                                    high))
    return reference, sorted(out, key=lambda c: (c.loss, c.number))
