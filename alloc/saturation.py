"""Later layers: shrink query/key dimensions where softmax saturates (docs/theory.md §4).

For logits ``z in R^N`` bounded by ``R``, the softmax Jacobian ``J = diag(s) - s s^T`` satisfies
``||J||_2 <= 2 max_i s_i (1 - s_i) <= 2 e^{2R} / N`` (Gershgorin, ``s_i <= e^{2R}/N``). A student
head whose query-key map has rank ``r`` moves the logits by at most the tail ``sum_{i>r} sigma_i``
of the teacher's singular values, so

    attention error(r) <= (2 e^{2R} / N) * sum_{i>r} sigma_i.

The rule keeps a head's count and value dimension and gives it the smallest aligned ``qk_dim = r``
with ``error(r) <= tolerance``. Longer sequences (larger ``N``) shrink the Jacobian, hence ``r``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from arch import KernelError, read_values

SIGMA_FORMS = "power:BETA or file:PATH"


def jacobian_bound(seq_len: int, logit_bound: float) -> float:
    """Upper bound ``min(1/2, 2 e^{2R} / N)`` on the norm of the softmax Jacobian (spectral, and
    the max row sum): Gershgorin gives ``2 max_i s_i (1 - s_i)``, at most 1/2 for any logits and
    at most ``2 e^{2R} / N`` when they are bounded by ``R`` (docs/theory.md §4)."""
    if 2.0 * logit_bound > math.log(seq_len / 4.0):  # the exponential bound exceeds 1/2
        return 0.5
    return 2.0 * math.exp(2.0 * logit_bound) / seq_len


def power_spectrum(qk_dim: int, beta: float, logit_bound: float) -> np.ndarray:
    """``sigma_i = sigma_1 i^{-beta}``, ``i = 1..qk_dim``, normalised so ``sum sigma_i = R``."""
    sigma = np.arange(1, qk_dim + 1, dtype=np.float64) ** -beta
    return logit_bound * sigma / sigma.sum()


def parse_spectrum(spec: str) -> tuple[str, float | np.ndarray]:
    """Parse ``power:BETA`` (BETA >= 0) or ``file:PATH`` (one singular value per line).

    Returns:
        ``("power", beta)`` or ``("file", sigma)`` with ``sigma`` sorted in decreasing order.

    Raises:
        KernelError: unknown form, bad exponent, malformed or negative file values.
    """
    name, _, arg = spec.partition(":")
    if name == "power":
        try:
            beta = float(arg)
        except ValueError:
            beta = -1.0
        if not math.isfinite(beta) or beta < 0:
            raise KernelError(f"spectrum {spec!r}: exponent {arg!r} must be a number >= 0")
        return "power", beta
    if name == "file":
        values = np.array(read_values(Path(arg), "spectrum file"))
        if (values < 0).any():
            raise KernelError(f"spectrum file {arg!r}: singular values must be >= 0")
        return "file", np.sort(values)[::-1]
    raise KernelError(f"unknown spectrum {spec!r}: use {SIGMA_FORMS}")


def teacher_spectrum(spectrum: tuple[str, float | np.ndarray], qk_dim: int,
                     logit_bound: float) -> np.ndarray:
    """Singular values of a teacher head of dimension ``qk_dim`` (a file is cut or zero-padded)."""
    kind, value = spectrum
    if kind == "power":
        return power_spectrum(qk_dim, float(value), logit_bound)
    sigma = np.zeros(qk_dim)
    given = np.asarray(value)[:qk_dim]
    sigma[: len(given)] = given
    return sigma


def attention_error(sigma: np.ndarray, rank: int, seq_len: int, logit_bound: float) -> float:
    """Bound on the attention error of a rank-``rank`` student of a head with spectrum ``sigma``."""
    return jacobian_bound(seq_len, logit_bound) * float(sigma[rank:].sum())


def reduced_qk_dim(sigma: np.ndarray, seq_len: int, logit_bound: float, tolerance: float,
                   align: int) -> int:
    """Smallest ``r`` (a multiple of ``align``, or the full dim) with ``error(r) <= tolerance``."""
    full = len(sigma)
    # tail[r] = sum_{i > r} sigma_i for r = 0..full
    tail = np.concatenate([np.cumsum(sigma[::-1])[::-1], [0.0]])
    error = jacobian_bound(seq_len, logit_bound) * tail
    for r in range(align, full, align):
        if error[r] <= tolerance:
            return r
    return full
