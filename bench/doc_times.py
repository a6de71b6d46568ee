"""python -m bench.doc_times [--match README] [--list]

Every time the README and the guides state for a command (a trailing comment such as
``# 6 short trials: ~15 s`` or ``# ~6 min``), measured: each fenced bash block holding such a
command runs from its first line in a fresh folder (the block's earlier commands make what its
later ones read; ``corpus.txt`` and ``corpus/`` hold 1 MB of the standard library's source), and
each stated time is set beside the measured one. A stated time is kept when it is within 1.5x of
the measurement on a quiet machine (say the machine's load with the numbers). Run by hand.
"""

from __future__ import annotations

import argparse
import os
import re
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
STATED = re.compile(r"#[^#\n]*?~\s*([0-9.]+)\s*(s|min|h)\b")
UNIT_S = {"s": 1.0, "min": 60.0, "h": 3600.0}
WITHIN = 1.5  # a stated time this far from the measured one (either way) is kept
CORPUS_BYTES = 1 << 20


@dataclass(frozen=True)
class Timed:
    """A documented command and the time its comment states."""

    where: str  # file:line
    command: str
    stated_s: float


def blocks(match: str) -> list[tuple[str, list[tuple[str, float | None]]]]:
    """(file:line, [(command, stated seconds or None)]) of every bash block with a timed line."""
    found = []
    paths = [ROOT / "README.md", *sorted((ROOT / "docs/guide").glob("*.md"))]
    for path in paths:
        text = path.read_text()
        for fence in FENCE.finditer(text):
            line = text.count("\n", 0, fence.start()) + 2
            commands = []
            for raw in fence.group(1).replace("\\\n", " ").splitlines():
                stated = STATED.search(raw)
                command = raw.split(" #")[0].strip()
                if command and not command.startswith("#"):
                    seconds = float(stated.group(1)) * UNIT_S[stated.group(2)] if stated else None
                    commands.append((command, seconds))
            where = f"{path.relative_to(ROOT)}:{line}"
            if any(s is not None for _, s in commands) and match in where:
                found.append((where, commands))
    return found


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


def measure(match: str) -> list[dict[str, object]]:
    """Run every timed block (see the module docstring); one row per stated time."""
    rows: list[dict[str, object]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    for where, commands in blocks(match):
        with tempfile.TemporaryDirectory(prefix="doc-times-") as tmp:
            corpus(Path(tmp))
            for command, stated in commands:
                start = time.perf_counter()
                done = subprocess.run(["bash", "-c", command], cwd=tmp, env=env,
                                      capture_output=True, text=True)
                took = time.perf_counter() - start
                if stated is None:
                    continue
                ratio = max(took, 1e-9) / stated
                rows.append({"where": where, "command": command, "stated_s": stated,
                             "measured_s": round(took, 1), "exit": done.returncode,
                             "ratio": round(ratio, 2),
                             "holds": done.returncode == 0 and 1 / WITHIN <= ratio <= WITHIN})
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.doc_times", description=__doc__.split("\n\n")[1])
    p.add_argument("--match", default="", help="only blocks whose file:line contains this")
    p.add_argument("--list", action="store_true", help="list the stated times, run nothing")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for where, commands in blocks(args.match):
            for command, stated in commands:
                if stated is not None:
                    print(f"{where}: ~{duration(stated)}  {command}")
        return 0
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores", file=sys.stderr)
    rows = measure(args.match)
    if args.format != "table":
        print(dump(rows, args.format))
    else:
        print(render_table(["where", "stated", "measured", "ratio", "holds", "command"],
                           [[r["where"], duration(float(r["stated_s"])),  # type: ignore[arg-type]
                             duration(float(r["measured_s"])),  # type: ignore[arg-type]
                             r["ratio"], "yes" if r["holds"] else f"no (exit {r['exit']})"
                             if r["exit"] else "no", str(r["command"])[:70]] for r in rows],
                           right=[False, True, True, True, False, False]))
    return 0 if all(r["holds"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
