"""studies: storage, records, queries and the CLI, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
import warnings
from io import BytesIO
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from arch import ArchConfig, HeadGroup, LayerSpec, codec
from studies import (
    StorageError,
    StorageSettings,
    add_record,
    open_storage,
    query as q,
    read_arch,
    records as rec,
    redact,
    resolve_url,
    set_study_attrs,
)
from studies.cli import main
from studies.storage import engine_kwargs
from studies.trials import Direction, TrialRecord, TrialStatus
from studies.urls import secure_url

ROOT = Path(__file__).resolve().parents[1]
FROZEN = ROOT / "tests" / "data" / "study_v1.db"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def arch_with(heads: int, kind: str = "mhsa", layers: int = 2) -> ArchConfig:
    layer = LayerSpec(kind, (HeadGroup(heads, 64 // heads),))
    return ArchConfig(d_model=64, layers=(layer,) * layers, max_seq_len=16, input_dim=8)


def test_record_round_trip(storage_url: str, study_name: str) -> None:
    study = optuna.create_study(storage=open_storage(storage_url), study_name=study_name)
    set_study_attrs(study, task="ngram", metric="mse", space_name="s", alloc_inputs={"D": 64})
    written = {}
    for number, heads in enumerate((1, 4, 16)):  # one writer: trial numbers are 0, 1, 2
        arch = arch_with(heads, "mixit" if heads == 4 else "mhsa")
        add_record(study, arch, 1.0 / heads, predicted_error=2.0, steps_reached=10,
                   curve={5: 2.0, 10: 1.0})
        written[number] = arch
    loaded = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
    for trial in loaded.trials:
        arch = written[trial.number]
        assert read_arch(trial) == arch and codec.decode(trial.params, arch) == arch
        assert trial.user_attrs["arch_id"] == arch.arch_id
        assert trial.intermediate_values == {5: 2.0, 10: 1.0}
    assert loaded.user_attrs["task"] == "ngram" and "code_version" in loaded.user_attrs
    assert json.loads(loaded.user_attrs["alloc_inputs"]) == {"D": 64}
    assert loaded.user_attrs["record_schema"] == 2
    assert loaded.metric_names == ["mse"]  # what optuna-dashboard and `optuna` show


def test_a_told_record_reads_back_as_written(storage_url: str, study_name: str) -> None:
    """What the search writes when it tells a trial (``TrialRecord.told_attrs``) reads back
    field for field, through the database and the queries; the status is stored as its word."""
    study = optuna.create_study(storage=open_storage(storage_url), study_name=study_name)
    told = TrialRecord(None, 0, "FAIL", None, status=TrialStatus.RAY_FAILED, steps_reached=20,
                       tokens_per_s=900.0, val_loss=1.5, val_loss_se=0.02, node="n1",
                       resumed_from=10, restarts=1, error="its worker died; retried")
    trial = study.ask()
    for key, value in told.told_attrs().items():
        trial.set_user_attr(key, value)
    study.tell(trial, state=TrialState.FAIL)
    storage = open_storage(storage_url)
    (stored,) = optuna.load_study(study_name=study_name, storage=storage).trials
    with storage.engine.connect() as conn:  # the bytes Optuna stored: the word, as before
        raw = conn.execute(sa.text("SELECT value_json FROM trial_user_attributes WHERE key = "
                                   ":key AND trial_id = :trial"),
                           {"key": rec.STATUS, "trial": stored._trial_id}).scalar()
    assert raw == '"ray_failed"'
    assert TrialRecord.from_attrs(None, 0, "FAIL", None, stored.user_attrs) == told
    (failed,) = q.failed_trials(storage.engine, study_name)
    assert (failed.number, failed.status, failed.steps_reached, failed.error) == (
        0, TrialStatus.RAY_FAILED, 20, told.error)


def test_trial_status_words_are_the_stored_ones() -> None:
    """The words old databases hold: a status reads back as its member, and a word this code
    does not know stays as it was written."""
    assert [s.value for s in TrialStatus] == [
        "running", "completed", "stopped", "failed", "duplicate", "orphan", "ray_failed",
        "disk_full", "interrupted", "terminated"]
    assert TrialStatus.read("stopped") is TrialStatus.STOPPED
    assert TrialStatus.read("w0") == "w0" and TrialStatus.read(None) is None


@pytest.mark.parametrize("higher", [True, False])
def test_direction_speaks_optuna_and_ray_at_the_edges(higher: bool) -> None:
    direction = Direction.of(higher)
    study = optuna.create_study(direction=direction.value)
    assert Direction.from_storage(study.direction.name) is direction
    assert direction.mode == ("max" if higher else "min")
    assert direction.better(2.0, 1.0) is higher and not direction.better(1.0, 1.0)
    assert direction.better(0.0, direction.worst) and not direction.better(direction.worst, 0.0)


def fill(storage_url: str, name: str, direction: str = "minimize") -> optuna.Study:
    """Six trials: the best value belongs to an early-stopped trial recorded as COMPLETE."""
    study = optuna.create_study(storage=open_storage(storage_url), study_name=name,
                                direction=direction)
    set_study_attrs(study, task="ngram", metric="mse")
    rows = [(1, 0.5, 100, TrialState.COMPLETE), (2, 0.3, 100, TrialState.COMPLETE),
            (4, 0.2, 100, TrialState.COMPLETE), (8, 0.01, 30, TrialState.COMPLETE),
            (16, 0.05, 30, TrialState.PRUNED), (32, None, 5, TrialState.FAIL)]
    for n, (heads, value, steps, state) in enumerate(rows):
        add_record(study, arch_with(heads, layers=1 + n % 2), value, state=state,
                   predicted_error=float(10 - n), steps_reached=steps)
    return study


def test_best_never_reports_an_early_stopped_trial(storage_url: str, study_name: str) -> None:
    fill(storage_url, study_name)
    eng = open_storage(storage_url).engine
    _, winners = q.top(eng, study_name, 10)
    assert [t.number for t in winners] == [2, 1, 0]  # trial 3 (0.01 after 30 steps) excluded
    assert winners[0].arch == arch_with(4, layers=1)


def test_maximize_direction(storage_url: str, study_name: str) -> None:
    fill(storage_url, study_name, "maximize")
    _, winners = q.top(open_storage(storage_url).engine, study_name, 1)
    assert winners[0].number == 0


def test_pareto_equals_brute_force(storage_url: str, study_name: str) -> None:
    study = optuna.create_study(storage=open_storage(storage_url), study_name=study_name)
    values = [0.9, 0.5, 0.7, 0.2, 0.6, 0.1, 0.3, 0.25]
    for n, value in enumerate(values):
        add_record(study, arch_with([1, 2, 4, 8][n % 4], layers=1 + n // 4), value,
                   steps_reached=10)
    eng = open_storage(storage_url).engine
    _, trials = q.load_trials(eng, study_name)
    expected = {t.number for t in trials if not any(
        (o.value <= t.value and o.params_trainable <= t.params_trainable  # type: ignore[operator]
         and (o.value, o.params_trainable) != (t.value, t.params_trainable)) for o in trials)}
    _, front = q.pareto(eng, study_name)
    assert {t.number for t in front} == expected


def test_theory_rank_correlation(storage_url: str, study_name: str) -> None:
    from scipy.stats import spearmanr

    fill(storage_url, study_name)
    result = q.theory(open_storage(storage_url).engine, study_name)
    points = [(p["predicted_error"], p["value"]) for p in result["trials"]]
    assert result["n"] == 3 == len(points)
    assert result["spearman"] == pytest.approx(spearmanr(*zip(*points)).statistic)


def test_theory_with_one_predicted_error_says_so_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="same")
    set_study_attrs(study, task="ngram", metric="mse")
    for value in (0.3, 0.2):
        add_record(study, arch_with(4), value, predicted_error=1.5, steps_reached=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no raw SciPy warning
        assert main(["theory", "--storage", url]) == 0
    out, err = capsys.readouterr()
    assert "every predicted error is 1.5: the rank correlation is undefined" in out
    assert not err


def test_layer_summary_counts_winners() -> None:
    trials = [q.TrialRecord(i, i, "COMPLETE", 0.1, arch=arch_with(h, k))
              for i, (h, k) in enumerate([(4, "mhsa"), (4, "mixit"), (4, "mhsa"), (8, "mhsa")])]
    rows = q.layer_summary(trials)
    assert rows[0]["attention"] == "mhsa" and rows[0]["attention_share"] == 0.75
    assert rows[1]["n_heads"] == 4 and rows[1]["qk_dim"] == 16


def test_storage_url_resolution_and_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    assert resolve_url() == "sqlite:///studies.db"
    monkeypatch.setenv("OPTUNA_STORAGE", "postgresql://a:b@h/db")
    assert resolve_url() == "postgresql://a:b@h/db" and resolve_url("sqlite:///x") == "sqlite:///x"
    assert redact("postgresql://user:hunter2@db.example:5432/s") == \
        "postgresql://user:***@db.example:5432/s"


@pytest.mark.parametrize(("url", "message"), [
    ("mysql://u@h/db", "scheme 'mysql' is not supported"),
    ("sqlite:////nonexistent/dir/s.db", "directory '/nonexistent/dir' does not exist"),
    ("postgresql://alice:s3cretpw@127.0.0.1:1/db", "cannot open storage "
     "postgresql://alice:***@127.0.0.1:1/db"),
    ("not a url", "not an SQLAlchemy URL"),
])
def test_storage_errors_are_one_line_without_password(url: str, message: str) -> None:
    with pytest.raises(StorageError) as err:
        open_storage(url)
    text = str(err.value)
    assert message in text and "s3cretpw" not in text and "\n" not in text


def test_secure_url_moves_the_password_to_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    url = secure_url("postgresql://alice:s3cr%40t@db:5432/studies")
    assert url == "postgresql://alice@db:5432/studies" and os.environ["PGPASSWORD"] == "s3cr@t"
    assert secure_url("sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.delenv("PGPASSWORD")
    pure_python = "postgresql+pg8000://alice:pw@db/studies"  # no libpq: it needs the URL's
    assert secure_url(pure_python) == pure_python and "PGPASSWORD" not in os.environ


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    open_storage(f"sqlite:///{tmp_path / 's.db'}")
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_frozen_study_keeps_opening(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "study_v1.db"
    shutil.copy(FROZEN, db)  # never touch the committed file
    url = f"sqlite:///{db}"
    (summary,) = q.list_studies(open_storage(url).engine)
    assert summary.name == "frozen" and summary.counts == {"COMPLETE": 4, "PRUNED": 1,
                                                           "FAIL": 1}
    assert summary.attrs["task"] == "ngram"
    _, (best,) = q.top(open_storage(url).engine, "frozen", 1)
    assert (best.number, best.value, best.steps_reached) == (2, 0.2, 100)
    assert best.arch is not None and best.arch.layers[0].heads == (HeadGroup(4, 16),)
    assert main(["export", "--storage", url, "--study", "frozen"]) == 0
    out, err = capsys.readouterr()
    assert ArchConfig.from_yaml(out) == best.arch
    # Written before trial records described the trained model: one warning line.
    assert err.count("\n") == 1 and "parameter counts" in err and "unreliable" in err


def test_cli_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    fill(url, "demo")
    for argv in (["list"], ["best"], ["top", "-k", "2"], ["layers"], ["theory"],
                 ["pareto", "--plot", str(tmp_path / "front.png")]):
        assert main([*argv, "--storage", url]) == 0, argv
    out, err = capsys.readouterr()
    assert "trial 2: mse 0.2" in out  # the study's metric by its name, as in the search's lines
    assert f"export: python -m studies export --storage {url} --study demo --trial 2" in out
    assert "warning" not in err  # a study of this version
    assert "Spearman" in out and (tmp_path / "front.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["best", "--storage", url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["number"] == 2
    out_file = tmp_path / "arch.yaml"
    assert main(["export", "--storage", url, "--trial", "3", "--out", str(out_file)]) == 0
    assert ArchConfig.from_yaml(out_file.read_text()) == arch_with(8, layers=2)
    assert f"studies: wrote {out_file}" in capsys.readouterr().err
    # An architecture file is not overwritten without --force.
    assert main(["export", "--storage", url, "--trial", "2", "--out", str(out_file)]) == 2
    assert "exists; pass --force to overwrite it" in capsys.readouterr().err
    assert ArchConfig.from_yaml(out_file.read_text()) == arch_with(8, layers=2)
    assert main(["export", "--storage", url, "--trial", "2", "--out", str(out_file),
                 "--force"]) == 0


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    fill(url, "one")
    fill(url, "two")
    cases = [(["best", "--study", "three"], "no such study; studies: one, two"),
             (["best"], "--study: required when the storage holds 2 studies"),
             (["export", "--study", "one", "--trial", "99"], "--trial 99: study 'one' has no"),
             (["export", "--study", "one", "--out", str(tmp_path / "no" / "a.yaml")],
              "does not exist")]
    for argv, message in cases:
        assert main([*argv, "--storage", url]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(["list", "--storage", "postgresql://bob:topsecret@127.0.0.1:1/x"]) == 2
    err = capsys.readouterr().err
    assert "topsecret" not in err and "bob:***@" in err


def test_stock_optuna_cli_and_dashboard_read_our_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = fill(url, "demo")
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    optuna_cli = shutil.which("optuna") or str(Path(sys.executable).parent / "optuna")
    studies = subprocess.run([optuna_cli, "studies", "--storage", url,
                              "-f", "json"], capture_output=True, text=True, env=env, timeout=120)
    assert studies.returncode == 0, studies.stderr
    assert json.loads(studies.stdout)[0]["name"] == "demo"
    best = subprocess.run([optuna_cli, "best-trial", "--study-name", "demo",
                           "--storage", url, "-f", "json"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["number"] == study.best_trial.number

    from optuna_dashboard import wsgi

    app = wsgi(url)
    study_id = open_storage(url).get_study_id_from_name(study.study_name)
    bodies = []
    for path in ("/api/studies", f"/api/studies/{study_id}"):
        environ: dict[str, object] = {"PATH_INFO": path, "QUERY_STRING": "after=0"}
        setup_testing_defaults(environ)
        status: list[str] = []

        def start_response(code: str, headers: object, *_: object,
                           seen: list[str] = status) -> object:
            seen.append(code)
            return lambda data: None

        body = b"".join(app(environ, start_response))
        assert status[0].startswith("200"), (path, status, body[:200])
        bodies.append(json.load(BytesIO(body)))
    # The dashboard names the objective after the task's metric, not "Objective 0".
    assert bodies[1]["objective_names"] == ["mse"]


def test_heartbeat_settings_reach_optuna(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}",
                           StorageSettings(heartbeat_interval=5, grace_period=11, retries=2))
    assert storage.get_heartbeat_interval() == 5 and storage.grace_period == 11
    assert storage.get_heartbeat_stale_trial_callback() is not None


def test_postgres_pool_settings_reach_the_engine() -> None:
    from tests.helpers.storage import postgres_url

    settings = StorageSettings(pool_size=3, max_overflow=1)
    kwargs = engine_kwargs(postgres_url(), settings)
    assert (kwargs["pool_size"], kwargs["max_overflow"], kwargs["pool_pre_ping"]) == (3, 1, True)
    assert open_storage(postgres_url(), settings).engine.pool.size() == 3  # what Optuna built


def test_reading_commands_never_create_a_database(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped file is one line, exit 2, and no file appears; ``immutable=1`` (read-only
    media) opens a study without writing a byte."""
    from alloc.calibrate import main as calibrate_main

    missing = f"sqlite:///{tmp_path / 'mistyped.db'}"
    for command, argv in ((main, ["list"]), (main, ["best", "--study", "x"]),
                          (calibrate_main, ["--study", "x"])):
        assert command([*argv, "--storage", missing]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "never creates a database" in err, err
    assert list(tmp_path.iterdir()) == []
    db = tmp_path / "study_v1.db"
    shutil.copy(FROZEN, db)
    before = db.read_bytes()
    assert main(["best", "--storage", f"sqlite:///file:{db}?immutable=1&uri=true"]) == 0
    assert "trial 2: mse 0.2" in capsys.readouterr().out
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [db.name]


def test_reading_a_missing_postgres_database_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """PostgreSQL never creates a database on connect: a mistyped name is one line, exit 2,
    and the password stays out of it."""
    import sqlalchemy

    from tests.helpers.storage import postgres_url

    url = sqlalchemy.make_url(postgres_url())
    missing = url.set(database=f"nope_{uuid.uuid4().hex[:8]}", password="s3cret")
    assert main(["list", "--storage", missing.render_as_string(hide_password=False)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "s3cret" not in err and missing.database in err


def test_an_older_schema_is_refused_in_one_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Optuna's schema check, run one connection at a time: tables of an older Optuna are
    refused in one line naming the upgrade, and nothing is written."""
    db = tmp_path / "s.db"
    open_storage(f"sqlite:///{db}")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v3.0.0.a'")
    before = db.read_bytes()
    assert main(["list", "--storage", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no longer compatible" in err, err
    assert "optuna storage upgrade" in err and db.read_bytes() == before


def test_seeds_pairs_each_architecture_with_the_reference_seed_by_seed(
        storage_url: str, study_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``studies seeds``: trials told apart only by ``train.seed`` are one point; each point's
    difference from the reference is the mean of its per-seed differences with their Student
    interval (``common.stats``, brute force here), and its verdict follows the paired test."""
    from common.stats import interval

    study = optuna.create_study(storage=open_storage(storage_url), study_name=study_name)
    base = [1.00, 1.10, 0.95, 1.05]  # the reference's loss at seeds 0-3
    offsets = {2: [0.05, 0.06, 0.04, 0.05],  # worse at every seed
               4: [0.01, -0.02, 0.02, -0.01],  # level
               8: [-0.05, -0.04, -0.06, -0.05]}  # better
    for seed, loss in enumerate(base):
        add_record(study, arch_with(1), loss, steps_reached=10,
                   extra_params={"train.seed": seed})
        for heads, shift in offsets.items():
            add_record(study, arch_with(heads), loss + shift[seed], steps_reached=10,
                       extra_params={"train.seed": seed})
    eng = open_storage(storage_url).engine
    compared = q.compare_seeds(eng, study_name, against=0)  # trial 0: one head, seed 0
    by_heads = {c.point.first.arch.layers[0].heads[0].count: c for c in compared
                if c.point.first.arch is not None}
    assert by_heads[1].verdict == "reference" and by_heads[1].against is None
    assert {h: by_heads[h].verdict for h in offsets} == {2: "worse", 4: "level", 8: "better"}
    for heads, shift in offsets.items():
        got, want = by_heads[heads].against, interval(shift)
        assert got is not None and by_heads[heads].seeds == (0, 1, 2, 3)
        assert (got.difference.mean, got.difference.low, got.difference.high) == \
            pytest.approx((want.mean, want.low, want.high))
    # the default reference is the best mean: eight heads, which every other point is worse than
    best = {c.point.first.arch.layers[0].heads[0].count: c.verdict
            for c in q.compare_seeds(eng, study_name) if c.point.first.arch is not None}
    assert best == {1: "worse", 2: "worse", 4: "worse", 8: "reference"}
    assert main(["seeds", "--storage", storage_url, "--study", study_name, "--against", "0",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in rows] == ["reference", "worse", "level", "better"]
    assert main(["seeds", "--storage", storage_url, "--study", study_name,
                 "--against", "99"]) == 2
    assert "--against 99: is not a fully trained trial" in capsys.readouterr().err
    # An arm trained later in a study of its own joins the points with --with, paired by seed
    # with the first study's reference; a study of another task is refused in one line.
    later = optuna.create_study(storage=open_storage(storage_url),
                                study_name=f"{study_name}-later")
    for seed, loss in enumerate(base[:3]):
        add_record(later, arch_with(16), loss + 0.1, steps_reached=10,
                   extra_params={"train.seed": seed})
    assert main(["seeds", "--storage", storage_url, "--study", study_name, "--against", "0",
                 "--with", f"{study_name}-later", "--format", "json"]) == 0
    added = next(r for r in json.loads(capsys.readouterr().out)
                 if r["trials"][0] == f"{study_name}-later#0")
    assert added["trials"] == [f"{study_name}-later#{n}" for n in range(3)]
    assert added["verdict"] == "worse" and added["against"]["seeds"] == [0, 1, 2]
    assert added["against"]["difference"] == pytest.approx(0.1)
    other = optuna.create_study(storage=open_storage(storage_url),
                                study_name=f"{study_name}-other")
    other.set_user_attr("task", "modadd")
    add_record(other, arch_with(16), 1.0, steps_reached=10, extra_params={"train.seed": 0})
    assert main(["seeds", "--storage", storage_url, "--study", study_name,
                 "--with", f"{study_name}-other"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the bare test study's warning
    assert err.startswith("python -m studies: error: --with") and "its task 'modadd'" in err
