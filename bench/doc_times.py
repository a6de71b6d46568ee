"""python -m bench.doc_times [--match README] [--list] [--longest SECONDS]

Every time the README and the guides state for a command, measured: a trailing comment such as
``# 6 short trials: ~15 s`` or ``# ~6 min``, and the times stated in sentences (``PROSE``: each
names the words that state it, which the page must still hold, and the block or command it
times). Each fenced bash block holding such a command runs from its first line in a fresh folder
(the block's earlier commands make what its later ones read; ``corpus.txt`` and ``corpus/`` hold
1 MB of the standard library's source), and each stated time is set beside the measured one,
with the load (1-minute average, before and after) and the CPU seconds of the command's
processes (``getrusage`` of the children: less sensitive to the load than the wall time; Ray's
own daemons are not counted). A stated time is kept when it is within 1.5x of the measurement
on a quiet machine. Run by hand from the repository root.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.cli import Parser, add_format, dump, render_table
from common.progress import duration

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/guide")
FENCE = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)
STATED = re.compile(r"#[^#\n]*?~\s*([0-9.]+)\s*(s|min|h)\b(?:\s+([0-9.]+)\s*(s|min)\b)?")
UNIT_S = {"s": 1.0, "min": 60.0, "h": 3600.0}
WITHIN = 1.5  # a stated time this far from the measured one (either way) is kept
CORPUS_BYTES = 1 << 20


@dataclass(frozen=True)
class Prose:
    """A time stated in a sentence of ``path``: the words ``says`` state ``stated_s``, for the
    bash block of ``path`` whose first command starts with ``block``; the block's commands that
    contain ``only`` are timed together (all of them without it)."""

    path: str
    says: str
    stated_s: float
    block: str
    only: str = ""


PROSE = (
    Prose("README.md", "(~10 s in all)", 10.0, "python -m alloc.solve --budget 64 --layers 3"),
    Prose("README.md", "the two pilots: ~3.5 min at `--budget 256` on 2 cores", 210.0,
          "python -m workers.profile --data corpus.txt --budget 256", "workers.profile"),
)

Block = list[tuple[str, float | None]]  # (command, stated seconds or None)


def stated_seconds(stated: re.Match[str]) -> float:
    """The seconds ``STATED`` matched: ``~15 s``, ``~1.5 min``, ``~3 min 30 s``, ``~1 h 10 min``."""
    seconds = float(stated.group(1)) * UNIT_S[stated.group(2)]
    return seconds + (float(stated.group(3)) * UNIT_S[stated.group(4)] if stated.group(3) else 0.0)


def page_blocks(path: Path) -> list[tuple[str, Block]]:
    """(file:line, its commands) of every bash block of ``path``."""
    text, found = path.read_text(), []
    for fence in FENCE.finditer(text):
        line = text.count("\n", 0, fence.start()) + 2
        commands = []
        for raw in fence.group(1).replace("\\\n", " ").splitlines():
            stated = STATED.search(raw)
            command = raw.split(" #")[0].strip()
            if command and not command.startswith("#"):
                seconds = stated_seconds(stated) if stated else None
                commands.append((command, seconds))
        found.append((f"{path.relative_to(ROOT)}:{line}", commands))
    return found


def blocks(match: str) -> list[tuple[str, Block]]:
    """(file:line, [(command, stated seconds or None)]) of every bash block with a timed line."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs/guide").glob("*.md"))]
    return [(where, commands) for path in paths for where, commands in page_blocks(path)
            if any(s is not None for _, s in commands) and match in where]


def prose_block(prose: Prose) -> tuple[str, Block]:
    """The block ``prose`` times (see ``Prose``).

    Raises:
        LookupError: the page no longer says it, or has no such block.
    """
    path = ROOT / prose.path
    if prose.says not in " ".join(path.read_text().split()):
        raise LookupError(f"{prose.path} no longer says {prose.says!r}: update PROSE")
    for where, commands in page_blocks(path):
        if commands and commands[0][0].startswith(prose.block):
            return where, commands
    raise LookupError(f"{prose.path}: no bash block starting {prose.block!r}")


@dataclass(frozen=True)
class Statement:
    """A stated time: of the commands ``timed`` (indices) of the block at ``where``, together;
    ``says``: the sentence's words ("" for a command's comment)."""

    where: str
    timed: tuple[int, ...]
    stated_s: float
    says: str = ""


def statements(match: str) -> tuple[dict[str, Block], list[Statement]]:
    """The blocks to run by file:line, and every time stated for them (comments, then
    ``PROSE``)."""
    found = dict(blocks(match))
    out = [Statement(where, (i,), s) for where, commands in found.items()
           for i, (_, s) in enumerate(commands) if s is not None]
    for prose in PROSE:
        where, commands = prose_block(prose)
        if match in where:
            found[where] = commands
            out.append(Statement(where, tuple(i for i, (c, _) in enumerate(commands)
                                              if prose.only in c), prose.stated_s, prose.says))
    return found, out


def corpus(folder: Path) -> None:
    """``corpus.txt`` and ``corpus/`` of 1 MB of the standard library's source."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="replace")
        parts.append(text)
        size += len(text.encode())
        if size >= CORPUS_BYTES:
            break
    (folder / "corpus.txt").write_text("".join(parts)[:CORPUS_BYTES])
    (folder / "corpus").mkdir()
    shutil.copy(folder / "corpus.txt", folder / "corpus" / "corpus.txt")


@dataclass(frozen=True)
class Took:
    """What running commands took: exit code (the first non-zero), wall and CPU seconds, and
    the 1-minute load before the first and after the last."""

    exit: int
    wall_s: float
    cpu_s: float
    load: tuple[float, float]

    def __add__(self, other: Took) -> Took:
        return Took(self.exit or other.exit, self.wall_s + other.wall_s,
                    self.cpu_s + other.cpu_s, (self.load[0], other.load[1]))


def run(command: str, cwd: str, env: dict[str, str]) -> Took:
    """Run ``command`` with bash in ``cwd``."""
    load, cpu = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True)
    took, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    return Took(done.returncode, took, used, (load, os.getloadavg()[0]))


def row(statement: Statement, commands: Block, took: list[Took] | None) -> dict[str, object]:
    """A stated time beside its measurement (``took``: the block's commands'; None: not
    run)."""
    timed = [commands[i][0] for i in statement.timed]
    out: dict[str, object] = {"where": statement.where, "command": " && ".join(timed),
                              "says": statement.says, "stated_s": statement.stated_s}
    if took is None:
        return {**out, "measured_s": None, "cpu_s": None, "load": None, "exit": None,
                "ratio": None, "holds": None}
    parts = [took[i] for i in statement.timed]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    ratio = max(total.wall_s, 1e-9) / statement.stated_s
    return {**out, "measured_s": round(total.wall_s, 1), "cpu_s": round(total.cpu_s, 1),
            "load": f"{total.load[0]:.1f}-{total.load[1]:.1f}", "exit": total.exit,
            "ratio": round(ratio, 2), "holds": total.exit == 0 and 1 / WITHIN <= ratio <= WITHIN}


def measure(match: str, longest: float) -> list[dict[str, object]]:
    """Run every timed block once (see the module docstring); one row per stated time. A
    time stated over ``longest`` seconds is not measured (its row says so): its block runs up
    to the last command whose time is."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    found, stated = statements(match)
    rows: list[dict[str, object]] = []
    for where, commands in found.items():
        mine = [s for s in stated if s.where == where]
        runs = [s for s in mine if s.stated_s <= longest]
        took: list[Took] = []
        if runs:  # the block up to the last command a time within ``longest`` is stated for
            with tempfile.TemporaryDirectory(prefix="doc-times-") as tmp:
                corpus(Path(tmp))
                took = [run(command, tmp, env) for command, _ in
                        commands[:max(max(s.timed) for s in runs) + 1]]
        rows += [row(s, commands, took if s in runs else None) for s in mine]
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.doc_times", description=__doc__.split("\n\n")[1])
    p.add_argument("--match", default="", help="only blocks whose file:line contains this")
    p.add_argument("--list", action="store_true", help="list the stated times, run nothing")
    p.add_argument("--longest", type=float, default=600.0, metavar="SECONDS",
                   help="measure no time stated over this (default 600)")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        found, stated = statements(args.match)
    except LookupError as err:
        print(f"bench.doc_times: error: {err}", file=sys.stderr)
        return 2
    if args.list:
        for s in stated:
            print(f"{s.where}: ~{duration(s.stated_s)}  "
                  f"{' && '.join(found[s.where][i][0] for i in s.timed)}"
                  + (f"  [{s.says}]" if s.says else ""))
        return 0
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores", file=sys.stderr)
    rows = measure(args.match, args.longest)
    if args.format != "table":
        print(dump(rows, args.format))
    else:
        print(render_table(
            ["where", "stated", "measured", "cpu", "load", "ratio", "holds", "command"],
            [[r["where"], duration(float(r["stated_s"])),  # type: ignore[arg-type]
              seconds(r["measured_s"]), seconds(r["cpu_s"]), r["load"] or "-",
              r["ratio"] or "-", verdict(r),
              (f"{r['says']}: " if r["says"] else "") + str(r["command"])[:70]] for r in rows],
            right=[False, True, True, True, False, True, False, False]))
    return 0 if all(r["holds"] is not False for r in rows) else 1


def seconds(value: object) -> str:
    """A table cell for seconds, ``-`` for none."""
    return "-" if value is None else duration(float(value))  # type: ignore[arg-type]


def verdict(r: dict[str, object]) -> str:
    """``yes``, ``no``, ``no (exit N)``, or ``not run`` for a table row."""
    if r["holds"] is None:
        return "not run"
    return "yes" if r["holds"] else f"no (exit {r['exit']})" if r["exit"] else "no"


if __name__ == "__main__":
    sys.exit(main())
