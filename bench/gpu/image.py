"""The GPU machines' image: its Python packages (``image.yaml``, dated), what this interpreter
lacks of a list of modules, and an environment that holds only the image's packages.

``image_venv(folder)`` makes a virtual environment whose site-packages links, one entry at a
time, only the distributions of the image that are installed here (no project metadata, no
``.pth`` finders): a command run with its interpreter and ``PYTHONPATH`` on a checkout imports
what it would import on the GPU machine, and a package the image lacks fails there as it would
there. ``tests/test_bench_gpu.py`` runs ``python -m bench.gpu --device cpu --smoke-test`` in it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import venv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.files import read_yaml

IMAGE_FILE = Path(__file__).with_name("image.yaml")


def normalize(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Image:
    """The GPU image's Python: when the list was read, its version, pinned versions of the
    packages that matter here, and every distribution it holds (normalized names)."""

    date: str
    python: str
    versions: dict[str, str]
    packages: frozenset[str]

    def lacks(self, distributions: Iterable[str]) -> list[str]:
        """Those of ``distributions`` the image does not hold, in their order."""
        return [d for d in distributions if normalize(d) not in self.packages]


def read_image(path: Path = IMAGE_FILE) -> Image:
    """The image's list as kept in the repository."""
    data = read_yaml(path)
    return Image(str(data["date"]), str(data["python"]),
                 {normalize(k): str(v) for k, v in data["versions"].items()},
                 frozenset(normalize(p) for p in data["packages"]))


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The top-level modules of ``modules`` this interpreter cannot import (not found; nothing
    is imported to find out)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def installed(names: Iterable[str]) -> list[importlib.metadata.Distribution]:
    """The distributions installed here whose normalized names are in ``names`` (each once)."""
    wanted, found = {normalize(n) for n in names}, {}
    for dist in importlib.metadata.distributions():
        name = normalize(dist.metadata["Name"] or "")
        if name in wanted and name not in found:
            found[name] = dist
    return list(found.values())


def top_entries(dist: importlib.metadata.Distribution) -> list[str]:
    """The site-packages entries (packages, modules, its ``.dist-info``) a distribution
    installed, from its RECORD; scripts and ``.pth`` files left out."""
    entries = []
    for file in dist.files or []:
        top = file.parts[0]
        if top not in ("..", "__pycache__") and not top.endswith(".pth") and top not in entries:
            entries.append(top)
    return entries


def requirements(dist: importlib.metadata.Distribution) -> list[str]:
    """The distributions ``dist`` requires here (its extras' left out)."""
    from packaging.requirements import Requirement

    needed = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            needed.append(normalize(req.name))
    return needed


def closure(names: Iterable[str]) -> set[str]:
    """``names`` and, installed here, everything they require, recursively: the versions
    installed here may need packages the image's versions do not (a newer huggingface-hub
    needs httpx2), which are theirs to import, not ours."""
    done: set[str] = set()
    todo = [normalize(n) for n in names]
    while todo:
        batch = [n for n in dict.fromkeys(todo) if n not in done]
        done |= set(batch)
        todo = [r for dist in installed(batch) for r in requirements(dist)]
    return done


def image_venv(folder: Path, image: Image | None = None, extra: Iterable[str] = (),
               exact: bool = False) -> Path:
    """A virtual environment in ``folder`` holding the image's distributions that are installed
    here (and ``extra`` ones), with what they require here unless ``exact`` (then a package
    only the versions here need is absent too: enough for what does not import them), linked
    into its site-packages; returns its interpreter."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    site = folder / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    names = set((image or read_image()).packages) | {normalize(e) for e in extra}
    if not exact:
        names = closure(names)
    for dist in installed(names):
        for entry in top_entries(dist):
            source, target = Path(str(dist.locate_file(entry))), site / entry
            if source.exists() and not target.exists():
                target.symlink_to(source)
    return folder / "bin" / "python"
