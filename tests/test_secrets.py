"""No secret of a storage URL is ever printed or written: a password in the URL's user
(``user:pw@``), in its query (``?password=``, which libpq and psycopg accept) or behind a
password file (``?passfile=``). Each is planted, ``python -m studies`` and a real smoke search run
on PostgreSQL, and every line they print and every file under the run's folders (Ray's results,
``tuner.pkl``, its temp dir) is searched for the secret, as bytes. The commands a search prints
(``studies export``, ``studies errors``) show ``***`` and work as printed."""

from __future__ import annotations

import os
import shlex
import uuid
from pathlib import Path
from urllib.parse import quote, quote_plus

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from arch import ArchConfig, HeadGroup, LayerSpec
from studies import StorageError, add_record, open_storage, set_study_attrs
from studies.cli import main as studies_main
from studies.urls import SECRET_HINT, has_secret, redact, scrub, secure_url, unmask
from tests.helpers.search import SMOKE, ray_tmp, run
from tests.helpers.storage import postgres_url
from tests.helpers.trial_hooks import hooked_env

optuna.logging.set_verbosity(optuna.logging.WARNING)
SECRET_ENV = ("PGPASSWORD", "PGPASSFILE")


@pytest.fixture(autouse=True)
def no_password_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither libpq's variables nor a ``~/.pgpass`` of the machine: only what a test plants."""
    for name in SECRET_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# --- the functions -------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://alice:s3cr%40t@db:5432/s", "postgresql://alice:***@db:5432/s"),
    ("postgresql://alice@db/s?password=s3cr%2Bt", "postgresql://alice@db/s?password=***"),
    ("postgresql://alice@db/s?passfile=/home/a/.pw&sslmode=require",
     "postgresql://alice@db/s?passfile=***&sslmode=require"),
    ("postgresql://alice@db/s?sslpassword=k3y", "postgresql://alice@db/s?sslpassword=***"),
    ("postgresql://alice:a@db/s?password=b&password=c", "postgresql://alice:***@db/s?password=***"),
    ("sqlite:///studies.db", "sqlite:///studies.db"),
    ("postgresql://alice:pw@db:port/s", "<unparseable storage URL>"),
])
def test_redact_hides_every_form_of_secret(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert has_secret(url) == ("***" in shown)
    assert redact(shown) == shown  # printing a printed URL changes nothing


def test_scrub_removes_each_secret_as_written_and_as_quoted() -> None:
    url = "postgresql://alice:u%40ser@db/s?password=q+ry&passfile=/p/w"
    error = "failed for u@ser (u%40ser) with q ry, q%20ry, q+ry, file /p/w and %2Fp%2Fw"
    assert scrub(error, url) == "failed for *** (***) with ***, ***, ***, file *** and ***"
    assert scrub(error, "not a url") == error


def test_secure_url_moves_password_and_password_file_to_libpq_environment() -> None:
    url = "postgresql://alice:old@db/s?password=new&passfile=/p/w&sslmode=require"
    secured = secure_url(url)
    assert secured == "postgresql://alice@db/s?sslmode=require"
    assert (os.environ["PGPASSWORD"], os.environ["PGPASSFILE"]) == ("new", "/p/w")
    # Printed, it still says it has secrets (the export command then gives the hint), and a
    # driver's error is scrubbed of the secrets it moved.
    assert redact(secured) == redact(url) and has_secret(secured)
    assert scrub("new old /p/w", secured) == "*** *** ***"


def test_a_printed_password_is_read_from_pgpassword_or_the_password_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    printed = "postgresql://alice:***@db/s?passfile=***&sslmode=require"
    with pytest.raises(StorageError) as err:
        unmask(printed)
    assert str(err.value) == ("storage postgresql://alice:***@db/s?passfile=***&sslmode=require: "
                              "its password *** was hidden when printed; set $PGPASSWORD or use "
                              "~/.pgpass")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".pgpass").write_text("*:*:*:alice:pw\n")
    assert unmask(printed) == "postgresql://alice@db/s?sslmode=require"  # libpq reads the file
    monkeypatch.setenv("PGPASSWORD", "from-env")
    assert unmask(printed) == "postgresql://alice:from-env@db/s?sslmode=require"
    assert unmask("postgresql://alice@db/s?password=***") == "postgresql://alice:from-env@db/s"
    assert unmask("postgresql://alice:real@db/s") == "postgresql://alice:real@db/s"


# --- python -m studies ---------------------------------------------------------------------

def planted(form: str, secret: str, tmp_path: Path) -> str:
    """The test database's URL with ``secret`` in it as ``form`` says (trust authentication
    accepts any password; a password file is a real one)."""
    url = make_url(postgres_url())
    if form == "userinfo":
        return url.set(password=secret).render_as_string(hide_password=False)
    if form == "query":
        return url.update_query_dict({"password": secret}).render_as_string(hide_password=False)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{secret}\n")
    passfile.chmod(0o600)
    return url.update_query_dict({"passfile": str(passfile)}).render_as_string(
        hide_password=False)


def secrets_of(url: str, secret: str) -> list[str]:
    """What must appear nowhere: the secret as written and as quoted, and a password file's
    path."""
    query = make_url(url).query
    return [form for value in (secret, *([str(query["passfile"])] if "passfile" in query else []))
            for form in (value, quote(value, safe=""), quote_plus(value))]


def assert_nowhere(secrets: list[str], text: str) -> None:
    for secret in secrets:
        assert secret not in text, [line for line in text.splitlines() if secret in line]


def make_study(url: str, name: str) -> None:
    """A study with one complete trial and one failed with an error."""
    study = optuna.create_study(storage=open_storage(url), study_name=name)
    set_study_attrs(study, task="ngram", metric="mse")
    arch = ArchConfig(d_model=32, layers=(LayerSpec("mhsa", (HeadGroup(2, 16),)),),
                      max_seq_len=8, vocab_size=16)
    add_record(study, arch, 0.5, steps_reached=40)
    failed = study.ask()
    failed.set_user_attr("status", "failed")
    failed.set_user_attr("error", "RuntimeError: boom")
    study.tell(failed, state=TrialState.FAIL)


@pytest.mark.parametrize("form", ["userinfo", "query", "passfile"])
def test_studies_never_prints_a_secret(form: str, tmp_path: Path, study_name: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    secret = f"Pw+{uuid.uuid4().hex[:8]}@:/?&="
    url = planted(form, secret, tmp_path)
    make_study(url, study_name)
    wrong_port = url.replace(":5432/", ":1/")
    runs = [(["list"], 0), (["best", "--study", study_name], 0),
            (["top", "-k", "2", "--study", study_name], 0),
            (["errors", "--study", study_name], 0),
            (["top", "--study", study_name, "--format", "json"], 0),
            (["best", "--study", "no-such-study"], 2), (["list"], 2)]
    for n, (argv, code) in enumerate(runs):
        storage = wrong_port if n == len(runs) - 1 else url
        assert studies_main([argv[0], "--storage", storage, *argv[1:]]) == code, argv
    out, err = capsys.readouterr()
    assert_nowhere(secrets_of(url, secret), out + err)
    assert "cannot open storage postgresql://postgres" in err and "***" in err
    assert f"# {SECRET_HINT}" in out  # the export line of `best` and `top` says how
    # A placeholder given back is read from $PGPASSWORD (trust accepts it) ...
    export = shlex.split(next(line for line in out.splitlines() if "studies export" in line)
                         .removeprefix("export: "), comments=True)
    os.environ["PGPASSWORD"] = secret
    try:
        assert studies_main(export[3:]) == 0
    finally:
        del os.environ["PGPASSWORD"]
    # ... and refused in one line when neither it nor a password file is there.
    if form != "passfile":
        assert studies_main(export[3:]) == 2
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and "set $PGPASSWORD or use ~/.pgpass" in err


# --- a real search -------------------------------------------------------------------------

def files_holding(secrets: list[str], folders: list[Path], skip: Path) -> list[str]:
    """Every file under ``folders`` (any kind: logs, JSON, pickles) whose bytes hold a secret."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink() and path != skip:
                data = path.read_bytes()
                found += [f"{path}: {s!r}" for s in secrets if s.encode() in data]
    return found


@pytest.mark.parametrize("form", ["userinfo+query", "passfile"])
def test_a_search_leaves_no_secret_anywhere(form: str, tmp_path: Path, study_name: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """userinfo+query: a search that completes (its export line); passfile: one whose every
    trial fails (its line pointing at the errors)."""
    secret = f"Pw{uuid.uuid4().hex[:10]}"
    if form == "passfile":
        url = planted("passfile", secret, tmp_path)
        faults = [{"kind": "raise", "match": ""}]  # every trial fails
    else:  # two secrets: the query's (which the driver would use) and the user's
        url = planted("query", secret, tmp_path).replace("postgres@", f"postgres:{secret}u@")
        faults = []
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    proc = run(tmp_path, *SMOKE, "--trials", "2", "--scheduler", "fifo", "--max-concurrent",
               "1", "--storage", url, "--study", study_name, env=hooked_env(env, faults=faults))
    secrets = secrets_of(url, secret) + ([secret + "u"] if faults == [] else [])
    assert_nowhere(secrets, proc.stdout + proc.stderr)
    assert not files_holding(secrets, [tmp_path, ray_tmp(tmp_path)], tmp_path / "pgpass")
    assert (tmp_path / "results").is_dir() and list((tmp_path / "results").rglob("tuner.pkl"))
    if faults:  # all trials failed: the line points at a command that lists their errors
        assert proc.returncode == 1, proc.stderr[-3000:]
        line = next(x for x in proc.stderr.splitlines() if "trials failed" in x)
        assert f"; {SECRET_HINT})" in line and "passfile=***" in line
        command = line.split("their errors: ")[1].split(";")[0]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "postgres:***@" in proc.stdout and "password=***" in proc.stdout
        line = next(x for x in proc.stdout.splitlines() if x.startswith("export: "))
        assert line.endswith(f"# {SECRET_HINT}")
        command = line.removeprefix("export: ").replace("--out best.yaml", "")
    os.environ["PGPASSWORD"] = secret  # as the hint says (trust accepts any)
    try:
        assert studies_main(shlex.split(command, comments=True)[3:]) == 0
    finally:
        del os.environ["PGPASSWORD"]
    out = capsys.readouterr().out
    if faults:
        assert "2 failed trial(s)" in out and out.count("injected failure") == 2
    else:
        assert "layers:" in out  # the architecture's YAML
