"""Open Optuna's own RDB storage from an SQLAlchemy URL, safely for many processes.

* The URL comes from the argument, else ``$OPTUNA_STORAGE``, else ``sqlite:///studies.db``
  (``studies.urls``, which also keeps its secrets out of every message).
* SQLite: the file is switched to WAL once (persistent), and every connection waits up to
  ``busy_timeout`` seconds for a lock. Without WAL a reader holding a long read stalls every
  writer for the whole read; with it readers and the writer proceed together.
* PostgreSQL: ``pool_pre_ping`` (Optuna enables it only for MySQL), and small pools, since a
  search's many workers would otherwise exhaust the server's connections.
* Heartbeats: with ``heartbeat_interval`` a dead worker's RUNNING trial is failed (and, with
  ``retries``, re-enqueued) by ``fail_stale_trials`` once it is ``grace_period`` seconds silent.
* A fault that passes (a dropped connection, a server restarting or without a free
  connection) is retried while opening for ``patience`` seconds, and named in one line
  otherwise (``studies.faults``); a reader's connection attempt is cut off when the patience
  ends, so a server that never answers is not waited on past it.
* A command that only reads (``read_only``) holds one connection from opening to exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
import sqlalchemy
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from studies import records as rec
from studies.errors import StorageError, StorageUnavailableError
from studies.faults import LOST_CONNECTION, UNKNOWN, classify, driver_message, passes_at_opening
from studies.integrity import check_sqlite_file
from studies.urls import parse, redact, resolve_url, scrub

log = logging.getLogger(__name__)
SCHEMES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class StorageSettings:
    """Connection settings; the defaults suit a search with a single writing driver."""

    busy_timeout: float = 60.0  # SQLite: seconds a connection waits for a lock
    pool_size: int = 2  # PostgreSQL: connections kept per process
    max_overflow: int = 2  # PostgreSQL: extra connections under load
    pool_timeout: float = 30.0
    connect_timeout: int | None = None  # PostgreSQL: seconds to wait for the server's answer
    heartbeat_interval: int | None = None  # seconds; None disables heartbeats
    grace_period: int | None = None  # seconds without heartbeat before a trial is stale
    retries: int = 0  # re-enqueue a stale trial this many times (0: just FAIL it)


def engine_kwargs(url: str, settings: StorageSettings) -> dict[str, object]:
    backend = parse(url).get_backend_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": settings.busy_timeout}}
    kwargs: dict[str, object] = {
        "pool_pre_ping": True, "pool_size": settings.pool_size,
        "max_overflow": settings.max_overflow, "pool_timeout": settings.pool_timeout,
        "pool_recycle": 300}
    if settings.connect_timeout is not None and "connect_timeout" not in parse(url).query:
        kwargs["connect_args"] = {"connect_timeout": max(2, settings.connect_timeout)}
    return kwargs


def _prepare_sqlite(parsed: URL, settings: StorageSettings, read_only: bool) -> None:
    """Check the file (read-only: it must exist) or its directory, and switch a file we may
    write to WAL (persistent, done once). A URI-form URL (``file:...?uri=true``, e.g. with
    ``immutable=1`` for read-only media) is opened as given."""
    database = parsed.database
    if not database or database == ":memory:":
        return
    uri = parsed.query.get("uri") == "true" and database.startswith("file:")
    path = Path(database[len("file:"):] if uri else database)
    if read_only and not path.is_file():
        raise StorageError(f"sqlite file {database!r}: no such file (a command that only reads "
                           "never creates a database)")
    if not path.parent.exists():
        raise StorageError(f"sqlite file {database!r}: directory {str(path.parent)!r} does not "
                           "exist")
    check_sqlite_file(path, settings.busy_timeout)  # a damaged file is refused, untouched
    if uri or read_only:
        return  # reading needs no WAL switch, and a read-only file cannot take one
    with sqlite3.connect(path, timeout=settings.busy_timeout) as connection:
        connection.execute("PRAGMA journal_mode=WAL")


# Read-only commands hold one connection, from opening to exit: a pool of one that never grows
# (``_rdb_storage`` keeps Optuna's opening to one connection at a time). Two each had left 100
# queries at once on a server of 100 connections waiting for each other's (PostgreSQL's "sorry,
# too many clients already"); what the server refuses is retried (``patience``).
READER = StorageSettings(pool_size=1, max_overflow=0)
OPEN_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # then every 4 s, between tries at opening


def open_storage(url: str | None = None, settings: StorageSettings | None = None,
                 read_only: bool = False, patience: float = 0.0) -> RDBStorage:
    """Optuna ``RDBStorage`` for ``url`` (see the module docstring for the defaults);
    ``read_only``: for commands that only read, which never create a database (one
    connection, ``READER``, unless ``settings`` say otherwise). A fault that passes (a dropped
    connection, a server restarting or without a free connection) is retried for
    ``patience`` seconds.

    Raises:
        StorageUnavailableError: such a fault lasted past ``patience`` (exit code 1).
        StorageError: wrong scheme, missing directory, unreachable or incompatible database.
    """
    url = resolve_url(url)
    settings = settings or (READER if read_only else StorageSettings())
    parsed = parse(url)
    if parsed.get_backend_name() not in SCHEMES:
        raise StorageError(f"storage {redact(url)}: scheme {parsed.drivername!r} is not "
                           f"supported; use {' or '.join(s + '://' for s in SCHEMES)}")
    started, attempt = time.monotonic(), 0
    while True:
        try:
            if parsed.get_backend_name() == "sqlite":
                _prepare_sqlite(parsed, settings, read_only)
            return _rdb_storage(url, _bounded(settings, read_only, patience, started))
        except (SQLAlchemyError, sqlite3.Error, RuntimeError, ImportError,
                optuna.exceptions.StorageInternalError) as err:
            waited = time.monotonic() - started
            if not passes_at_opening(err) or waited >= patience:
                raise _opening_error(err, url, waited) from None
            if attempt == 0:
                log.warning("storage %s: %s; retrying for up to %.0f s", redact(url),
                            scrub(driver_message(err), url)[:160], patience)
        # Optuna's half-made storage holds the connection it got until it is collected (the
        # error's traceback, gone here, held it too): a retry must not keep the slot it waits
        # for (a server's or a role's last one).
        gc.collect()
        time.sleep(min(OPEN_BACKOFF_S[min(attempt, len(OPEN_BACKOFF_S) - 1)],
                       max(0.0, patience - (time.monotonic() - started))))
        attempt += 1


def _bounded(settings: StorageSettings, read_only: bool, patience: float,
             started: float) -> StorageSettings:
    """A reader's ``settings`` with its connection attempts cut off when its ``patience``
    ends (libpq's least, 2 s, at the last try): a server that takes a connection but does not
    answer (too busy, or a wrong address that drops packets) is not waited on for ever."""
    if not read_only or patience <= 0:
        return settings
    left = math.ceil(patience - (time.monotonic() - started))
    return dataclasses.replace(settings, connect_timeout=max(2, left))


def _opening_error(err: BaseException, url: str, waited: float
                   ) -> StorageError | StorageUnavailableError:
    """One line: the storage (password hidden), what failed and what to do."""
    fault, reason = classify(err), scrub(driver_message(err), url)
    if passes_at_opening(err):
        tried = f" for {waited:.0f} s" if waited >= 1 else ""
        return StorageUnavailableError(f"cannot open storage {redact(url)}: {fault.cause}"
                                       f"{tried} ({reason}); {fault.remedy}, then retry")
    if fault in (UNKNOWN, LOST_CONNECTION):  # the driver's words say it best
        return StorageError(f"cannot open storage {redact(url)}: {reason}")
    return StorageError(f"cannot open storage {redact(url)}: {fault.cause} ({reason}); "
                        f"{fault.remedy}")


CREATION_RACE = ("already exists", "unique constraint failed: alembic_version",
                 "duplicate key value violates unique constraint")


def _rdb_storage(url: str, settings: StorageSettings, attempts: int = 5) -> RDBStorage:
    """Optuna's ``RDBStorage``; on a new database another process may be creating the same
    tables at this moment (two drivers started together), which fails one of them with "table
    ... already exists": it waits for the other to finish and opens what it created."""
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna; we rely on them
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        callback = (RetryHeartbeatStaleTrialCallback(max_retry=settings.retries)
                    if settings.retries else None)
        attempt = 0
        while True:
            try:
                storage = RDBStorage(url, engine_kwargs=engine_kwargs(url, settings),
                                     skip_compatibility_check=True,
                                     heartbeat_interval=settings.heartbeat_interval,
                                     grace_period=settings.grace_period,
                                     heartbeat_stale_trial_callback=callback)
                _check_schema(storage)
                return storage
            except SQLAlchemyError as err:
                attempt += 1
                if attempt == attempts or not any(sign in str(err).lower()
                                                  for sign in CREATION_RACE):
                    raise
                time.sleep(0.2 * attempt)


def _check_schema(storage: RDBStorage) -> None:
    """Optuna's check that its tables' schema is the one this Optuna writes, one connection at
    a time: Optuna's own check (``skip_compatibility_check=False``) reads the schema's revision
    on a second connection while its session holds the first.

    Raises:
        RuntimeError: the schema is older or newer than this Optuna's, in Optuna's words.
    """
    current, head = storage.get_current_version(), storage.get_head_version()
    if current == head:
        return
    remedy = ("execute `optuna storage upgrade --storage $STORAGE_URL` to upgrade the storage"
              if current in storage.get_all_versions() else
              "update optuna to the latest version (`pip install -U optuna`)")
    raise RuntimeError(f"the runtime optuna version {optuna.__version__} is no longer "
                       f"compatible with the table schema (revision {current}, this optuna's "
                       f"is {head}); {remedy}")


def engine(storage: RDBStorage) -> sqlalchemy.Engine:
    """The SQLAlchemy engine behind ``storage`` (for read-only queries on Optuna's tables)."""
    return storage.engine


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Fail trials whose heartbeat went silent (and re-enqueue them if retries are set).

    Returns:
        Numbers of the trials it failed.
    """
    before = {t.number for t in study.get_trials(deepcopy=False,
                                                 states=(optuna.trial.TrialState.FAIL,))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    after = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
    failed = sorted(t.number for t in after if t.number not in before)
    if failed:
        log.warning("failed %d stale trial(s): %s", len(failed), failed)
    return failed


def retry_failed(study: optuna.Study, number: int) -> None:
    """Enqueue a copy of failed trial ``number``, marked as Optuna's own retries are (so
    ``RetryHeartbeatStaleTrialCallback.retried_trial_number`` finds it)."""
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback()(study, trial)


def _running(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def reap_trials(study: optuna.Study, storage: RDBStorage) -> list[int]:
    """Fail and retry every RUNNING trial of ``study``, for a driver that holds the study's
    lease (``studies.lease``): no other driver runs them, so they are a dead driver's, with no
    need to wait for their heartbeats to lapse. Each is marked interrupted with its error
    before it is failed, so no trial is ever failed unmarked; one that finished meanwhile keeps
    its state.

    Returns:
        Numbers of the trials it failed (each re-enqueued).
    """
    failed = []
    for trial in _running(study):
        if fail_marked(storage, study, trial.number, rec.TrialStatus.INTERRUPTED,
                       INTERRUPTED):
            retry_failed(study, trial.number)
            failed.append(trial.number)
    return failed


def fail_marked(storage: RDBStorage, study: optuna.Study, number: int,
                status: rec.TrialStatus, error: str) -> bool:
    """FAIL the RUNNING trial ``number`` after recording its ``status`` and ``error``, so it is
    never failed unmarked; False if it had finished meanwhile (it keeps its state)."""
    trial_id = _mark(storage, study, number, status, error)
    try:
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


INTERRUPTED = "its driver stopped while it ran; failed, and retried when the search resumed"


def _mark(storage: RDBStorage, study: optuna.Study, number: int, status: rec.TrialStatus,
          error: str | None) -> int:
    """Record a RUNNING trial's status and error (a finished trial takes no attrs)."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), number)
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_user_attr(trial_id, rec.STATUS, str(status))
        storage.set_trial_user_attr(trial_id, rec.ERROR, error)
    return trial_id
