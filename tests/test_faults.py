"""A storage fault in words, retried only while it may pass: the database's own message is
found under Optuna's wrapper, a lost connection is retried with backoff until it comes back or
the patience runs out, a full disk is not retried, and the line never holds the password."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest

from studies.errors import StorageFaultError
from studies.faults import classify, describe, guarded

URL = "postgresql://alice:s3cret@db.example/optuna"


def _wrapped(message: str) -> Exception:
    """``message`` from the driver, as Optuna raises it (StorageInternalError from it)."""
    try:
        try:
            raise sqlite3.OperationalError(message)
        except sqlite3.OperationalError as err:
            raise optuna.exceptions.StorageInternalError("e.g. exceeding max length") from err
    except optuna.exceptions.StorageInternalError as wrapped:
        return wrapped


def test_a_full_disk_is_named_and_not_retried() -> None:
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise _wrapped("database or disk is full")

    with pytest.raises(StorageFaultError) as err:
        guarded(write, URL, patience=30, sleep=lambda s: None)
    assert calls == [1]
    line = str(err.value)  # the library's words; a command names its flags instead
    assert line == ("storage postgresql://alice:***@db.example/optuna: the disk holding it is "
                    "full (database or disk is full); free space on that disk, then continue "
                    "with resume")
    assert err.value.text({"storage": "--storage", "resume": "--resume"}).startswith(
        "--storage postgresql://alice:***@") and line.endswith("resume")
    assert err.value.text({"resume": "--resume"}).endswith("continue with --resume")


def test_a_lost_connection_is_retried_until_it_comes_back() -> None:
    attempts: list[int] = []
    pauses: list[float] = []
    undone: list[int] = []

    def write() -> str:
        attempts.append(1)
        if len(attempts) < 4:
            raise _wrapped("server closed the connection unexpectedly")
        return "written"

    assert guarded(write, URL, patience=30, sleep=pauses.append,
                   before_retry=lambda: undone.append(1)) == "written"
    assert pauses == [0.5, 1.0, 2.0] and len(undone) == 3  # backoff; half-done work undone


def test_a_lost_connection_past_the_patience_stops_with_how_long(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 2))
    monkeypatch.setattr("studies.faults.time.monotonic", lambda: float(next(clock)))

    def write() -> None:
        raise _wrapped(f"connection to server at db failed: password {'s3cret'} rejected")

    with pytest.raises(StorageFaultError) as err:
        guarded(write, URL, patience=10, sleep=lambda s: None)
    line = str(err.value)
    assert "the connection to it was lost for 10 s" in line and "s3cret" not in line, line


def test_the_real_sqlite_error_of_a_read_only_file(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)")
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as raised:
        readonly.execute("INSERT INTO t VALUES (1)")
    assert classify(raised.value).cause.startswith("it cannot be written")
    assert "make it writable" in str(describe(raised.value, f"sqlite:///{path}"))
