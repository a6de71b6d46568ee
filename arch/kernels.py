"""Memory kernels ``rho(s)``, ``s = 1..seq_len``, of the target ``y_t = sum_s rho(s) x_{t-s}``
(docs/theory.md §2): part of the vocabulary because the allocator solves for a kernel, the
vector tasks generate data from one and the profiler measures one.

Specs: ``ngram:K`` (1 for ``s <= K``), ``exp:LAMBDA`` (``e^{-lambda s}``),
``poly:P`` (``s^{-p}``), or ``file:PATH`` (also a bare existing path): one value per line for
offsets 1, 2, ...; blank lines and ``#`` comments are skipped, missing offsets are 0, extra
lines are ignored.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from arch.errors import KernelError

KERNEL_FORMS = "ngram:K, exp:LAMBDA, poly:P or file:PATH"
PARAMETRIC = ("ngram", "exp", "poly")


def parse_kernel(spec: str, seq_len: int) -> np.ndarray:
    """Evaluate the kernel ``spec`` at offsets ``1..seq_len``.

    Args:
        spec: kernel spec, see the module docstring.
        seq_len: number of offsets.

    Returns:
        ``rho`` of shape ``(seq_len,)``; ``rho[s - 1]`` is the weight of offset ``s``.

    Raises:
        KernelError: unknown form, bad parameter or malformed file.
    """
    name, sep, arg = spec.partition(":")
    if not sep and Path(spec).is_file():
        name, arg = "file", spec
    if name == "file":
        return _read_kernel_file(Path(arg), seq_len)
    if name in PARAMETRIC:
        return kernel_shape(name, _number(spec, arg, integer=name == "ngram"), seq_len)
    raise KernelError(f"unknown kernel {spec!r}: use {KERNEL_FORMS}")


def kernel_shape(form: str, param: float, seq_len: int) -> np.ndarray:
    """A parametric kernel at offsets ``1..seq_len``: ``ngram`` (1 up to offset K), ``exp``
    (``exp(-lambda s)``) or ``poly`` (``s^-p``); ``param`` already checked."""
    s = np.arange(1, seq_len + 1, dtype=np.float64)
    if form == "ngram":
        return (s <= param).astype(np.float64)
    return np.exp(-param * s) if form == "exp" else s ** -param


def _number(spec: str, arg: str, integer: bool = False) -> float:
    rule = "an integer >= 1" if integer else "a number >= 0"
    try:
        value = float(arg)
    except ValueError:
        raise KernelError(f"kernel {spec!r}: parameter {arg!r} must be {rule}") from None
    bad = not math.isfinite(value) or value < 0 or (integer and (value < 1 or value != int(value)))
    if bad:
        raise KernelError(f"kernel {spec!r}: parameter {arg!r} must be {rule}")
    return value


def read_values(path: Path, what: str) -> list[float]:
    """Numbers of a one-value-per-line file (``#`` comments, blank lines skipped).

    Raises:
        KernelError: unreadable file, a line that is not a finite number, or no non-zero value.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise KernelError(f"{what} {str(path)!r}: cannot read ({err.strerror})") from None
    values: list[float] = []
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise KernelError(f"{what} {str(path)!r} line {number}: {text!r} is not a "
                              "number (one value per line)") from None
        if not math.isfinite(value):
            raise KernelError(f"{what} {str(path)!r} line {number}: {text!r} must be finite")
        values.append(value)
    if not any(values):
        raise KernelError(f"{what} {str(path)!r}: needs at least one non-zero value "
                          "(one value per line)")
    return values


def _read_kernel_file(path: Path, seq_len: int) -> np.ndarray:
    values = read_values(path, "kernel file")
    rho = np.zeros(seq_len)
    n = min(len(values), seq_len)
    rho[:n] = values[:n]
    return rho
