"""A storage that fails while a search runs ends it in one line and leaves the study that
``--resume`` completes, on the real thing: a full disk (SQLite on a small tmpfs), a read-only
open, PostgreSQL connections killed with ``pg_terminate_backend`` (ridden through) and a
PostgreSQL outage longer than ``--storage-patience`` (stopped, then resumed), and a role
without privileges on the study tables."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from studies.storage import open_storage
from tests.helpers.search import SMOKE, check_consistent, finish, launch, load, run, wait_for
from tests.helpers.storage import postgres_url
from workers.search.searcher import finished_count

# One database and one role of fixed names, one tmpfs mount each: the module's tests run one at a
# time, on one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("storage-faults")


def _one_error_line(stderr: str) -> str:
    """The search's error line; nothing of a traceback around it."""
    assert "Traceback" not in stderr and "StorageInternalError" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


def _finished(url: str, name: str, at_least: int) -> bool:
    try:
        return finished_count(load(url, name)) >= at_least
    except KeyError:
        return False


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs mounted for the test (root only: mount(2))."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path) -> Path:
    """Fill the filesystem of ``folder``; the file that filled it."""
    filler = folder / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(descriptor, b"\0" * (1 << 16)):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(descriptor)
    return filler


def test_a_full_disk_stops_the_search_in_one_line_and_resume_completes_it(
        tmp_path: Path, tmpfs: Path, ray_cluster: dict[str, str]) -> None:
    url = f"sqlite:///{tmpfs / 's.db'}"
    args = [*SMOKE, "--storage", url, "--study", "full", "--trials", "4", "--scheduler", "fifo",
            "--max-concurrent", "1"]
    proc = launch(tmp_path, *args, ray=ray_cluster)
    wait_for(lambda: _finished(url, "full", 1), 120)
    filler = _fill(tmpfs)  # the disk fills up as trials run
    _, err = finish(proc, 240)
    assert proc.returncode == 1, err[-3000:]
    line = _one_error_line(err)
    assert f"storage {url}: the disk holding it is full" in line, line
    assert "free space on that disk, then continue with --resume" in line, line
    filler.unlink()
    again = run(tmp_path, *args, "--resume", ray=ray_cluster)
    assert again.returncode == 0, again.stderr[-3000:]
    check_consistent(load(url, "full"), 4)


def test_a_full_results_disk_stops_the_search_and_resume_completes_it(
        tmp_path: Path, tmpfs: Path, ray_cluster: dict[str, str]) -> None:
    """Ray's results folder (--storage-path) fills up while trials run: the search says so in
    one line naming the folder and stops (exit 1) instead of failing trial after trial; the
    trials it failed are retried by --resume without counting against --trials."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    results = tmpfs / "results"
    args = [*SMOKE, "--storage", url, "--study", "disk", "--trials", "4", "--scheduler", "fifo",
            "--max-concurrent", "1", "--storage-path", str(results)]
    proc = launch(tmp_path, *args, ray=ray_cluster)
    wait_for(lambda: _finished(url, "disk", 1), 120)
    filler = _fill(tmpfs)
    _, err = finish(proc, 240)
    assert proc.returncode == 1, err[-3000:]
    line = _one_error_line(err)
    assert f"the Ray results folder '{results}" in line and "is on a full disk" in line, line
    assert "free space there, then continue with --resume" in line, line
    study = load(url, "disk")
    full = [t for t in study.get_trials(states=(TrialState.FAIL,))
            if t.user_attrs.get("status") == "disk_full"]
    assert len(full) == 1, [t.user_attrs for t in full]  # none started after it
    assert "Traceback" not in err, err[-3000:]
    done = finished_count(study)  # the trial that found the disk full is not one of them
    assert done < 4 and f"search: stopped, {done}/4 trials in " in err, err[-3000:]
    filler.unlink()  # and room for every trial's checkpoint (a few MB each)
    subprocess.run(["mount", "-o", "remount,size=256m", str(tmpfs)], check=True)
    again = run(tmp_path, *args, "--resume", ray=ray_cluster)
    assert again.returncode == 0, again.stderr[-3000:]
    study = load(url, "disk")
    check_consistent(study, 4)
    assert all(t.state == TrialState.COMPLETE for t in study.trials
               if t.user_attrs.get("status") not in ("disk_full", "interrupted"))


def test_a_read_only_storage_is_one_line_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    open_storage(f"sqlite:///{path}").engine.dispose()  # an existing, empty study database
    before = path.read_bytes()
    url = f"sqlite:///file:{path}?mode=ro&uri=true"  # opened read-only, as a read-only file is
    for extra in ([], ["--resume"]):
        done = run(tmp_path, *SMOKE, "--storage", url, "--study", "ro", "--trials", "2", *extra)
        assert done.returncode in (1, 2), done.stderr[-3000:]
        line = _one_error_line(done.stderr)
        assert "cannot be written" in line and "readonly database" in line, line
    assert path.read_bytes() == before


def _terminate(url: str, database: str) -> int:
    """Kill every connection to ``database`` but this one; how many were killed."""
    with sa.create_engine(url, isolation_level="AUTOCOMMIT").connect() as conn:
        return len(conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db "
            "AND pid <> pg_backend_pid()"), {"db": database}).all())


def test_killed_postgresql_connections_are_ridden_through(tmp_path: Path, fault_database: str,
                                                          ray_cluster: dict[str, str]) -> None:
    url = fault_database  # its own database: the kills disturb no other connection
    args = [*SMOKE, "--storage", url, "--study", "killed", "--trials", "4", "--scheduler",
            "fifo", "--max-concurrent", "1"]
    proc = launch(tmp_path, *args, ray=ray_cluster)
    wait_for(lambda: _finished(url, "killed", 1), 120)
    killed = 0
    while proc.poll() is None and killed < 6:  # several times while trials report
        killed += _terminate(url, str(make_url(url).database)) > 0
        time.sleep(1.0)
    _, err = finish(proc, 240)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert killed >= 1
    try:
        check_consistent(load(url, "killed"), 4)
    except AssertionError as failure:  # the driver's last words say which write was lost
        raise AssertionError(f"{failure}\n{err[-3000:]}") from None


@pytest.fixture
def fault_database() -> Iterator[str]:
    """A database of its own (an outage of it disturbs no other test's connections)."""
    url = make_url(postgres_url())
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    name = "transformer_alloc_fault_test"
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def test_a_postgresql_outage_past_the_patience_stops_cleanly(
        tmp_path: Path, fault_database: str, ray_cluster: dict[str, str]) -> None:
    url, name = fault_database, str(make_url(fault_database).database)
    admin = make_url(postgres_url()).render_as_string(hide_password=False)
    args = [*SMOKE, "--storage", url, "--study", "down", "--trials", "2", "--scheduler", "fifo",
            "--max-concurrent", "1", "--storage-patience", "3", "--steps", "400"]
    proc = launch(tmp_path, *args, ray=ray_cluster)
    wait_for(lambda: _finished(url, "down", 1), 120)
    with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(sa.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
    _terminate(admin, name)
    try:
        _, err = finish(proc, 240)
    finally:
        with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(sa.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
    assert proc.returncode == 1, err[-3000:]
    line = _one_error_line(err)
    assert "the connection to it was lost for" in line and "check that the database" in line
    # the outage may cut a trial off mid-run, or fall between two (the next not yet created)
    cut_off = [t.number for t in load(url, "down").get_trials(states=(TrialState.RUNNING,))]
    again = run(tmp_path, *args, "--resume", ray=ray_cluster)
    assert again.returncode == 0, again.stderr[-3000:]
    study = load(url, "down")  # the trial cut off by the outage was retried, nothing is left
    assert finished_count(study) == 2 and not study.get_trials(  # running or waiting
        states=(TrialState.RUNNING, TrialState.WAITING))
    if cut_off:  # ... marked interrupted and retried, by number
        reaped = [x for x in again.stderr.splitlines() if x.startswith("--resume: trials [")]
        assert reaped and all(str(n) in reaped[0] for n in cut_off), again.stderr[-3000:]


def test_a_role_without_privileges_is_one_line(study_name: str) -> None:
    url = make_url(postgres_url())
    open_storage(url.render_as_string(hide_password=False)).engine.dispose()  # tables exist
    with sa.create_engine(url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(sa.text("DROP ROLE IF EXISTS transformer_alloc_noperm"))
        conn.execute(sa.text("CREATE ROLE transformer_alloc_noperm LOGIN"))
    try:
        stranger = url.set(username="transformer_alloc_noperm", password=None)
        done = subprocess.run([sys.executable, "-m", "studies", "list", "--storage",
                               stranger.render_as_string(hide_password=False)],
                              capture_output=True, text=True, timeout=120)
    finally:
        with sa.create_engine(url, isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(sa.text("DROP ROLE IF EXISTS transformer_alloc_noperm"))
    assert done.returncode in (1, 2) and not done.stdout, done.stderr
    line = _one_error_line(done.stderr)
    assert "lacks privileges" in line and "permission denied" in line, line


def _allow_connections(admin: str, name: str, allow: bool) -> None:
    with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(sa.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {str(allow).lower()}"))
    if not allow:
        _terminate(admin, name)


def test_a_connection_lost_at_start_up_is_retried_then_a_fault(
        tmp_path: Path, fault_database: str, ray_cluster: dict[str, str]) -> None:
    """The database refuses the driver as it opens the study (its connections terminated,
    new ones not accepted, as in a restart): the driver says it once and retries within
    --storage-patience, and the search runs once the database is back; past the patience it is
    a fault (exit 1, one line), not bad input."""
    url, name = fault_database, str(make_url(fault_database).database)
    admin = make_url(postgres_url()).render_as_string(hide_password=False)
    _allow_connections(admin, name, False)
    try:
        done = run(tmp_path, *SMOKE, "--storage", url, "--study", "gone", "--trials", "1",
                   "--storage-patience", "2", ray=ray_cluster)
        assert done.returncode == 1, done.stderr[-3000:]
        line = _one_error_line(done.stderr)
        assert "not currently accepting connections" in line and "for 2 s" in line, line
        assert "retrying for up to 2 s" in done.stderr, done.stderr[-3000:]
        proc = launch(tmp_path, *SMOKE, "--storage", url, "--study", "back", "--trials", "1",
                      "--storage-patience", "120", ray=ray_cluster)
        assert proc.stderr is not None
        said = ""
        while "retrying for up to 120 s" not in said and proc.poll() is None:
            said = proc.stderr.readline()
    finally:
        _allow_connections(admin, name, True)
    _, err = finish(proc, 240)
    assert proc.returncode == 0, said + err[-3000:]
    check_consistent(load(url, "back"), 1)


@contextlib.contextmanager
def _limited_role(limit: int) -> Iterator[str]:
    """The test database's URL for a role of its own that may hold ``limit`` connections (and
    read the study tables), with a password the server does not ask for (trust) and no line
    may show; the role is dropped after."""
    url = make_url(postgres_url())
    open_storage(url.render_as_string(hide_password=False)).engine.dispose()  # tables exist
    role = "transformer_alloc_one"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")

    def drop(conn: sa.Connection) -> None:
        if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))

    with admin.connect() as conn:
        drop(conn)
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}"))
        conn.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    try:
        yield url.set(username=role, password=SECRET).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            drop(conn)
        admin.dispose()


SECRET = "s3cret-w0rd"


def test_a_query_waits_for_a_free_connection_and_holds_one(tmp_path: Path) -> None:
    """A server without a free connection for a query (a role limited to one, taken: a
    hundred queries at once on a server of 100 connections were refused) is waited out: the
    query holds the one connection it gets."""
    with _limited_role(1) as limited:
        holder = sa.create_engine(limited, poolclass=sa.pool.NullPool).connect()  # its one
        try:
            proc = subprocess.Popen([sys.executable, "-m", "studies", "list", "--storage",
                                     limited], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            time.sleep(4)
            assert proc.poll() is None  # waiting, not refused
            holder.close()
            _, err = proc.communicate(timeout=120)
        finally:
            holder.close()
    assert proc.returncode == 0, err
    assert "too many connections" in err and "retrying for up to 30 s" in err, err
    assert SECRET not in err


def test_a_query_past_its_patience_is_one_line(tmp_path: Path) -> None:
    """A server that never frees a connection for the query (a role allowed none): it is
    retried for ``--storage-patience`` seconds, then the query stops in one line, exit 1,
    having waited no longer than promised."""
    with _limited_role(0) as limited:
        done = subprocess.run([sys.executable, "-m", "studies", "best", "--study", "any",
                               "--storage", limited, "--storage-patience", "2"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and not done.stdout, done.stderr
    said, line = done.stderr.splitlines()  # said once, then the error
    assert "retrying for up to 2 s" in said and line == _one_error_line(done.stderr)
    assert "no free connection for 2 s" in line and "too many connections" in line, line
    assert SECRET not in done.stderr and "***" in line


def test_a_server_that_never_answers_is_not_waited_on_past_the_patience() -> None:
    """A server that takes the query's connection and never answers (one too busy to, or an
    address that swallows packets): the attempt is cut off when ``--storage-patience`` ends
    and the query stops in one line, exit 1 (it waited forever before)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)  # the kernel completes the handshake; nobody ever answers
        url = f"postgresql://bob:{SECRET}@127.0.0.1:{silent.getsockname()[1]}/db"
        done = subprocess.run([sys.executable, "-m", "studies", "list", "--storage", url,
                               "--storage-patience", "3"], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    line = _one_error_line(done.stderr)
    assert "(connection timeout expired)" in line and SECRET not in line, line
    # the patience, and the last try's start-up on a loaded machine (not the minutes before)
    waited = int(re.search(r"for (\d+) s", line).group(1))  # type: ignore[union-attr]
    assert 3 <= waited <= 10, line
