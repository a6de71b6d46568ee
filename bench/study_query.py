"""python -m bench.study_query [--smoke-test] [--postgres URL] [--format table|json|yaml]

Study database benchmark, every ratio measured in one run:

* write throughput: trials/s recorded through Optuna by 1, 4 and 8 writer processes at once,
  SQLite (WAL) and PostgreSQL;
* query time on studies of 1k and 10k trials: our ``best`` and ``pareto`` (SQL on Optuna's
  tables) against ``optuna.load_study(...).best_trial`` and the stock ``optuna best-trial``
  command (the last includes its interpreter start, as a user would see it);
* SQLite: the integrity check every command runs once on a study file
  (``studies.integrity``: ``PRAGMA quick_check``), next to our ``best``;
* concurrent queries: ``--queries N`` (default 100) ``python -m studies`` commands started at
  once (``list``, ``best``, ``pareto``, ``top``, ``errors`` in turn), each counting the
  database connections its process opens and holds at once (SQLAlchemy's pool events), with
  how many exit 0 and 1 and their wall times (``--queries-only`` runs just this).

PostgreSQL runs when ``--postgres`` or ``$TEST_POSTGRES_URL`` gives a URL.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa

from common.cli import Parser, add_format, dump, int_in, render_table
from studies import check_sqlite_file, open_storage, query as q

ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import random, sys, optuna
from arch import ArchConfig, HeadGroup, LayerSpec
from studies import add_record, open_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, name, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
study = optuna.load_study(study_name=name, storage=open_storage(url))
rng = random.Random(worker)
for i in range(n):
    layers = tuple(LayerSpec(rng.choice(["mhsa", "mixit"]), (HeadGroup(h, 256 // h),),
                             mlp_ratio=rng.choice([0, 4]))
                   for h in (rng.choice([1, 2, 4, 8, 16]), rng.choice([2, 4, 8])))
    arch = ArchConfig(d_model=256, layers=layers, max_seq_len=64, input_dim=64)
    add_record(study, arch, rng.random(), predicted_error=rng.random(), steps_reached=1000,
               status="completed", tokens_per_s=1e4)
"""


# ``python -m studies`` with the connections its process makes counted (SQLAlchemy's pool
# events: every connection made, and the most open at one moment), said on stderr at exit.
QUERY = """
import json, sys
import sqlalchemy
seen = {"connects": 0, "open": 0, "most": 0}
def connected(*_):
    seen["connects"] += 1
    seen["open"] += 1
    seen["most"] = max(seen["most"], seen["open"])
def closed(*_):
    seen["open"] -= 1
sqlalchemy.event.listen(sqlalchemy.pool.Pool, "connect", connected)
sqlalchemy.event.listen(sqlalchemy.pool.Pool, "close", closed)
sqlalchemy.event.listen(sqlalchemy.pool.Pool, "close_detached", closed)
from studies.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print("CONNECTIONS " + json.dumps(seen), file=sys.stderr)
sys.exit(code)
"""
COMMANDS = (["list"], ["best"], ["pareto"], ["top", "-k", "3"], ["errors"])


def write(url: str, name: str, writers: int, trials: int) -> float:
    """Record ``trials`` trials with ``writers`` processes at once; returns trials/s."""
    optuna.create_study(storage=open_storage(url), study_name=name)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    per = trials // writers
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, name, str(w), str(per)],
                              cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
             for w in range(writers)]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"writer failed: {err[-500:]}")
    return per * writers / (time.perf_counter() - start)


def best_of(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def time_queries(url: str, name: str, repeat: int) -> dict[str, float]:
    engine = open_storage(url).engine
    optuna_cli = shutil.which("optuna") or str(Path(sys.executable).parent / "optuna")
    database = engine.url.database
    checks = {} if engine.url.get_backend_name() != "sqlite" or not database else {
        "quick_check_s": best_of(lambda: check_sqlite_file(Path(database)), repeat),
        "file_mb": Path(database).stat().st_size / 2**20}
    return {**checks,
        "ours_best_s": best_of(lambda: q.top(engine, name, 1), repeat),
        "ours_pareto_s": best_of(lambda: q.pareto(engine, name), repeat),
        "optuna_best_trial_s": best_of(
            lambda: optuna.load_study(study_name=name, storage=url).best_trial, repeat),
        "optuna_cli_best_trial_s": best_of(lambda: subprocess.run(
            [optuna_cli, "best-trial", "--study-name", name, "--storage", url],
            capture_output=True, check=True), 1),
    }


def _one_query(argv: list[str], env: dict[str, str], out: dict[str, Any]) -> None:
    """Run one counted query; ``out`` gets its exit code, wall time, connections, error."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", QUERY, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    out["wall_s"], out["code"] = time.perf_counter() - start, done.returncode
    counted = [line for line in done.stderr.splitlines() if line.startswith("CONNECTIONS ")]
    out.update(json.loads(counted[-1].split(" ", 1)[1]) if counted else {})
    errors = [line for line in done.stderr.splitlines() if "error:" in line or "Error" in line]
    out["error"] = errors[-1] if errors else None


def _server_peak(url: str, stop: threading.Event, peak: list[int]) -> None:
    """The most connections to ``url``'s PostgreSQL database seen (polled every 0.1 s),
    this poller's own included."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )).scalar_one())
            conn.rollback()  # a fresh snapshot each time
    engine.dispose()


def concurrent_queries(url: str, name: str, n: int) -> dict[str, Any]:
    """``n`` query commands started at once on the study ``name``: exit codes, wall times,
    the connections each process made and held at once, the server's peak."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: list[dict[str, Any]] = [{} for _ in range(n)]
    argvs = [[*COMMANDS[i % len(COMMANDS)], "--storage", url,
              *([] if COMMANDS[i % len(COMMANDS)] == ["list"] else ["--study", name])]
             for i in range(n)]
    postgres = sa.make_url(url).get_backend_name() == "postgresql"
    stop, peak, limit, poller = threading.Event(), [0], None, None
    if postgres:
        with sa.create_engine(url, poolclass=sa.pool.NullPool).connect() as conn:
            limit = int(conn.execute(sa.text("SHOW max_connections")).scalar_one())
        poller = threading.Thread(target=_server_peak, args=(url, stop, peak))
        poller.start()
    start = time.perf_counter()
    threads = [threading.Thread(target=_one_query, args=(argv, env, out))
               for argv, out in zip(argvs, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.perf_counter() - start
    stop.set()
    if poller is not None:
        poller.join()
    walls = sorted(r["wall_s"] for r in results)
    codes = [r["code"] for r in results]
    return {"backend": sa.make_url(url).get_backend_name(), "queries": n,
            "max_connections": limit, "exit_0": codes.count(0), "exit_1": codes.count(1),
            "exit_other": n - codes.count(0) - codes.count(1),
            "most_open_per_process": max(r.get("most", 0) for r in results),
            "most_made_per_process": max(r.get("connects", 0) for r in results),
            "server_peak": peak[0] if postgres else None,
            "wall_min_s": walls[0], "wall_median_s": statistics.median(walls),
            "wall_max_s": walls[-1], "total_s": total,
            "errors": sorted({r["error"] for r in results if r["error"]})[:3]}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="bench.study_query", description=__doc__.split("\n\n")[1])
    p.add_argument("--smoke-test", action="store_true", help="100-trial studies, 1-2 writers")
    p.add_argument("--postgres", default=os.environ.get("TEST_POSTGRES_URL"),
                   help="PostgreSQL URL (default: $TEST_POSTGRES_URL)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--queries", type=int_in(1), default=None,
                   help="query commands started at once (default 100; 4 with --smoke-test)")
    p.add_argument("--queries-only", action="store_true",
                   help="only the concurrent queries, on PostgreSQL when a URL is given (else "
                        "SQLite)")
    add_format(p)
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes: tuple[int, ...] = (100,) if args.smoke_test else (1000, 10000)
    writer_counts: tuple[int, ...] = (1, 2) if args.smoke_test else (1, 4, 8)
    n_queries = args.queries or (4 if args.smoke_test else 100)
    if args.queries_only:
        sizes, writer_counts = (), ()
    tmp = Path(tempfile.mkdtemp(prefix="study_bench_"))
    backends = {"sqlite": f"sqlite:///{tmp / 'bench.db'}"}
    if args.postgres:
        backends["postgresql"] = args.postgres
        if args.queries_only:
            del backends["sqlite"]
    throughput: list[dict[str, Any]] = []
    queries: list[dict[str, Any]] = []
    crowd: list[dict[str, Any]] = []
    for backend, url in backends.items():
        for writers in writer_counts:
            rate = write(url, f"w{writers}-{uuid.uuid4().hex[:6]}", writers, 50 * writers * (
                1 if args.smoke_test else 4))
            throughput.append({"backend": backend, "writers": writers, "trials_per_s": rate})
            print(f"{backend}: {writers} writer(s) {rate:.1f} trials/s", file=sys.stderr)
        for size in sizes:
            name = f"q{size}-{uuid.uuid4().hex[:6]}"
            write(url, name, max(writer_counts), size)
            row: dict[str, Any] = {"backend": backend, "trials": size,
                                   **time_queries(url, name, args.repeat)}
            row["optuna_over_ours"] = row["optuna_best_trial_s"] / row["ours_best_s"]
            queries.append(row)
            print(f"{backend} {size}: {row}", file=sys.stderr)
        name = f"c-{uuid.uuid4().hex[:6]}"
        write(url, name, 1, 100)
        crowd.append(concurrent_queries(url, name, n_queries))
        print(f"{backend} {n_queries} queries at once: {crowd[-1]}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    if args.format != "table":
        print(dump({"throughput": throughput, "queries": queries, "concurrent": crowd},
                   args.format))
        return 0
    _print_tables(throughput, queries, crowd)
    return 0


def _print_tables(throughput: list[dict[str, Any]], queries: list[dict[str, Any]],
                  crowd: list[dict[str, Any]]) -> None:
    if throughput:
        print(render_table(["backend", "writers", "trials/s"],
                           [[r["backend"], r["writers"], f"{r['trials_per_s']:.1f}"]
                            for r in throughput], right=[False, True, True]))
        print()
    if queries:
        _print_query_times(queries)
        print()
    print(render_table(
        ["backend", "queries at once", "server max_connections", "exit 0", "exit 1", "other",
         "most open per process", "server peak", "wall min / median / max", "all done"],
        [[r["backend"], r["queries"], r["max_connections"] or "-", r["exit_0"], r["exit_1"],
          r["exit_other"], r["most_open_per_process"], r["server_peak"] or "-",
          f"{r['wall_min_s']:.1f} / {r['wall_median_s']:.1f} / {r['wall_max_s']:.1f} s",
          f"{r['total_s']:.1f} s"] for r in crowd], right=[False] + [True] * 9))


def _print_query_times(queries: list[dict[str, Any]]) -> None:
    print(render_table(
        ["backend", "trials", "ours best", "ours pareto", "load_study best_trial",
         "optuna best-trial CLI", "load_study / ours", "quick_check (file)"],
        [[r["backend"], r["trials"], f"{r['ours_best_s'] * 1e3:.0f} ms",
          f"{r['ours_pareto_s'] * 1e3:.0f} ms", f"{r['optuna_best_trial_s'] * 1e3:.0f} ms",
          f"{r['optuna_cli_best_trial_s'] * 1e3:.0f} ms", f"{r['optuna_over_ours']:.1f}x",
          f"{r['quick_check_s'] * 1e3:.0f} ms ({r['file_mb']:.1f} MB)" if "quick_check_s" in r
          else "-"]
         for r in queries], right=[False] + [True] * 7))


if __name__ == "__main__":
    sys.exit(main())
