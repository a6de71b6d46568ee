"""A package's public names, loaded on first use from the one list that names them: the
package's ``__init__.pyi`` stub (the pattern of Scientific Python's ``lazy_loader``), which
type checkers read as the package's interface and ``public_names`` reads at run time. So each
name is written once, ``import alloc`` stays light (no SciPy, no torch) and a command's
``--help`` loads only what it names. Our own few lines rather than ``lazy_loader`` itself: the
bare GPU machines that run ``bench.gpu`` have no package registry to install it from.

Each line of the stub is ``from .module import name as name`` (a name from a module of the
package) or ``from . import sub as sub`` (a public submodule)::

    __getattr__, __dir__, __all__ = public_names(__name__, __file__)
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def stub_names(stub: Path) -> dict[str, str]:
    """Each public name of a package's stub -> the module it comes from, relative to the
    package (``""``: the name is a submodule).

    Raises:
        ValueError: a line that is not a relative ``from . import`` (or a star, or a name
            bound under another name: the stub would then say what run time does not).
    """
    where: dict[str, str] = {}
    for node in ast.parse(stub.read_text(), str(stub)).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if not (isinstance(node, ast.ImportFrom) and node.level == 1):
            raise ValueError(f"{stub}:{node.lineno}: only 'from .module import name as name'")
        for alias in node.names:
            if alias.asname != alias.name:
                raise ValueError(f"{stub}:{node.lineno}: {alias.name} must be re-exported "
                                 f"as itself ('{alias.name} as {alias.name}')")
            where[alias.name] = node.module or ""
    return where


def public_names(package: str, init_file: str
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` from its ``__init__.pyi``
    beside ``init_file``: a name is imported from its module the first time it is asked for
    (PEP 562)."""
    where = stub_names(Path(init_file).with_suffix(".pyi"))

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where[name]
        if not module:  # a public submodule (Python binds it on the package as it loads)
            return importlib.import_module(f"{package}.{name}")
        # read from the module at each use, never copied onto the package: the module's own
        # attribute stays the one truth (a test's monkeypatch of it is seen)
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__, sorted(where)
