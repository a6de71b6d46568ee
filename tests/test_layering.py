"""The folder tree is the dependency graph (docs/architecture.md, the layering rule), with no
exception: common/ imports no other package of ours; the vocabulary (arch/) and the data readers
(userdata/) build only on common/; search_spaces/ on those; studies/ on the vocabulary (not alloc,
which reads studies to calibrate); alloc/ never imports workers/ and no torch or Ray; only
workers/ may use both. What is checked is what is really imported: every import statement, no
call path around them (entry points, imports by a computed name), every torch-free module
imported in a fresh interpreter, and the profile commands run from a plain checkout with no
package metadata installed. No module shadows the standard library. Within and across the
packages the modules' imports form no cycle, lazy imports included; no product module imports
the tests, and no test module imports another (shared helpers live in ``tests/helpers/``)."""

from __future__ import annotations

import ast
import os
import site
import subprocess
import sys
import tomllib
from collections.abc import Container, Iterable, Mapping
from pathlib import Path

import pytest

from common.lazy import stub_names

ROOT = Path(__file__).resolve().parents[1]
OURS = {"alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers"}
# The top floor: work run by hand (benchmarks, the papers' experiments) over the product's
# public surfaces; nothing of the product imports it, and it ships in no wheel.
TOP_FLOOR = {"bench", "experiments"}
FORBIDDEN = {
    # Shared command-line, error, file and plot helpers: everyone may import them.
    "common": {"torch", "ray"} | OURS - {"common"},
    "arch": {"torch", "ray"} | OURS - {"arch", "common"},
    "userdata": {"torch", "ray"} | OURS - {"userdata", "common"},
    "search_spaces": {"torch", "ray", "alloc", "studies", "workers"},
    # alloc.calibrate reads studies; studies never reads alloc, so the graph stays acyclic.
    "alloc": {"torch", "ray", "workers"},
    "studies": {"torch", "ray", "workers", "alloc"},
}
# What reaches code around the import statements: entry points (installed package metadata) and
# imports by a computed name.
# The one module allowed them: ``common.lazy`` imports a lazy package's public names, exactly
# those its ``__init__.pyi`` lists, which every check here reads as the package's imports.
LAZY_LOADER = Path("common/lazy.py")
HIDDEN = {"entry_points", "pkg_resources", "import_module", "__import__", "runpy", "run_module",
          "run_path"}


def sources(root: Path) -> list[Path]:
    """Every Python source under ``root``: modules, and the ``__init__.pyi`` stubs that name a
    lazy package's public names (``common.lazy`` imports what they name, so their imports are
    the package's as much as its modules' are)."""
    return sorted([*root.rglob("*.py"), *root.rglob("*.pyi")])


def imports(path: Path) -> set[str]:
    """The root packages ``path`` imports (anywhere in the file, lazily too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    files = sources(ROOT / package)
    assert files, f"{package}/ has no modules"
    for path in files:
        name = str(path.relative_to(ROOT))
        bad = imports(path) & FORBIDDEN[package]
        assert not bad, f"{name} imports {sorted(bad)}"


def hidden_paths(path: Path) -> set[str]:
    """The names of ``HIDDEN`` that ``path`` imports, calls or reads."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name | ast.Attribute):
            found.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found |= {alias.name.split(".")[0] for alias in node.names}
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module.split(".")[0])
    return found & HIDDEN


@pytest.mark.parametrize("package", sorted(OURS | TOP_FLOOR))
def test_no_call_path_goes_around_the_imports(package: str) -> None:
    """Every module of ours reaches the code it runs by an import the check above sees: none
    looks up entry points or imports a module by a computed name."""
    for path in sources(ROOT / package):
        if path.relative_to(ROOT) == LAZY_LOADER:
            continue
        found = hidden_paths(path)
        assert not found, f"{path.relative_to(ROOT)} uses {sorted(found)}"


def test_the_package_registers_no_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "entry-points" not in project, project["entry-points"]


def test_no_product_module_imports_the_top_floor() -> None:
    """``experiments/`` and ``bench/`` build on the product, never the other way round, and
    the wheel ships neither (they run from a checkout: ``python -m experiments.NAME``)."""
    users = sorted(f"{path.relative_to(ROOT)} imports {sorted(imports(path) & TOP_FLOOR)}"
                   for package in sorted(OURS) for path in sources(ROOT / package)
                   if imports(path) & TOP_FLOOR)
    assert not users, users
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    included = {pattern.rstrip("*") for pattern in shipped["packages"]["find"]["include"]}
    assert included == OURS, included


def test_importing_every_torch_free_module_loads_no_torch_and_no_workers() -> None:
    """Each module of the packages that never import torch, imported in a fresh interpreter:
    neither torch nor Ray nor any module of workers/ gets loaded."""
    packages = sorted(FORBIDDEN)
    code = f"""
import importlib, pkgutil, sys
for package in {packages!r}:
    path = importlib.import_module(package).__path__
    for info in pkgutil.walk_packages(path, package + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray", "workers"))
assert not loaded, loaded
assert "alloc.profile" in sys.modules and "userdata.cli" in sys.modules
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def plain_checkout_env(tmp_path: Path, root: Path = ROOT) -> dict[str, str]:
    """An environment for ``python -S`` that sees the packages of the checkout at ``root`` and
    the installed libraries (``PYTHONPATH``), but none of this package's metadata: not the
    installed one nor its editable finder (the site-packages entries are linked one by one into
    a folder, ours left out), nor the ``*.egg-info`` an install leaves in the checkout (its
    packages are linked into another folder)."""
    checkout, libraries = tmp_path / "checkout", tmp_path / "libraries"
    checkout.mkdir()
    libraries.mkdir()
    for package in OURS:
        (checkout / package).symlink_to(root / package)
    for folder in site.getsitepackages():
        for entry in Path(folder).iterdir():
            ours = entry.name.startswith(("transformer_alloc", "__editable__"))
            if not ours and not entry.name.endswith(".pth") \
                    and not (libraries / entry.name).exists():
                (libraries / entry.name).symlink_to(entry)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(libraries)])}


def test_the_profile_commands_run_from_a_plain_checkout(tmp_path: Path) -> None:
    """``workers.profile --checkpoint`` and ``--data``, and ``alloc.profile --data`` (with and
    without the pilot it hands to ``workers.profile``), from another folder with ``PYTHONPATH``
    on this checkout's packages and no package metadata: nothing runs through an installed entry
    point."""
    from workers.train import main as train_main

    env = plain_checkout_env(tmp_path)

    def python(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-S", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    probe = python("-c", "import importlib.metadata as m, workers, alloc; "
                         "m.distribution('transformer-alloc')")
    assert "PackageNotFoundError" in probe.stderr, probe.stderr[-2000:]  # really a plain one
    arch = tmp_path / "arch.yaml"
    arch.write_text("d_model: 16\nmax_seq_len: 8\ninput_dim: 1\n"
                    "layers:\n  - {attention: mhsa, heads: ['2x8'], mlp_ratio: 1}\n")
    assert train_main(["--arch", str(arch), "--task", "lm", "--smoke-test", "--steps", "2",
                       "--out", str(tmp_path / "c.pt"), "--quiet", "--format", "json"]) == 0
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    runs = {"plan.yaml": ["workers.profile", "--checkpoint", "c.pt", "--task", "lm",
                          "--smoke-test"],
            "pilot.yaml": ["workers.profile", "--data", "corpus.txt", "--seq-len", "16",
                           "--pilot-steps", "2", "--budget", "16"],
            "stats.yaml": ["alloc.profile", "--data", "corpus.txt", "--no-pilot"],
            # the pilot, handed to workers.profile in a child process
            "handed.yaml": ["alloc.profile", "--data", "corpus.txt", "--seq-len", "16",
                            "--pilot-steps", "2", "--budget", "16"]}
    for out, (command, *argv) in runs.items():
        done = python("-m", command, *argv, "--out", out, "--quiet")
        assert done.returncode == 0, (command, argv, done.stderr[-2000:])
        writer = "workers.profile" if "--pilot-steps" in argv else command
        assert (tmp_path / out).stat().st_size > 0 and f"{writer}: wrote {out}" in done.stderr


def test_no_module_shadows_the_standard_library() -> None:
    packages = [ROOT / p for p in sorted(OURS | TOP_FLOOR)]
    names = {path.stem for package in packages for path in package.rglob("*.py")}
    names |= {path.name for package in packages for path in package.rglob("*") if path.is_dir()}
    names |= OURS
    # ``python -m alloc.profile`` and ``python -m workers.profile`` are public commands; the
    # standard library's ``profile`` is the pure-Python profiler, which nothing here imports.
    # The one name kept, and pinned.
    shadowing = sorted(names & set(sys.stdlib_module_names) - {"profile"})
    assert not shadowing, f"modules named like the standard library's: {shadowing}"


def test_ray_is_imported_by_the_driver_and_the_trial_runner_only() -> None:
    users = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "workers").rglob("*.py")
                   if "ray" in imports(path))
    assert users == ["workers/search/tune.py"], users


# --- module cycles and the tests' imports ------------------------------------------------------

def module_name(path: Path, root: Path) -> str:
    """``a/b/c.py`` -> ``a.b.c``; ``a/b/__init__.py`` -> ``a.b``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by its dotted name."""
    return {module_name(path, root): path for package in packages
            for path in sorted((root / package).rglob("*.py"))}


def imported(path: Path, name: str, modules: Container[str]) -> set[str]:
    """The ``modules`` that module ``name`` (at ``path``) imports, anywhere in it (lazily too),
    relative imports resolved: ``import a.b`` is ``a.b``; ``from a import b`` is the submodule
    ``a.b`` when there is one, else ``a`` (its ``__init__``, which binds ``b``). Importing
    ``a.b`` runs ``a/__init__`` first, but that is Python loading the package, not a use of
    what ``a/__init__`` binds: it is no edge to ``a``. So a package's ``__init__`` that
    re-exports its submodules has edges to them, and a submodule that imports a name from its
    own package's ``__init__`` closes a cycle (``a`` -> ``a.b`` -> ``a``)."""
    package = (name if path.stem == "__init__" else name.rpartition(".")[0]).split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules
                          else module)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Each module of ``packages`` -> the modules of theirs it imports (``imported``; a lazy
    package's ``__init__`` imports what its ``__init__.pyi`` names)."""
    modules = modules_of(root, packages)
    graph = {name: imported(path, name, modules) for name, path in modules.items()}
    for package in packages:
        for stub in sorted((root / package).rglob("__init__.pyi")):
            name = module_name(stub, root)
            graph.setdefault(name, set()).update(imported(stub, name, modules))
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """A cycle of ``graph`` as the path around it (``[a, b, a]``), or ``[]`` if it has none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return []
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return []


def test_no_module_imports_itself_through_others() -> None:
    """Across every module's imports, the product's and the top floor's, lazy ones included,
    there is no cycle: a cycle hidden by a function-level import is one still (two modules that
    need each other are one job, or share a piece that belongs below both)."""
    cycle = find_cycle(import_graph(ROOT, OURS | TOP_FLOOR))
    assert not cycle, "module cycle: " + " -> ".join(cycle)


def room_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """``graph`` with each module folded into its room: the subpackage two levels down
    (``workers.training.trainer`` -> ``workers.training``; ``workers.pilot`` stays itself)."""
    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(
            room(t) for t in targets if room(t) != room(module))
    return rooms


def test_no_subpackage_imports_itself_through_others() -> None:
    """The rooms of each floor form no cycle either: ``workers.training`` and
    ``workers.compression`` (the compressor fine-tunes with the trainer, so the trainer never
    reaches compression), ``bench.gpu``'s modules, and every other pair of subpackages."""
    cycle = find_cycle(room_graph(import_graph(ROOT, OURS | TOP_FLOOR)))
    assert not cycle, "subpackage cycle: " + " -> ".join(cycle)


def test_the_room_check_folds_modules_into_subpackages() -> None:
    graph = {"w.a.x": {"w.b.y"}, "w.b.y": {"w.b.z"}, "w.b.z": {"w.a.q"}, "w.a.q": set()}
    assert find_cycle(graph) == []
    assert find_cycle(room_graph(graph)) == ["w.a", "w.b", "w.a"]


def test_the_cycle_check_finds_lazy_relative_and_package_cycles(tmp_path: Path) -> None:
    """The check above sees what it must: a cycle closed by a lazy relative import, one closed
    by a submodule importing a name from its own package's ``__init__``, and none where a
    submodule imports a sibling or a package re-exports its submodules."""
    files = {"p/__init__.py": "from p.a import A\n",  # p -> p.a
             "p/a.py": "from p import b\nA = 1\n",  # p.a -> p.b (a submodule)
             "p/b.py": "def f():\n    from . import c\n",  # p.b -> p.c, lazily and relative
             "p/c.py": "import p.d\n",  # p.c -> p.d (no edge to p)
             "p/d.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_graph(tmp_path, ["p"]) == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.c"},
                                             "p.c": {"p.d"}, "p.d": set()}
    assert find_cycle(import_graph(tmp_path, ["p"])) == []
    (tmp_path / "p/d.py").write_text("def g():\n    from .b import f\n")  # lazy, relative
    assert find_cycle(import_graph(tmp_path, ["p"])) == ["p.b", "p.c", "p.d", "p.b"]
    (tmp_path / "p/d.py").write_text("from p import A\n")  # a name p/__init__ binds
    assert find_cycle(import_graph(tmp_path, ["p"])) == ["p", "p.a", "p.b", "p.c", "p.d", "p"]


TESTS = ROOT / "tests"


def test_no_product_module_imports_the_tests() -> None:
    """The product (and the top floor) never import ``tests``: what a test needs the product
    to do is product code, and test code never ships."""
    users = sorted(str(path.relative_to(ROOT)) for package in sorted(OURS | TOP_FLOOR)
                   for path in sources(ROOT / package) if "tests" in imports(path))
    assert not users, users


def test_the_product_holds_no_test_hook() -> None:
    """The tests' hooks in a trial (faults, a worker held to be killed) live in
    ``tests/helpers/trial_hooks/``: no product module reads their variables."""
    users = sorted(str(path.relative_to(ROOT)) for package in sorted(OURS)
                   for path in (ROOT / package).rglob("*.py")
                   if "TRANSFORMER_ALLOC_TEST" in path.read_text())
    assert not users, users


def test_no_test_module_imports_another() -> None:
    """A module under ``tests/`` imports of the tests only ``tests.helpers`` (shared helpers;
    ``conftest.py`` reaches tests as fixtures, not imports): never a test module, whose
    collection would then run its tests twice and tie one file's tests to another's."""
    modules = modules_of(ROOT, ["tests"])
    found = []
    for name, path in modules.items():
        for target in sorted(imported(path, name, modules) | (
                {"tests." + m for m in imports(path)} & set(modules))):  # ``import test_x``
            if target != "tests" and not target.startswith("tests.helpers"):
                found.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not found, found


# --- public surfaces ------------------------------------------------------------------------------

# The packages whose API others use through their ``__init__``: outside the package, a module
# imports the names of its ``__all__`` from the package, and only the submodules ``__all__``
# lists (``arch.checks``, ``studies.query``); every other module is private to it.
SURFACES = ("alloc", "arch", "search_spaces", "studies", "userdata", "workers.compression",
            "workers.search")
# The top floor sees the torch runtime through its rooms' ``__init__`` too (the runtime's own
# rooms import each other's modules directly).
TOP_SURFACES = (*SURFACES, "workers.checkpoints", "workers.hf", "workers.models",
                "workers.tasks", "workers.training")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def public_names(package: str, root: Path = ROOT) -> set[str]:
    """The names the package's ``__init__`` lists in ``__all__``, or its ``__init__.pyi``
    names (a lazy package's; read, not imported)."""
    init = root / package.replace(".", "/") / "__init__.py"
    if init.with_suffix(".pyi").exists():
        return set(stub_names(init.with_suffix(".pyi")))
    tree = ast.parse(init.read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                 for t in node.targets)):
            return {ast.literal_eval(item) for item in node.value.elts}  # type: ignore[attr-defined]
    return set()


def private_imports(source: str, where: str, inside: str = "",
                    surfaces: tuple[str, ...] = SURFACES) -> list[str]:
    """Each import in ``source`` of a surface package's private module or unlisted name, by
    a module outside that package (``inside``: the importing module's dotted name)."""
    found = []
    pairs: list[tuple[str, str | None]]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            pairs = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in pairs:
            package = next((s for s in surfaces if module == s or module.startswith(s + ".")), "")
            if not package or inside == package or inside.startswith(package + "."):
                continue
            rest = module[len(package) + 1:]
            public = public_names(package)
            head = rest.partition(".")[0]
            if (rest and head not in public) or (not rest and name and name not in public):
                found.append(f"{where}: {module}{'' if rest else '.' + str(name)}")
    return found


def test_outside_a_package_only_its_public_surface_is_imported() -> None:
    """``alloc``, ``arch``, ``search_spaces``, ``studies``, ``userdata``, ``workers.compression``
    and ``workers.search`` keep private modules behind a public ``__init__``: every product
    module and every Python block of the docs imports from the package, or a module its
    ``__all__`` lists; the top floor (``experiments/``, ``bench/``) also sees the runtime's
    rooms (models, training, tasks, checkpoints, hf) only through their ``__init__``."""
    modules = modules_of(ROOT, [*OURS, *TOP_FLOOR])
    found = [hit for name, path in modules.items()
             for hit in private_imports(path.read_text(), name, inside=name,
                                        surfaces=TOP_SURFACES if name.split(".")[0] in TOP_FLOOR
                                        else SURFACES)]
    for doc in DOCS:
        for i, block in enumerate(doc.read_text().split("```python")[1:]):
            code = block.split("```")[0]
            try:
                found += private_imports(code, f"{doc.name} block {i}")
            except SyntaxError:
                continue
    assert not found, "private modules imported from outside their package:\n" + "\n".join(found)


def test_the_surface_check_finds_private_modules_and_unlisted_names() -> None:
    text = ("from arch.memory import gib\nfrom arch import checks, kv_cache_bytes\n"
            "import studies.storage\nfrom studies import query, storage\n"
            "from studies.trials import Direction\nfrom userdata import readers\n")
    assert private_imports(text, "m", inside="workers.x") == [
        "m: arch.memory", "m: studies.storage", "m: studies.storage", "m: userdata.readers"]
    assert private_imports(text, "m", inside="arch.memory")[0] == "m: studies.storage"


@pytest.mark.parametrize("package", ["alloc", "studies", "workers.search", "workers.compression"])
def test_every_public_name_of_a_lazy_package_resolves(package: str) -> None:
    """A lazily loaded package's ``__all__`` and its ``__getattr__`` agree: each listed name
    loads, a public submodule by import (a name listed but not routed, or routed to the wrong
    module, fails here)."""
    import importlib
    import importlib.util

    module = importlib.import_module(package)
    for name in module.__all__:
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            importlib.import_module(f"{package}.{name}")
        else:
            assert getattr(module, name) is not None, f"{package}.{name}"
