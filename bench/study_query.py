"""python -m bench.study_query [--smoke-test] [--postgres URL] [--format table|json|yaml]

Study database benchmark, every ratio measured in one run:

* write throughput: trials/s recorded through Optuna by 1, 4 and 8 writer processes at once,
  SQLite (WAL) and PostgreSQL;
* query time on studies of 1k and 10k trials: our ``best`` and ``pareto`` (SQL on Optuna's
  tables) against ``optuna.load_study(...).best_trial`` and the stock ``optuna best-trial``
  command (the last includes its interpreter start, as a user would see it);
* SQLite: the integrity check every command runs once on a study file
  (``studies.integrity``: ``PRAGMA quick_check``), next to our ``best``.

PostgreSQL runs when ``--postgres`` or ``$TEST_POSTGRES_URL`` gives a URL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import optuna

from common.cli import Parser, add_format, dump, render_table
from studies import check_sqlite_file, open_storage
from studies import query as q

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


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="bench.study_query", description=__doc__.split("\n\n")[1])
    p.add_argument("--smoke-test", action="store_true", help="100-trial studies, 1-2 writers")
    p.add_argument("--postgres", default=os.environ.get("TEST_POSTGRES_URL"),
                   help="PostgreSQL URL (default: $TEST_POSTGRES_URL)")
    p.add_argument("--repeat", type=int, default=3)
    add_format(p)
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes, writer_counts = ((100,), (1, 2)) if args.smoke_test else ((1000, 10000), (1, 4, 8))
    tmp = Path(tempfile.mkdtemp(prefix="study_bench_"))
    backends = {"sqlite": f"sqlite:///{tmp / 'bench.db'}"}
    if args.postgres:
        backends["postgresql"] = args.postgres
    throughput: list[dict[str, Any]] = []
    queries: list[dict[str, Any]] = []
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
    shutil.rmtree(tmp, ignore_errors=True)
    if args.format != "table":
        print(dump({"throughput": throughput, "queries": queries}, args.format))
        return 0
    print(render_table(["backend", "writers", "trials/s"],
                       [[r["backend"], r["writers"], f"{r['trials_per_s']:.1f}"]
                        for r in throughput], right=[False, True, True]))
    print()
    print(render_table(
        ["backend", "trials", "ours best", "ours pareto", "load_study best_trial",
         "optuna best-trial CLI", "load_study / ours", "quick_check (file)"],
        [[r["backend"], r["trials"], f"{r['ours_best_s'] * 1e3:.0f} ms",
          f"{r['ours_pareto_s'] * 1e3:.0f} ms", f"{r['optuna_best_trial_s'] * 1e3:.0f} ms",
          f"{r['optuna_cli_best_trial_s'] * 1e3:.0f} ms", f"{r['optuna_over_ours']:.1f}x",
          f"{r['quick_check_s'] * 1e3:.0f} ms ({r['file_mb']:.1f} MB)" if "quick_check_s" in r
          else "-"]
         for r in queries], right=[False] + [True] * 7))
    return 0


if __name__ == "__main__":
    sys.exit(main())
