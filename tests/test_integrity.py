"""A damaged SQLite study file is refused in one line naming the way out, wherever the damage
falls (a page every query reads, or one only some queries touch), and a sound file passes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest

from studies.errors import CorruptStudyError
from studies.integrity import check_sqlite_file


def study_file(path: Path, trials: int = 60) -> Path:
    """A study with trials, params, user attrs and intermediate values."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{path}")
    for i in range(trials):
        trial = study.ask()
        trial.suggest_int("L0.g0.count", 1, 64)
        trial.set_user_attr("arch", "x" * 200)
        for step in range(5):
            trial.report(float(step), step)
        study.tell(trial, float(i))
    return path


def test_a_sound_file_passes(tmp_path: Path) -> None:
    check_sqlite_file(study_file(tmp_path / "s.db"))
    check_sqlite_file(tmp_path / "new.db")  # not created yet: a new database


def test_damage_anywhere_is_refused_in_one_line(tmp_path: Path) -> None:
    sound = study_file(tmp_path / "s.db").read_bytes()
    page = sqlite3.connect(tmp_path / "s.db").execute("PRAGMA page_size").fetchone()[0]
    pages = len(sound) // page
    assert pages > 8
    refused = 0
    for number in range(1, pages):  # every page but the header's, one at a time
        damaged = tmp_path / f"d{number}.db"
        data = bytearray(sound)
        data[number * page:(number + 1) * page] = b"\x5a" * page
        damaged.write_bytes(bytes(data))
        if _sqlite_says_ok(damaged):
            continue  # a free page: nothing lost
        with pytest.raises(CorruptStudyError) as err:
            check_sqlite_file(damaged)
        message = str(err.value)
        assert "\n" not in message and "is damaged" in message
        assert f"sqlite3 {str(damaged)!r} \".recover\"" in message
        assert damaged.read_bytes() == bytes(data)  # nothing written
        refused += 1
    assert refused >= pages // 2  # most pages hold the study's rows


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all " * 500)
    with pytest.raises(CorruptStudyError, match="file is not a database"):
        check_sqlite_file(junk)


def _sqlite_says_ok(path: Path) -> bool:
    """SQLite's full integrity check, the reference."""
    try:
        return sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    except sqlite3.DatabaseError:
        return False


def _damage_a_page_only_some_queries_read(path: Path) -> bytes:
    """Overwrite the first page SQLite's integrity check flags but the studies table's rows
    survive (the params, attrs or heartbeats: where commands used to answer normally)."""
    sound = path.read_bytes()
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    for number in range(len(sound) // page - 1, 1, -1):  # the later pages: trial details
        data = bytearray(sound)
        data[number * page:(number + 1) * page] = b"\x5a" * page
        path.write_bytes(bytes(data))
        if not _sqlite_says_ok(path):
            return bytes(data)
    raise AssertionError("no page to damage")


def test_every_command_refuses_a_damaged_file_before_using_it(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    from studies.cli import main as studies_main
    from workers.search.cli import main as search_main

    path = study_file(tmp_path / "s.db")
    damaged = _damage_a_page_only_some_queries_read(path)
    url = f"sqlite:///{path}"
    for command in (lambda: studies_main(["list", "--storage", url]),
                    lambda: studies_main(["best", "--storage", url, "--study", "s"]),
                    lambda: search_main(["--space", "aot_vs_standard.yaml", "--task", "modadd",
                                         "--smoke-test", "--storage", url, "--study", "s",
                                         "--resume"])):
        assert command() == 2
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert not out and len(lines) == 1 and "is damaged" in lines[0], err
        assert f"sqlite3 {str(path)!r} \".recover\"" in lines[0]
        assert path.read_bytes() == damaged  # nothing written
