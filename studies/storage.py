"""Open Optuna's own RDB storage from an SQLAlchemy URL, safely for many processes.

* The URL comes from the argument, else ``$OPTUNA_STORAGE`` (as the ``optuna`` CLI), else the
  SQLite file ``studies.db`` in the working directory.
* SQLite: the file is switched to WAL once (persistent), and every connection waits up to
  ``busy_timeout`` seconds for a lock. Without WAL a reader holding a long read stalls every
  writer for the whole read; with it readers and the writer proceed together.
* PostgreSQL: ``pool_pre_ping`` (Optuna enables it only for MySQL), and small pools, since a
  search's many workers would otherwise exhaust the server's connections.
* Heartbeats: with ``heartbeat_interval`` a dead worker's RUNNING trial is failed (and, with
  ``retries``, re-enqueued) by ``fail_stale_trials`` once it is ``grace_period`` seconds silent.
* A URL's secrets are never printed, logged or put in an exception: the user's password
  (``user:pw@``) and the query's ``password``, ``sslpassword`` and ``passfile`` (libpq takes
  them there too). ``redact`` shows each as ``***`` in every message, and driver errors are
  scrubbed of them. ``secure_url`` moves the password into ``$PGPASSWORD`` and the password
  file into ``$PGPASSFILE`` for the drivers built on libpq, before the URL is pickled (Ray's
  state); ``unmask`` turns a printed ``***`` back into ``$PGPASSWORD`` or ``~/.pgpass``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sqlite3
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import optuna
import sqlalchemy
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from studies import records as rec
from studies.errors import StorageError, StorageUnavailableError
from studies.integrity import check_sqlite_file

log = logging.getLogger(__name__)
ENV_VAR = "OPTUNA_STORAGE"
DEFAULT_URL = "sqlite:///studies.db"
SCHEMES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class StorageSettings:
    """Connection settings; the defaults suit a search with a single writing driver."""

    busy_timeout: float = 60.0  # SQLite: seconds a connection waits for a lock
    pool_size: int = 2  # PostgreSQL: connections kept per process
    max_overflow: int = 2  # PostgreSQL: extra connections under load
    pool_timeout: float = 30.0
    heartbeat_interval: int | None = None  # seconds; None disables heartbeats
    grace_period: int | None = None  # seconds without heartbeat before a trial is stale
    retries: int = 0  # re-enqueue a stale trial this many times (0: just FAIL it)


def resolve_url(url: str | None = None) -> str:
    """The URL to use: the argument, else ``$OPTUNA_STORAGE``, else ``sqlite:///studies.db``."""
    return url or os.environ.get(ENV_VAR) or DEFAULT_URL


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StorageError("storage URL is not an SQLAlchemy URL (e.g. sqlite:///studies.db or "
                           "postgresql://user@host/db)") from None


# The libpq connection parameters a URL's query may hold that are, or lead to, a password: a
# password, the password of an SSL key, and the path of a password file (a path that says where
# the secret lives is kept out of every line as well).
SECRET_KEYS = ("password", "sslpassword", "passfile")
MASK = "***"  # what every secret of a printed URL reads as
# The secrets ``secure_url`` can move into libpq's environment (libpq has no variable for an SSL
# key's password: that one stays in the URL, and is only ever printed redacted).
_ENV_OF = {"password": "PGPASSWORD", "passfile": "PGPASSFILE"}
# Letters only, so SQLAlchemy's quoting of a URL leaves it whole (it would write "***" as
# "%2A%2A%2A"): secrets become this token, the URL is rendered, the token becomes MASK.
_TOKEN = "ZZredactedZZ"
SECRET_HINT = "the password is not shown: set $PGPASSWORD or use ~/.pgpass"


@dataclass(frozen=True)
class _Moved:
    """A URL whose secrets ``secure_url`` moved to the environment: how it prints, and them."""

    redacted: str
    secrets: tuple[str, ...]


_MOVED: dict[str, _Moved] = {}  # keyed by the URL secure_url returned


def _parse_quietly(url: str) -> URL | None:
    try:
        return _parse(url)
    except StorageError:
        return None


def _values(value: str | tuple[str, ...] | None) -> list[str]:
    """A query parameter's values (SQLAlchemy gives a repeated one as a tuple)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _secrets(parsed: URL) -> list[str]:
    """Every secret ``parsed`` holds, longest first (a secret inside another is found after)."""
    found = [str(parsed.password)] if parsed.password else []
    for key in SECRET_KEYS:
        found += _values(parsed.query.get(key))
    return sorted({s for s in found if s}, key=len, reverse=True)


def _masked(parsed: URL) -> str:
    query = {k: (_TOKEN if k in SECRET_KEYS else v) for k, v in parsed.query.items()}
    hidden = parsed.set(password=_TOKEN if parsed.password else parsed.password, query=query)
    return hidden.render_as_string(hide_password=False).replace(_TOKEN, MASK)


def redact(url: str) -> str:
    """``url`` with every secret replaced by ``***`` (safe to print): the password of its user
    (``user:pw@``) and the query's ``password``, ``sslpassword`` and ``passfile``. A URL that
    ``secure_url`` returned prints as the URL it came from: ``***`` still says it has one."""
    if url in _MOVED:
        return _MOVED[url].redacted
    parsed = _parse_quietly(url)
    return "<unparseable storage URL>" if parsed is None else _masked(parsed)


def has_secret(url: str) -> bool:
    """Whether ``redact(url)`` hides something (its printed form then needs ``SECRET_HINT``)."""
    parsed = _parse_quietly(redact(url))
    return parsed is not None and MASK in (str(parsed.password), *(
        v for key in SECRET_KEYS for v in _values(parsed.query.get(key))))


def command_note(url: str) -> str:
    """What follows a printed command whose ``--storage`` is ``redact(url)``: a shell comment
    saying where the hidden password comes from (nothing when the URL hides none)."""
    return f"  # {SECRET_HINT}" if has_secret(url) else ""


LIBPQ_DRIVERS = ("postgresql", "postgresql+psycopg2", "postgresql+psycopg")


def _last(value: str | tuple[str, ...] | None) -> str | None:
    values = _values(value)
    return values[-1] if values else None


def _rebuilt(parsed: URL, password: str | None, query: Mapping[str, Any]) -> str:
    """``parsed`` with this password (None: none) and query, as text with its secrets."""
    return URL.create(parsed.drivername, username=parsed.username, password=password,
                      host=parsed.host, port=parsed.port, database=parsed.database,
                      query=query).render_as_string(hide_password=False)


def secure_url(url: str) -> str:
    """``url`` without its password and password file, for the drivers built on libpq (which
    read ``$PGPASSWORD`` and ``$PGPASSFILE`` themselves): the password (the query's, which the
    driver would use, else the user's) moves to ``$PGPASSWORD``, the file to ``$PGPASSFILE``.
    Other drivers (pg8000, MySQL) keep them in the URL, which is only ever printed redacted."""
    parsed = _parse_quietly(url)
    if parsed is None or parsed.drivername not in LIBPQ_DRIVERS:
        return url
    moved = {"password": _last(parsed.query.get("password")) or parsed.password or None,
             "passfile": _last(parsed.query.get("passfile"))}
    if not any(moved.values()):
        return url
    for key, value in moved.items():
        if value:
            os.environ[_ENV_OF[key]] = str(value)
    query = {k: v for k, v in parsed.query.items() if k not in _ENV_OF}
    secured = _rebuilt(parsed, None, query)
    _MOVED[secured] = _Moved(redact(url), tuple(_secrets(parsed)))
    return secured


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error) with every secret of ``url`` replaced by ``***``, as written
    and as quoted in a URL; for a URL ``secure_url`` returned, the secrets it moved."""
    parsed = _parse_quietly(url)
    secrets = _secrets(parsed) if parsed is not None else []
    if url in _MOVED:
        secrets = sorted({*secrets, *_MOVED[url].secrets}, key=len, reverse=True)
    for secret in secrets:
        for form in (secret, quote(secret, safe=""), quote_plus(secret)):
            text = text.replace(form, MASK)
    return text


def _password_file() -> Path:
    """The file libpq reads passwords from: ``$PGPASSFILE``, else ``~/.pgpass``."""
    return Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")


def unmask(url: str) -> str:
    """``url`` as ``redact`` printed it, made usable again: a ``***`` password (the user's or
    the query's) stands for one that was not shown, and becomes ``$PGPASSWORD`` when set, else
    goes, for libpq to read the password file (``$PGPASSFILE`` or ``~/.pgpass``); a ``***``
    password file or SSL key password goes (libpq's defaults apply). A URL without a ``***``
    is returned as given (so a real password that is literally ``***`` cannot be used).

    Raises:
        StorageError: a ``***`` password with neither ``$PGPASSWORD`` nor a password file.
    """
    parsed = _parse_quietly(url)
    holes = _placeholders(parsed) if parsed is not None else []
    if parsed is None or not holes:
        return url
    password = os.environ.get("PGPASSWORD") or None
    user_password = parsed.password
    if {"user", "password"} & set(holes):
        if password is None and not _password_file().is_file():
            raise StorageError(f"storage {redact(url)}: its password *** was hidden when "
                               "printed; set $PGPASSWORD or use ~/.pgpass")
        user_password = password
    query = {k: v for k, v in parsed.query.items() if k not in holes}
    return _rebuilt(parsed, user_password, query)


def _placeholders(parsed: URL) -> list[str]:
    """Where ``parsed`` holds a ``***`` placeholder: "user" (its user's password) or the
    names of the query's secret parameters."""
    found = ["user"] if parsed.password == MASK else []
    return found + [k for k in SECRET_KEYS if MASK in _values(parsed.query.get(k))]


def engine_kwargs(url: str, settings: StorageSettings) -> dict[str, object]:
    backend = _parse(url).get_backend_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": settings.busy_timeout}}
    return {"pool_pre_ping": True, "pool_size": settings.pool_size,
            "max_overflow": settings.max_overflow, "pool_timeout": settings.pool_timeout,
            "pool_recycle": 300}


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


# Read-only commands keep one connection (Optuna's opening of the storage takes a second for a
# moment): fifty of them at once on a server of 100 connections had left it none
# (PostgreSQL's "sorry, too many clients already"); what is refused is retried (``patience``).
READER = StorageSettings(pool_size=1, max_overflow=1)
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
    parsed = _parse(url)
    if parsed.get_backend_name() not in SCHEMES:
        raise StorageError(f"storage {redact(url)}: scheme {parsed.drivername!r} is not "
                           f"supported; use {' or '.join(s + '://' for s in SCHEMES)}")
    started, attempt = time.monotonic(), 0
    while True:
        try:
            if parsed.get_backend_name() == "sqlite":
                _prepare_sqlite(parsed, settings, read_only)
            return _rdb_storage(url, settings)
        except (SQLAlchemyError, sqlite3.Error, RuntimeError, ImportError,
                optuna.exceptions.StorageInternalError) as err:
            waited = time.monotonic() - started
            if not _passes(err) or waited >= patience:
                raise _opening_error(err, url, waited) from None
            if attempt == 0:
                from studies.faults import driver_message

                log.warning("storage %s: %s; retrying for up to %.0f s", redact(url),
                            scrub(driver_message(err), url)[:160], patience)
        # Optuna's half-made storage holds the connection it got until it is collected (the
        # error's traceback, gone here, held it too): a retry must not keep the slot it waits
        # for (a server's or a role's last one).
        gc.collect()
        time.sleep(min(OPEN_BACKOFF_S[min(attempt, len(OPEN_BACKOFF_S) - 1)],
                       max(0.0, patience - (time.monotonic() - started))))
        attempt += 1


def _passes(err: BaseException) -> bool:
    from studies.faults import passes_at_opening

    return passes_at_opening(err)


def _opening_error(err: BaseException, url: str, waited: float
                   ) -> StorageError | StorageUnavailableError:
    """One line: the storage (password hidden), what failed and what to do."""
    from studies.faults import LOST_CONNECTION, UNKNOWN, classify, driver_message

    fault, reason = classify(err), scrub(driver_message(err), url)
    if _passes(err):
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
                return RDBStorage(url, engine_kwargs=engine_kwargs(url, settings),
                                  heartbeat_interval=settings.heartbeat_interval,
                                  grace_period=settings.grace_period,
                                  heartbeat_stale_trial_callback=callback)
            except SQLAlchemyError as err:
                attempt += 1
                if attempt == attempts or not any(sign in str(err).lower()
                                                  for sign in CREATION_RACE):
                    raise
                time.sleep(0.2 * attempt)


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
