"""python -m bench.gpu.search pack | install --carry DIR | run [--trials 8]

The optional search step: a live ``workers.search`` on the GPU machine, whose image lacks Ray,
Optuna and SQLAlchemy and reaches no package index, and whose calls carry at most 64 MiB.

- ``pack`` (here, where PyPI answers): downloads the wheels, for the image's Python (3.12,
  manylinux x86-64), of what the search needs beyond the image, at the versions installed here
  (``SEARCH_ROOTS`` and what they require: Ray alone is a 79 MB wheel) and deals them into
  folders of at most ``--chunk-mib`` each, a wheel larger than that in pieces: one folder per
  device call, each with the manifest of all (names, sizes, SHA-256 of every wheel and piece).
- ``install --carry .gpu_carry/call-N`` (there, once per folder, the calls back to back on one
  warm machine): gathers the folder's pieces under ``.gpu_site`` (an ignored path the machine
  keeps between calls), and once every wheel is whole and checked, installs them with
  ``pip install --no-index --no-deps --target .gpu_site/site``.
- ``run`` (there): ``workers.search`` with ``.gpu_site/site`` on ``PYTHONPATH``, two trials
  sharing the GPU (``--gpus-per-trial 0.5``), its study in ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.gpu.image import closure, installed, normalize, read_image
from common.cli import Parser, fail, int_in, number
from common.errors import TransformerAllocError, UsageError

PROG = "bench.gpu.search"
ROOT = Path(__file__).resolve().parents[2]
# What the search imports beyond the image: Ray, Optuna (its RDB storage: SQLAlchemy, Alembic)
# and pydantic, which ``ray.tune`` needs through ``ray.train`` (Ray's "tune" extra; its other
# packages the image holds, but tensorboardX, whose logger Tune skips with a warning).
SEARCH_ROOTS = ("ray", "optuna", "sqlalchemy", "pydantic")
SEARCH_MODULES = ("ray", "optuna", "sqlalchemy", "pydantic")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
MANIFEST = "manifest.json"
MIB = 1 << 20


class CarryError(TransformerAllocError):
    """A carried folder that is not what ``pack`` wrote (bad input: exit 2)."""


@dataclass(frozen=True)
class Piece:
    """A piece of a wheel: its file name, the call that carries it, its SHA-256."""

    file: str
    call: int
    sha256: str
    size: int


@dataclass(frozen=True)
class Wheel:
    name: str  # the wheel's file name
    sha256: str
    size: int
    pieces: tuple[Piece, ...]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def search_packages() -> dict[str, str]:
    """What the search needs beyond the image, by name, at the version installed here."""
    image = read_image()
    needed = sorted(closure(SEARCH_ROOTS) - image.packages)
    found = {normalize(d.metadata["Name"]): d.version for d in installed(needed)}
    absent = [n for n in needed if n not in found]
    if absent:
        raise UsageError(f"not installed here: {', '.join(absent)} (pack carries the versions "
                         "this checkout's tests use: pip install -e '.[test]' first)")
    return found


def download(packages: dict[str, str], folder: Path, python: str) -> list[Path]:
    """``pip download`` of each package's wheel for ``python`` on manylinux x86-64."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp",
            *(f"--platform={p}" for p in PLATFORMS), "-d", str(folder),
            *(f"{name}=={version}" for name, version in packages.items())]
    subprocess.run(argv, check=True)
    return sorted(folder.glob("*.whl"))


def deal(wheels: list[Path], chunk: int) -> list[Wheel]:
    """Each wheel cut into pieces of at most ``chunk`` bytes, the pieces dealt into calls of
    at most ``chunk`` bytes, largest first (first fit)."""
    loads: list[int] = []
    dealt = []
    for wheel in sorted(wheels, key=lambda w: -w.stat().st_size):
        size, pieces = wheel.stat().st_size, []
        for i, start in enumerate(range(0, size, chunk)):
            n = min(chunk, size - start)
            call = next((c for c, load in enumerate(loads) if load + n <= chunk), len(loads))
            if call == len(loads):
                loads.append(0)
            loads[call] += n
            pieces.append(Piece(f"{wheel.name}.{i}", call + 1, "", n))
        dealt.append(Wheel(wheel.name, sha256(wheel), size, tuple(pieces)))
    return dealt


def write_calls(wheels: list[Path], dealt: list[Wheel], out: Path) -> list[Path]:
    """The call folders: each its pieces and the manifest of every wheel and piece."""
    by_name = {w.name: w for w in wheels}
    final: list[Wheel] = []
    for wheel in dealt:
        pieces = []
        with by_name[wheel.name].open("rb") as source:
            for piece in wheel.pieces:
                folder = out / f"call-{piece.call}"
                folder.mkdir(parents=True, exist_ok=True)
                data = source.read(piece.size)
                (folder / piece.file).write_bytes(data)
                pieces.append(Piece(piece.file, piece.call, hashlib.sha256(data).hexdigest(),
                                    piece.size))
        final.append(Wheel(wheel.name, wheel.sha256, wheel.size, tuple(pieces)))
    calls = sorted(out.glob("call-*"), key=lambda p: int(p.name.split("-")[1]))
    manifest = json.dumps({"calls": len(calls), "wheels": [asdict(w) for w in final]}, indent=1)
    for folder in calls:
        (folder / MANIFEST).write_text(manifest)
    return calls


def read_manifest(folder: Path) -> tuple[int, list[Wheel]]:
    try:
        data = json.loads((folder / MANIFEST).read_text())
        wheels = [Wheel(w["name"], w["sha256"], w["size"],
                        tuple(Piece(**p) for p in w["pieces"])) for w in data["wheels"]]
        return int(data["calls"]), wheels
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CarryError(f"--carry {str(folder)!r}: no manifest that pack wrote "
                         f"({type(err).__name__}); carry a folder of python -m {PROG} pack"
                         ) from None


def gather(carry: Path, site: Path) -> tuple[int, list[Wheel]]:
    """Copy ``carry``'s pieces, each checked, into ``site/parts``; the manifest."""
    calls, wheels = read_manifest(carry)
    parts = site / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for piece in (p for w in wheels for p in w.pieces):
        source = carry / piece.file
        if source.exists():
            if sha256(source) != piece.sha256:
                raise CarryError(f"--carry: {piece.file} is not the piece pack wrote (its "
                                 "SHA-256 differs); pack again")
            shutil.copyfile(source, parts / piece.file)
    return calls, wheels


def assemble(wheels: list[Wheel], site: Path) -> list[str]:
    """Join the wheels whose pieces are all in ``site/parts`` into ``site/wheels``, each
    checked; the call folder of each piece still to come (``call-N``)."""
    waiting, whole = [], site / "wheels"
    whole.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        absent = [p for p in wheel.pieces if not (site / "parts" / p.file).exists()]
        if absent:
            waiting += [f"call-{p.call}" for p in absent]
            continue
        target = whole / wheel.name
        with target.open("wb") as out:
            for piece in wheel.pieces:
                out.write((site / "parts" / piece.file).read_bytes())
        if sha256(target) != wheel.sha256:
            target.unlink()
            raise CarryError(f"{wheel.name}: joined, its SHA-256 is not the wheel's; pack again")
    return waiting


def install(carry: Path, site: Path) -> int:
    """``install``: gather, join, and with every wheel whole, ``pip install`` them."""
    calls, wheels = gather(carry, site)
    waiting = assemble(wheels, site)
    if waiting:
        whole = sum((site / "wheels" / w.name).exists() for w in wheels)
        print(f"{PROG}: {whole} of {len(wheels)} wheels whole; waiting for {len(waiting)} "
              f"pieces from {', '.join(sorted(set(waiting)))}: carry those next, on this warm "
              "machine (a fresh one starts bare: carry every folder again)")
        return 0
    target = site / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
                    *(str(site / "wheels" / w.name) for w in wheels)], check=True)
    print(f"{PROG}: installed {len(wheels)} wheels from {calls} calls into {target}; "
          f"next: python -m {PROG} run")
    return 0


def search_env(site: Path) -> dict[str, str]:
    paths = [str(ROOT), str((site / "site").resolve())]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def missing_there(site: Path) -> list[str]:
    """The search's modules the interpreter cannot find with ``site`` on its path."""
    code = ("import importlib.util, sys; print(','.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    done = subprocess.run([sys.executable, "-c", code, *SEARCH_MODULES], env=search_env(site),
                          capture_output=True, text=True, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def run(args: argparse.Namespace) -> int:
    """``run``: ``workers.search`` on the GPU, its study and result in ``--out``."""
    missing = missing_there(args.site)
    if missing:
        raise UsageError(f"missing packages: {', '.join(missing)}; carry them first: "
                         f"python -m {PROG} pack here, then install each call folder there")
    args.out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{(args.out / 'search.db').resolve()}"
    argv = [sys.executable, "-m", "workers.search", "--space", args.space, "--task", args.task,
            "--trials", str(args.trials), "--steps", str(args.steps), "--gpus-per-trial",
            str(args.gpus_per_trial), "--storage", storage, "--format", "json"]
    with (args.out / "search.json").open("w") as out:
        return subprocess.run(argv, cwd=ROOT, env=search_env(args.site), stdout=out).returncode


def pack(args: argparse.Namespace) -> int:
    """``pack``: download, deal into call folders, print the device calls."""
    if args.out.exists() and any(args.out.glob("call-*")):
        raise UsageError(f"--out {str(args.out)!r}: holds call folders already; remove it")
    wheels = sorted(args.wheels.glob("*.whl")) if args.wheels else download(
        search_packages(), args.out / "wheels", args.python)
    calls = write_calls(wheels, deal(wheels, int(args.chunk_mib * MIB)), args.out)
    total = sum(w.stat().st_size for w in wheels)
    print(f"{PROG}: {len(wheels)} wheels, {total / MIB:.1f} MiB, in {len(calls)} calls; on "
          "one warm machine, back to back:")
    for folder in calls:
        print(f"  carry {folder}: python3 -m {PROG} install --carry {folder}")
    print(f"  then: python3 -m {PROG} run --out $OUT")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("pack", help="here: download and deal the wheels into call folders")
    a.add_argument("--out", type=Path, default=Path(".gpu_carry"))
    a.add_argument("--python", default=read_image().python.rsplit(".", 1)[0],
                   help="the image's Python (wheels' tag)")
    a.add_argument("--chunk-mib", type=number(1), default=56.0,
                   help="the most one call carries (64 MiB less the working tree)")
    a.add_argument("--wheels", type=Path, help="deal these wheels instead of downloading")
    b = sub.add_parser("install", help="there: gather one call's pieces, install when whole")
    b.add_argument("--carry", type=Path, required=True)
    b.add_argument("--site", type=Path, default=Path(".gpu_site"))
    c = sub.add_parser("run", help="there: workers.search on the GPU")
    c.add_argument("--site", type=Path, default=Path(".gpu_site"))
    c.add_argument("--out", type=Path, required=True, help="study database and result")
    c.add_argument("--space", default="heads_vs_dim.yaml")
    c.add_argument("--task", default="ngram")
    c.add_argument("--trials", type=int_in(1), default=8)
    c.add_argument("--steps", type=int_in(1), default=300)
    c.add_argument("--gpus-per-trial", type=number(0), default=0.5,
                   help="0 trains on the CPU (the check of the carried set off the GPU)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pack":
            return pack(args)
        if args.command == "install":
            return install(args.carry, args.site)
        return run(args)
    except TransformerAllocError as err:
        return fail(PROG, str(err))
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"{PROG}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

