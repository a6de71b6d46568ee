"""python -m bench.startup [--runs 5] [--smoke-test] [--format table|json|yaml]

Start-up time of the product commands, interpreter start included, as a user sees it: the wall
time of ``python -m CMD --help`` for each of the eight commands and of ``studies list`` and
``studies best`` on a small SQLite study this script writes (median of ``--runs`` runs, one
process each); for each, the milliseconds our code spends importing (``python -X importtime``:
our packages and what they pull in, the interpreter's own start-up left out; median of up to 3
runs), all imports' milliseconds, and which heavy third-party modules got imported.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, dump, int_in, render_table

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("alloc.solve", "alloc.profile", "alloc.calibrate", "workers.train",
            "workers.search", "workers.profile", "workers.compress", "studies")
OURS = ("alloc", "arch", "bench", "common", "search_spaces", "studies", "userdata", "workers")
HEAVY = ("torch", "ray", "scipy.stats", "scipy.optimize", "transformers", "matplotlib", "optuna")


def environment() -> dict[str, str]:
    """This checkout first on the path, so the children import the code measured here."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def wall(argv: list[str], runs: int) -> float:
    """Median seconds of ``python *argv`` over ``runs`` runs; raises if it fails."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=environment(),
                              capture_output=True, text=True, timeout=300)
        times.append(time.perf_counter() - start)
        if proc.returncode:
            raise SystemExit(f"python {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    return statistics.median(times)


def import_profile(argv: list[str], runs: int) -> dict[str, Any]:
    """``python -X importtime *argv``: milliseconds of our imports and of all imports (the
    interpreter's start-up included; medians of ``runs`` runs), and the heavy modules imported.

    Ours are the top-level ``cumulative`` figures of our packages' modules, what they import
    included, and of whatever the command's module imports itself: ``-m`` runs it as
    ``__main__``, so its imports are top-level entries after ``runpy``'s.
    """
    ours, total, names = [], [], set()
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=ROOT,
                              env=environment(), capture_output=True, text=True, timeout=300)
        ours.append(0.0)
        total.append(0.0)
        command_started = False
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            _, cumulative, field = line.split("|")
            name = field[1:]
            names.add(name.strip())
            if name.startswith(" "):  # nested: counted in its importer's cumulative figure
                continue
            total[-1] += int(cumulative) / 1e3
            if command_started or name.split(".")[0] in OURS:
                ours[-1] += int(cumulative) / 1e3
            command_started = command_started or name == "runpy"
    return {"ours_import_ms": statistics.median(ours), "all_import_ms": statistics.median(total),
            "heavy": [h for h in HEAVY if h in names]}


def small_study(folder: Path) -> str:
    """A SQLite study of a few trials written through ``studies.add_record``; its URL."""
    import optuna

    from arch import ArchConfig, HeadGroup, LayerSpec
    from studies import add_record, open_storage, set_study_attrs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{folder / 'startup.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="startup")
    set_study_attrs(study, task="ngram", metric="mse")
    for n, heads in enumerate((1, 2, 4, 8, 16)):
        layer = LayerSpec("mhsa", (HeadGroup(heads, 64 // heads),))
        arch = ArchConfig(d_model=64, layers=(layer,) * 2, max_seq_len=16, input_dim=8)
        add_record(study, arch, 1.0 / (n + 1), predicted_error=float(n), steps_reached=100)
    return url


def measure(runs: int, commands: tuple[str, ...]) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="startup_bench_"))
    try:
        url = small_study(folder)
        cases = [(f"{cmd} --help", ["-m", cmd, "--help"]) for cmd in commands]
        cases += [(f"studies {q}", ["-m", "studies", q, "--storage", url])
                  for q in ("list", "best")]
        cases.append(("python (no command)", ["-c", "pass"]))
        rows = []
        for label, argv in cases:
            row = {"command": label, "wall_s": wall(argv, runs),
                   **import_profile(argv, min(runs, 3))}
            rows.append(row)
            print(f"{label}: {row['wall_s']:.2f} s", file=sys.stderr)
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="bench.startup", description=__doc__.split("\n\n")[1])
    p.add_argument("--runs", type=int_in(1), default=5, help="runs per command (the median)")
    p.add_argument("--smoke-test", action="store_true",
                   help="one run each, alloc.solve and studies only")
    add_format(p)
    args = p.parse_args(argv)
    if args.smoke_test:
        rows = measure(1, ("alloc.solve", "studies"))
    else:
        rows = measure(args.runs, COMMANDS)
    if args.format != "table":
        print(dump(rows, args.format))
        return 0
    print(render_table(
        ["command", "wall s", "our imports ms", "all imports ms", "heavy modules imported"],
        [[r["command"], f"{r['wall_s']:.2f}", f"{r['ours_import_ms']:.0f}",
          f"{r['all_import_ms']:.0f}", ", ".join(r["heavy"]) or "-"] for r in rows],
        right=[False, True, True, True, False]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
