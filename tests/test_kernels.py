"""Kernel specs and kernel files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arch.errors import KernelError
from arch.kernels import parse_kernel


def test_forms() -> None:
    assert parse_kernel("ngram:4", 6).tolist() == [1, 1, 1, 1, 0, 0]
    np.testing.assert_allclose(parse_kernel("exp:0.5", 3), np.exp(-0.5 * np.arange(1, 4)))
    np.testing.assert_allclose(parse_kernel("poly:2", 3), [1, 1 / 4, 1 / 9])


def test_file_kernel(tmp_path: Path) -> None:
    path = tmp_path / "k.txt"
    path.write_text("# weights per offset\n0.5\n\n-2  # negative is fine\n1e-1\n")
    assert parse_kernel(f"file:{path}", 5).tolist() == [0.5, -2, 0.1, 0, 0]
    assert parse_kernel(str(path), 2).tolist() == [0.5, -2]  # bare path; extra lines ignored


@pytest.mark.parametrize(("spec", "message"), [
    ("gauss:1", "unknown kernel 'gauss:1'"),
    ("ngram:0", "must be an integer >= 1"),
    ("ngram:2.5", "must be an integer >= 1"),
    ("exp:-1", "must be a number >= 0"),
    ("poly:abc", "must be a number >= 0"),
    ("file:/nonexistent/k.txt", "cannot read"),
])
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(KernelError, match=message):
        parse_kernel(spec, 8)


@pytest.mark.parametrize(("text", "message"), [
    ("1\nabc\n", "line 2: 'abc' is not a number"),
    ("1\nnan\n", "line 2: 'nan' must be finite"),
    ("# nothing\n\n", "needs at least one non-zero value"),
    ("0\n0\n", "needs at least one non-zero value"),
])
def test_malformed_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "k.txt"
    path.write_text(text)
    with pytest.raises(KernelError, match=message):
        parse_kernel(f"file:{path}", 8)
