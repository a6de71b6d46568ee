"""A damaged SQLite study file is noticed before it is used.

SQLite reads a damaged page only when a query touches it: a file with a bad page among the
parameters or the heartbeats answers every other query normally. Every command that opens a
SQLite study file runs SQLite's ``PRAGMA quick_check`` on it once (every page's structure, not
the indexes' contents; tens of milliseconds for a 10,000-trial study, docs/benchmarks.md), read
only, and refuses a file that fails it in one line naming SQLite's own way out
(``sqlite3 FILE ".recover"``); nothing is written to it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from studies.errors import CorruptStudyError


def check_sqlite_file(path: Path, timeout: float = 60.0) -> None:
    """Raise ``CorruptStudyError`` unless the SQLite file ``path`` passes ``quick_check``
    (a missing or empty file passes: it is a new database)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    uri = f"file:{path.resolve().as_posix()}?mode=ro"
    try:
        with sqlite3.connect(uri, uri=True, timeout=timeout) as connection:
            rows = connection.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as err:  # "file is not a database", "malformed", ...
        raise _corrupt(path, str(err)) from None
    problems = [str(row[0]) for row in rows if row and row[0] != "ok"]
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise _corrupt(path, problems[0] + more)


def _corrupt(path: Path, what: str) -> CorruptStudyError:
    shown = what.splitlines()[0][:200]
    return CorruptStudyError(
        f"sqlite file {str(path)!r} is damaged ({shown}); nothing was read from it or "
        f"written to it: recover what it holds with sqlite3 {str(path)!r} \".recover\" > "
        "dump.sql, then load the dump into a new file (sqlite3 new.db < dump.sql) and use that")
