"""The corpora present on every machine, in one registry: the **development** corpora the
repository's rules were tuned on, and the **held-out** ones that judge a rule and are never
tuned on (``docs/guide/data.md``, "Development and held-out corpora").

Every corpus is bytes an installation already holds, written as text to a folder (the format
``userdata.readers`` reads), in sorted file order, so the same interpreter and package versions
give the same bytes on every machine. "Every machine" is this project's CPU install and a bare
GPU box with Python, torch (and what torch requires, such as sympy), transformers, safetensors,
scipy, numpy and pyyaml only: the held-out corpora come from those and are of kinds no
development corpus is.

Development (the corpora experiment's three; the prior's tables ``stdlib`` and ``lm`` are
``code`` and ``docs``, its ``ngram`` table a generated task):

* ``code``: the standard library's Python modules (tests excluded).
* ``docs``: the interpreter's documentation topics (``pydoc_data``), English prose.
* ``records``: the Unicode Character Database as ``code;name;category;bidi;decomposition`` rows.

Held-out:

* ``headers``: torch's ``c10`` C++ headers (the device back-ends' folders left out: a CUDA and a
  CPU build of one version ship the same core headers).
* ``licences``: the licence texts the six packages ship in their ``dist-info`` (legal prose),
  each distinct text once.
* ``docstrings``: numpy's and scipy's docstrings, read with ``ast`` (never imported): technical
  English in numpydoc sections, with examples.
* ``numbers``: scipy's test data tables (``.txt``, ``.dat``, ``.arff``, ``.csv`` under a
  ``data`` folder): numeric matrices in scientific notation, NIST ANOVA sets, ARFF files.
* ``stubs``: numpy's type stubs (``.pyi``, tests excluded): Python declarations with overloads
  and no bodies.

Held-out, registered later (2026-12), after the five above had informed a question (how the
later layers' heads are chosen): a question the first five shaped is judged on these.

* ``operators``: torch's operator declarations, the YAML files ``torchgen`` ships
  (``native_functions.yaml``, ``derivatives.yaml``, ...): signatures, dispatch tables, formulas.
* ``wrappers``: scipy's Cython sources (``.pxd``, ``.pyx``, ``.pxi``; tests excluded): the
  generated BLAS, LAPACK and special-function wrappers.
* ``cmake``: torch's CMake package files (``share/cmake``): build scripts.
* ``graphbreaks``: torch's registry of ``torch.compile`` graph breaks (JSON): keys, English
  explanations and hints.

Held-out, the third set (registered 2026-12-06, before any of their results), after the nine
above had informed how the later layers are checked: a question those shaped is judged on these.

* ``kernels``: the CUDA headers (``.cuh``) torch ships under ``include``: device kernels and
  their templates.
* ``capi``: numpy's C headers (``.h``): the C API's macros, structs and declarations.
* ``hexfloats``: numpy's validation sets for its math functions
  (``umath-validation-set-*.csv``): float bit patterns in hex, one input and output per row.
* ``stylesheets``: sympy's MathML stylesheets (XSLT; sympy is a dependency of torch, so it is on
  every machine torch is): XML templates for MathML to TeX and to content markup, the
  ``simple_`` near-copy left out.

The protocol (``require_role``, ``split_by_role``): a rule fitted on development data is
judged on held-out data only, and a report keeps the two sets' rows apart.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import sysconfig
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from common.errors import Problem, TransformerAllocError, UsageError
from userdata.errors import DataError

Role = Literal["development", "held-out"]
DEVELOPMENT: Role = "development"
HELD_OUT: Role = "held-out"
ROLES: tuple[Role, ...] = (DEVELOPMENT, HELD_OUT)
# The packages a bare GPU box has beside the interpreter: the held-out corpora's only sources.
PACKAGES = ("numpy", "pyyaml", "safetensors", "scipy", "torch", "transformers")
Row = TypeVar("Row")


class ProtocolError(TransformerAllocError):
    """A development corpus where only held-out ones may judge a rule."""


@dataclass(frozen=True)
class Corpus:
    """One registered corpus: its name, its role, what its bytes are and where they come from,
    and ``write(folder, megabytes)``, which writes it there (at most ``megabytes``) and returns
    the folder to read (``DataSpec(str(folder))``)."""

    name: str
    role: Role
    kind: str
    origin: str
    write: Callable[[Path, float], Path]


# --- writing --------------------------------------------------------------------------------------


def write_text(folder: Path, name: str, text: str, megabytes: float) -> Path:
    """``text`` as UTF-8, cut to ``megabytes``, in ``folder/name`` (rewritten only when its
    bytes differ); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")[:int(megabytes * 1e6)]
    target = folder / name
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)
    return folder


def joined(texts: Iterable[str], megabytes: float) -> str:
    """``texts`` joined by blank lines, stopping once ``megabytes`` of UTF-8 are reached (the
    sources are read lazily: a corpus reads only the files it keeps)."""
    kept, size = [], 0
    for text in texts:
        kept.append(text)
        size += len(text.encode("utf-8")) + 2
        if size >= megabytes * 1e6:
            break
    return "\n\n".join(kept)


def package_dir(name: str) -> Path:
    """The folder of the installed package ``name``, found without importing it.

    Raises:
        DataError: the package is not installed.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"corpus source {name!r}: the package is not installed (a held-out "
                        f"corpus reads the files it ships)")
    return Path(next(iter(spec.submodule_search_locations)))


def sorted_files(root: Path, suffixes: Sequence[str], skip: Iterable[str] = ()) -> list[Path]:
    """The files under ``root`` ending in one of ``suffixes``, sorted by their path relative to
    ``root``, none inside a folder named in ``skip``."""
    skipped = set(skip)
    return sorted((p for p in root.rglob("*") if p.suffix in suffixes and p.is_file()
                   and not skipped & set(p.relative_to(root).parts[:-1])),
                  key=lambda p: p.relative_to(root).parts)


def plain_text(path: Path) -> str | None:
    """The file as text, or None when it is not plain UTF-8 text (a binary data file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    return None if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", text) else text


# --- development ----------------------------------------------------------------------------------


def write_code(folder: Path, megabytes: float) -> Path:
    """The standard library's modules (tests excluded), one ``.txt`` per module, in sorted
    order, until ``megabytes`` are written. Files of an earlier, larger corpus in ``folder``
    are removed, so its size is always this one."""
    folder.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    written, kept = 0, set()
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).parts
        if any(p in ("test", "tests", "idle_test", "site-packages") for p in parts):
            continue
        target = folder / ("__".join(parts)[:-3] + ".txt")
        if not target.exists():
            target.write_text(path.read_text(encoding="utf-8", errors="replace"))
        kept.add(target.name)
        written += target.stat().st_size
        if written >= megabytes * 1e6:
            break
    for stale in folder.glob("*.txt"):
        if stale.name not in kept:
            stale.unlink()
    return folder


def write_docs(folder: Path, megabytes: float) -> Path:
    """The interpreter's documentation topics (``pydoc_data``), English prose."""
    from pydoc_data.topics import topics

    return write_text(folder, "topics.txt", "\n\n".join(topics[k] for k in sorted(topics)),
                      megabytes)


def unicode_records() -> str:
    """One row per named code point: ``code;name;category;bidi;decomposition``. Names the
    database derives by rule (``CJK UNIFIED IDEOGRAPH-4E00``, the 11,172 ``HANGUL SYLLABLE``
    names) are left out: they are a formula, not data."""
    rows = []
    for cp in range(sys.maxunicode + 1):
        name = unicodedata.name(chr(cp), "")
        if not name or name.endswith(f"-{cp:04X}") or name.startswith("HANGUL SYLLABLE "):
            continue
        ch = chr(cp)
        rows.append(f"{cp:04X};{name};{unicodedata.category(ch)};"
                    f"{unicodedata.bidirectional(ch)};{unicodedata.decomposition(ch)}\n")
    return "".join(rows)


def write_records(folder: Path, megabytes: float) -> Path:
    return write_text(folder, "unicode.txt", unicode_records(), megabytes)


# --- held-out -------------------------------------------------------------------------------------


# c10's folders for one device back-end each: present or not depending on the build.
DEVICE_FOLDERS = ("cuda", "hip", "metal", "mobile", "mps", "mtia", "test", "xpu")


def write_headers(folder: Path, megabytes: float) -> Path:
    """torch's ``c10`` headers (``include/c10``), device back-ends and the generated
    ``cmake_macros.h`` left out."""
    root = package_dir("torch") / "include" / "c10"
    files = [p for p in sorted_files(root, (".h",), DEVICE_FOLDERS)
             if p.name != "cmake_macros.h"]
    return write_text(folder, "headers.txt", joined((p.read_text(encoding="utf-8",
                                                                 errors="replace")
                                                     for p in files), megabytes), megabytes)


LICENCE_FILE = re.compile(r"(licen[cs]e|copying|notice)", re.IGNORECASE)


def licence_texts() -> Iterator[str]:
    """Each distinct licence text of ``PACKAGES``' distributions, by package then path."""
    seen = set()
    for package in PACKAGES:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            raise DataError(f"corpus source {package!r}: the distribution is not installed "
                            "(the licences corpus reads its licence files)") from None
        for entry in sorted(dist.files or [], key=str):
            if ".dist-info" in str(entry) and LICENCE_FILE.search(Path(str(entry)).name):
                text = plain_text(Path(str(dist.locate_file(entry))))
                if text and text not in seen:
                    seen.add(text)
                    yield text


def write_licences(folder: Path, megabytes: float) -> Path:
    return write_text(folder, "licences.txt", joined(licence_texts(), megabytes), megabytes)


def docstrings(path: Path) -> Iterator[str]:
    """The docstrings of a Python file's module, classes and functions, in source order, read
    with ``ast`` (nothing is imported)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = sorted((n for n in ast.walk(tree) if isinstance(n, kinds)),
                   key=lambda n: getattr(n, "lineno", 0))
    for node in nodes:
        text = ast.get_docstring(node, clean=True)
        if text:
            yield text


def write_docstrings(folder: Path, megabytes: float) -> Path:
    """numpy's then scipy's docstrings, file by sorted file (tests excluded)."""
    files = [p for name in ("numpy", "scipy")
             for p in sorted_files(package_dir(name), (".py",), ("tests", "testing"))]
    texts = (text for p in files for text in docstrings(p))
    return write_text(folder, "docstrings.txt", joined(texts, megabytes), megabytes)


def write_numbers(folder: Path, megabytes: float) -> Path:
    """scipy's test data tables that are plain text, by sorted path."""
    root = package_dir("scipy")
    files = [p for p in sorted_files(root, (".txt", ".dat", ".arff", ".csv"))
             if "data" in p.relative_to(root).parts[:-1]]
    texts = (text for p in files if (text := plain_text(p)))
    return write_text(folder, "numbers.txt", joined(texts, megabytes), megabytes)


def write_files(folder: Path, name: str, files: Iterable[Path], megabytes: float) -> Path:
    """The UTF-8 ``files`` joined in their order (read lazily), as ``folder/name``."""
    texts = (p.read_text(encoding="utf-8") for p in files)
    return write_text(folder, name, joined(texts, megabytes), megabytes)


def write_stubs(folder: Path, megabytes: float) -> Path:
    """numpy's type stubs (``.pyi``, tests excluded), by sorted path."""
    return write_files(folder, "stubs.txt",
                       sorted_files(package_dir("numpy"), (".pyi",), ("tests",)), megabytes)


def write_operators(folder: Path, megabytes: float) -> Path:
    """torchgen's packaged YAML declarations, by sorted path."""
    return write_files(folder, "operators.txt",
                       sorted_files(package_dir("torchgen") / "packaged", (".yaml",)), megabytes)


def write_wrappers(folder: Path, megabytes: float) -> Path:
    """scipy's Cython sources (tests excluded), by sorted path."""
    files = sorted_files(package_dir("scipy"), (".pxd", ".pyx", ".pxi"), ("tests",))
    return write_files(folder, "wrappers.txt", files, megabytes)


def write_cmake(folder: Path, megabytes: float) -> Path:
    """torch's CMake package files (``share/cmake``), by sorted path."""
    files = sorted_files(package_dir("torch") / "share" / "cmake", (".cmake",))
    return write_files(folder, "cmake.txt", files, megabytes)


def write_graph_breaks(folder: Path, megabytes: float) -> Path:
    """torch's graph-break registry (``_dynamo/graph_break_registry.json``), as shipped."""
    path = package_dir("torch") / "_dynamo" / "graph_break_registry.json"
    if not path.is_file():
        raise DataError(f"corpus source {str(path)!r}: not in this torch (the graphbreaks "
                        "corpus reads it)")
    return write_text(folder, "graphbreaks.txt", path.read_text(encoding="utf-8"), megabytes)


def write_kernels(folder: Path, megabytes: float) -> Path:
    """torch's CUDA headers (``include/**/*.cuh``), by sorted path."""
    files = sorted_files(package_dir("torch") / "include", (".cuh",))
    return write_files(folder, "kernels.txt", files, megabytes)


def write_capi(folder: Path, megabytes: float) -> Path:
    """numpy's C headers (``.h``), by sorted path."""
    return write_files(folder, "capi.txt", sorted_files(package_dir("numpy"), (".h",)),
                       megabytes)


def write_hexfloats(folder: Path, megabytes: float) -> Path:
    """numpy's ``umath-validation-set-*.csv`` files, by sorted path."""
    files = [p for p in sorted_files(package_dir("numpy"), (".csv",))
             if p.name.startswith("umath-validation-set-")]
    return write_files(folder, "hexfloats.txt", files, megabytes)


def write_stylesheets(folder: Path, megabytes: float) -> Path:
    """sympy's MathML stylesheets (``.xsl``), by sorted path; ``simple_mmlctop.xsl`` is
    ``mmlctop.xsl`` less a few bytes, so it is left out (a copy would put the validation
    windows' text in the training windows)."""
    files = [p for p in sorted_files(package_dir("sympy"), (".xsl",))
             if not p.name.startswith("simple_")]
    return write_files(folder, "stylesheets.txt", files, megabytes)


# --- the registry ---------------------------------------------------------------------------------


CORPORA: dict[str, Corpus] = {c.name: c for c in (
    Corpus("code", DEVELOPMENT, "Python code", "the standard library's modules", write_code),
    Corpus("docs", DEVELOPMENT, "English prose", "pydoc_data's documentation topics",
           write_docs),
    Corpus("records", DEVELOPMENT, "tabular records", "the Unicode Character Database",
           write_records),
    Corpus("headers", HELD_OUT, "C++ headers", "torch/include/c10", write_headers),
    Corpus("licences", HELD_OUT, "legal prose", "the packages' dist-info licence files",
           write_licences),
    Corpus("docstrings", HELD_OUT, "technical English (numpydoc)",
           "numpy's and scipy's docstrings", write_docstrings),
    Corpus("numbers", HELD_OUT, "numeric tables", "scipy's test data files", write_numbers),
    Corpus("stubs", HELD_OUT, "Python type declarations", "numpy's .pyi stubs", write_stubs),
    Corpus("operators", HELD_OUT, "operator declarations (YAML)", "torchgen's packaged YAML",
           write_operators),
    Corpus("wrappers", HELD_OUT, "Cython wrappers", "scipy's .pxd, .pyx and .pxi files",
           write_wrappers),
    Corpus("cmake", HELD_OUT, "build scripts (CMake)", "torch's share/cmake", write_cmake),
    Corpus("graphbreaks", HELD_OUT, "JSON records", "torch's graph-break registry",
           write_graph_breaks),
    Corpus("kernels", HELD_OUT, "CUDA C++ headers", "torch's .cuh headers", write_kernels),
    Corpus("capi", HELD_OUT, "C API headers", "numpy's .h headers", write_capi),
    Corpus("hexfloats", HELD_OUT, "hex float tables (CSV)", "numpy's umath validation sets",
           write_hexfloats),
    Corpus("stylesheets", HELD_OUT, "XSLT stylesheets (XML)", "sympy's MathML stylesheets",
           write_stylesheets),
)}


def corpus(name: str) -> Corpus:
    """The registered corpus ``name``.

    Raises:
        UsageError: no such corpus (the line lists the registered names).
    """
    if name not in CORPORA:
        raise UsageError.of([Problem("corpus", repr(name), "not a registered corpus; choose "
                                     f"from {', '.join(CORPORA)}")])
    return CORPORA[name]


def names(role: Role) -> tuple[str, ...]:
    """The registered corpora of ``role``, in the registry's order."""
    return tuple(name for name, c in CORPORA.items() if c.role == role)


# --- the protocol ---------------------------------------------------------------------------------


def require_role(rows: Sequence[Row], role: Role, role_of: Callable[[Row], Role],
                 name_of: Callable[[Row], str]) -> Sequence[Row]:
    """``rows`` unchanged when every one is a corpus of ``role``: what one set's summary may
    be computed from (a held-out verdict from held-out corpora only).

    Raises:
        ProtocolError: a row of the other role; for a held-out verdict, a development corpus
            (the rules were tuned on it).
    """
    for row in rows:
        if role_of(row) != role:
            rule = ("a rule fitted on development data is judged on held-out corpora only"
                    if role == HELD_OUT else "each set is summarised on its own")
            raise ProtocolError(f"corpus {name_of(row)!r} is a {role_of(row)} corpus, in the "
                                f"{role} set: {rule}")
    return rows


def split_by_role(rows: Sequence[Row], role_of: Callable[[Row], Role]
                  ) -> dict[Role, tuple[Row, ...]]:
    """``rows`` by role, development then held-out, each in its order: a report states each
    set on its own and never pools them."""
    return {role: tuple(r for r in rows if role_of(r) == role) for role in ROLES}
