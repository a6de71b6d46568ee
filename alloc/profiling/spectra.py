"""Summaries of a spectrum (docs/theory.md §9): how many directions hold a share of the variance,
how many it effectively spreads over, and where a signal stands above its floor. One owner for
the data statistics (``alloc.profiling.datastats``: the PMI matrix, a vector covariance) and the
pilot (``alloc.profiling.pilot``: its first layer's input covariance)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ENERGY = 0.9  # the input dimension keeps this share of the variance (squared singular values)


def participation_ratio(eigenvalues: Sequence[float] | np.ndarray) -> float:
    """``(sum l)^2 / sum l^2``: how many directions the variance effectively spreads over."""
    eig = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0, None)
    return float(eig.sum() ** 2 / (eig ** 2).sum()) if eig.any() else 0.0


def variance_rank(eigenvalues: Sequence[float] | np.ndarray, share: float) -> int:
    """Fewest of the (decreasing) eigenvalues whose sum reaches ``share`` of the total; of
    singular values ``sigma``, ``variance_rank(sigma ** 2, share)`` is the rank at that energy."""
    eig = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0, None)
    total = np.cumsum(eig)
    if not total.size or total[-1] <= 0:
        return 0
    return int(np.searchsorted(total, share * total[-1] * (1 - 1e-12)) + 1)


def signal_dim(eigenvalues: Sequence[float] | np.ndarray, share: float) -> int:
    """Directions before the spectrum's largest relative drop ``l_i / l_(i+1)`` among those
    holding ``share`` of the variance: the dimension of a signal standing above a floor."""
    eig = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0, None)
    top = variance_rank(eig, share)
    if top < 1 or len(eig) < 2:
        return top
    ratios = eig[:top] / np.maximum(eig[1:top + 1], 1e-300 * eig[0])
    return int(np.argmax(ratios) + 1)
