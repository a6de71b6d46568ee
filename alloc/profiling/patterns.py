"""Later layers' head counts from the attention patterns a pilot uses (docs/theory.md §4.1).

A head computes one attention distribution per query. A later layer that must look in ``P``
different ways (the previous token, the start of the line, the last occurrence of this byte...)
needs at least ``P`` heads: two patterns sharing a head are averaged into one. Heads beyond ``P``
only copy a pattern, and split the width into narrower heads. So the rule gives a later layer
as many heads as the patterns its pilot's heads use, measured as the **effective number of
distinct patterns**: the participation ratio of the heads' similarity matrix

    S_ij = mean over windows and queries t of  cos(a_i[t, :], a_j[t, :])    (a: attention rows)
    P    = (trace S)^2 / ||S||_F^2  =  (sum of eigenvalues)^2 / sum of squared eigenvalues

``P`` is 1 when every head attends alike and ``H`` when no two heads overlap; heads in ``P``
groups of equal size, patterns identical within a group and disjoint across, give exactly ``P``.
No torch: ``workers.pilot`` measures ``S``.
"""

from __future__ import annotations

import math

import numpy as np

from alloc.profiling.spectra import participation_ratio


def distinct_patterns(similarity: np.ndarray) -> float:
    """``P`` of a ``(H, H)`` head-similarity matrix (symmetric, PSD, unit diagonal)."""
    s = np.asarray(similarity, dtype=np.float64)
    eig = np.linalg.eigvalsh((s + s.T) / 2)
    return participation_ratio(np.clip(eig, 0.0, None)[::-1])


def head_counts(width: int, align: int, multiple: int = 1) -> list[int]:
    """Head counts a layer of ``width`` can have: equal heads of an aligned dimension, the count
    a multiple of ``multiple`` (its key/value heads)."""
    return [c for c in range(multiple, width + 1, multiple)
            if width % c == 0 and (width // c) % align == 0]


def later_head_count(patterns: float, width: int, align: int, multiple: int = 1) -> int:
    """The rule: the allowed count nearest ``patterns`` on a log scale (ties: more heads, since
    merging two patterns loses one while an extra head only narrows the others).

    Raises:
        ValueError: no count fits ``width`` at ``align`` (the settings' checks prevent it).
    """
    counts = head_counts(width, align, multiple)
    if not counts:
        raise ValueError(f"no head count of aligned dimension fills width {width}")
    target = math.log(max(patterns, 1.0))
    return min(counts, key=lambda c: (abs(math.log(c) - target), -c))
