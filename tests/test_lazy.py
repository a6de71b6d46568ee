"""``common.lazy``: a lazy package's public names come from its ``__init__.pyi`` alone, each
module is imported only when one of its names is first asked for, and a stub line that would
say what run time does not (a name bound under another name, an absolute import) is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.lazy import stub_names


def make_package(root: Path, stub: str) -> None:
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text(
        "from common.lazy import public_names\n\n"
        "__getattr__, __dir__, __all__ = public_names(__name__, __file__)\n")
    (root / "pkg" / "__init__.pyi").write_text(stub)
    (root / "pkg" / "heavy.py").write_text("import json\nVALUE = 3\n\ndef f() -> int:\n"
                                           "    return VALUE\n")
    (root / "pkg" / "sub.py").write_text("NAME = 'sub'\n")


def test_names_load_on_first_use_from_the_stub(tmp_path: Path) -> None:
    make_package(tmp_path, '"""doc"""\nfrom . import sub as sub\n'
                           "from .heavy import VALUE as VALUE, f as f\n")
    code = ("import sys, pkg\n"
            "assert pkg.__all__ == ['VALUE', 'f', 'sub'] and dir(pkg) == pkg.__all__\n"
            "assert 'pkg.heavy' not in sys.modules\n"
            "assert pkg.f() == 3 and pkg.VALUE == 3 and 'pkg.heavy' in sys.modules\n"
            "assert pkg.sub.NAME == 'sub'\n"
            "try:\n    pkg.missing\nexcept AttributeError as err:\n"
            "    assert \"module 'pkg' has no attribute 'missing'\" in str(err)\n"
            "else:\n    raise SystemExit('no AttributeError')\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60,
                          env={"PYTHONPATH": f"{tmp_path}:{root}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(("line", "rule"), [
    ("from .heavy import VALUE\n", "must be re-exported as itself"),
    ("from .heavy import VALUE as OTHER\n", "must be re-exported as itself"),
    ("from pkg.heavy import VALUE as VALUE\n", "only 'from .module import name as name'"),
    ("import json\n", "only 'from .module import name as name'"),
])
def test_a_stub_line_run_time_would_not_follow_is_refused(tmp_path: Path, line: str,
                                                          rule: str) -> None:
    (tmp_path / "__init__.pyi").write_text(line)
    with pytest.raises(ValueError, match=rule):
        stub_names(tmp_path / "__init__.pyi")
