"""A storage that fails while a search runs: the fault in words, retried while it may pass.

A database write can fail for reasons that are nobody's bug: the disk is full, the file or its
filesystem turned read-only, the server went away for a restart, the role lost its privileges.
Optuna wraps the driver's error in ``StorageInternalError`` ("... e.g. exceeding max length"),
which names none of them. ``describe`` walks the exception chain to the driver's own message
and names the fault, the storage (password hidden) and what to do; ``guarded`` retries a call
while the fault is one that passes by itself (a lost connection, a locked file), with backoff,
for at most ``PATIENCE_S`` seconds, and raises ``StorageFaultError`` (one line) otherwise.

A retried write may have reached the database before its connection dropped; Optuna's ask is
not idempotent, so a retried ask can leave a RUNNING trial nobody runs: the search's guard
(``workers.search.guard``) records such orphans as not trained before it asks again.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import optuna
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from common.errors import Problem
from studies.errors import StorageFaultError
from studies.urls import redact, scrub

PATIENCE_S = 60.0  # how long a passing fault (a server restart) is waited out
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # then every 8 s until PATIENCE_S
STORAGE_ERRORS = (SQLAlchemyError, sqlite3.Error, optuna.exceptions.StorageInternalError)
Result = TypeVar("Result")


@dataclass(frozen=True)
class Fault:
    """A kind of storage fault: how the driver says it, what it means, what to do."""

    signs: tuple[str, ...]  # lower-case fragments of the driver's message
    cause: str
    remedy: str
    passes: bool = False  # may go away by itself: retried for PATIENCE_S


LOST_CONNECTION = Fault(
    ("server closed the connection", "terminating connection", "connection refused",
     "could not connect", "connection to server", "the database system is", "connection reset",
     "connection timed out", "connection is closed", "ssl syscall", "no connection to the server",
     "not currently accepting connections", "database is locked", "connection timeout expired"),
    "the connection to it was lost", "check that the database server is up and reachable",
    passes=True)
SERVER_FULL = Fault(
    ("too many clients", "remaining connection slots", "too many connections"),
    "the database server has no free connection",
    "wait for fewer clients (or raise the server's max_connections)",
    passes=True)
# A connection that was made and dropped, a server that is starting or stopping, or one that
# took the connection and did not answer within the opening's patience (a reader's
# ``connect_timeout``: too busy): at opening time these pass; a connection refused from the
# start is more often a wrong host or port.
DROPPED = ("terminating connection", "server closed the connection", "connection reset",
           "ssl syscall", "no connection to the server", "the database system is",
           "not currently accepting connections", "database is locked", "connection is closed",
           "connection timeout expired")
FAULTS = (
    SERVER_FULL,
    Fault(("database or disk is full", "no space left on device", "could not extend file",
           "could not write to file"),
          "the disk holding it is full", "free space on that disk"),
    Fault(("readonly database", "read-only file system", "read-only transaction",
           "unable to open database file"),
          "it cannot be written (a read-only file, directory or filesystem)",
          "make it writable"),
    Fault(("permission denied", "insufficient privilege", "must be owner"),
          "the database role lacks privileges on its tables",
          "grant the role SELECT, INSERT, UPDATE and DELETE on the study tables (or use the "
          "role that created them)"),
    LOST_CONNECTION,
)
UNKNOWN = Fault((), "the database refused a write", "fix the database")


def passes_at_opening(err: BaseException) -> bool:
    """Whether ``err``, raised while a storage was being opened, is a fault that passes (a
    dropped connection, a restarting or full server), not a wrong address or database."""
    fault = classify(err)
    if fault is SERVER_FULL:
        return True
    lowered = driver_message(err).lower()
    return fault is LOST_CONNECTION and any(sign in lowered for sign in DROPPED)


def driver_message(err: BaseException) -> str:
    """The first line of the database driver's own message in ``err``'s chain (the first
    SQLAlchemy error's original), under Optuna's and SQLAlchemy's wrappers."""
    fallback, seen = "", set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError) and str(current.orig).strip():
            return str(current.orig).strip().splitlines()[0]
        text = str(current).strip()
        if not fallback and text and not isinstance(current,
                                                    optuna.exceptions.StorageInternalError):
            fallback = text.splitlines()[0]
        current = current.__cause__ or current.__context__
    return fallback or type(err).__name__


def classify(err: BaseException) -> Fault:
    """The fault ``err`` is (``UNKNOWN`` if its message is none of ``FAULTS``)."""
    lowered = driver_message(err).lower()
    if isinstance(err, DBAPIError) and err.connection_invalidated:
        return LOST_CONNECTION
    return next((f for f in FAULTS if any(sign in lowered for sign in f.signs)), UNKNOWN)


def describe(err: BaseException, url: str, waited: float = 0.0) -> StorageFaultError:
    """One line: the storage (password hidden), the fault in words, the database's own words,
    what to do."""
    fault, said = classify(err), driver_message(err)
    said = scrub(said, url)
    tried = f" for {waited:.0f} s" if waited >= 1 else ""
    return StorageFaultError.of([Problem("storage", redact(url), f"{fault.cause}{tried} "
                                         f"({said[:160]}); {fault.remedy}, then continue with "
                                         "{resume}")])


def guarded(call: Callable[[], Result], url: str, patience: float = PATIENCE_S,
            sleep: Callable[[float], None] = time.sleep,
            before_retry: Callable[[], object] | None = None) -> Result:
    """``call()``, retried with backoff while its storage fault may pass (at most ``patience``
    seconds); ``before_retry()`` first undoes what a failed attempt may have half done.

    Raises:
        StorageFaultError: the fault persists or cannot pass (one line, ``describe``).
    """
    started, attempt = time.monotonic(), 0
    while True:
        try:
            if attempt and before_retry is not None:
                before_retry()
            return call()
        except STORAGE_ERRORS as err:
            waited = time.monotonic() - started
            if not classify(err).passes or waited >= patience:
                raise describe(err, url, waited) from None
            pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
            sleep(min(pause, max(0.0, patience - waited)))
            attempt += 1
