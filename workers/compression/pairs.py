"""RoPE heads' frequency pairs ranked on a sample (docs/theory.md §10.2): ``rank_pairs`` orders
one key/value head's pairs by what the logits receive from each, and for every query head
reading it measures, in one pass over its attention maps, the largest attention-weight change
of keeping each candidate number of leading pairs, its largest |logit| and its mean attention
entropy (the statistics ``workers.compression.recording`` would otherwise compute from a second
copy of the same maps).

The maps are formed a block of query rows at a time against the keys those rows may see: a
block fits in cache, and a causal head skips the half of its (T, T) map that is hidden.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from alloc.compression import HeadStats
from workers.chunks import CHUNK_BYTES, window_chunks
from workers.compression.heads import HeadMap
from workers.models.attention import rotate

ROW_BLOCK = 32  # query rows whose attention maps are formed at once (a few blocks fit in cache)


@dataclass(frozen=True)
class PairRanking:
    """One RoPE key/value head: its frequency pairs in the order a student keeps them (most
    contributing first), and per query head reading it the pair bounds in that order and, with
    a sample, the measured error of keeping each candidate number of dims and the head's
    statistics on the sample."""

    order: tuple[int, ...]
    bounds: dict[int, np.ndarray]  # query head -> (qk/2,) pair_norms in ``order``
    errors: dict[int, dict[int, float]] | None = None  # query head -> rank -> error
    stats: dict[int, HeadStats] | None = None  # query head -> its logit bound and entropy


def _turned(head: HeadMap, x: Tensor, side: str) -> Tensor:
    """The head's queries (``side="a"``) or keys (``"b"``) after RoPE on inputs ``x``
    (B, T, d), in ``x``'s dtype: (B, T, 2, qk/2), pair ``i`` at ``[..., :, i]``. The query
    heads reading one key/value head share its keys: computed once for them."""
    assert head.freqs is not None
    freqs = torch.from_numpy(head.freqs)[None].to(x.dtype)
    rows = rotate((x @ torch.from_numpy(getattr(head, side)).to(x.dtype))[:, None], freqs)[:, 0]
    return rows.unflatten(-1, (2, rows.shape[-1] // 2))  # (B, T, qk) -> (B, T, 2, qk/2)


def _project(heads: Sequence[HeadMap], x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The key/value head's keys and each query head's queries on ``x``, turned, in float32."""
    return _turned(heads[0], x.float(), "b"), [_turned(h, x.float(), "a") for h in heads]


def _pair_scores(q: Tensor, k: Tensor, causal: bool) -> Tensor:
    """(qk/2,) per pair ``p``: the sum over windows and allowed positions ``j <= i`` of the
    squared logit term ``(q_i . k_j)^2`` (unscaled; q, k: (B, T, 2, qk/2)). A pair's term is a
    rank-2 map, so ``sum_j (q_i . k_j)^2 = q_i^T (sum_j k_j k_j^T) q_i`` with a running sum of
    2 x 2 outer products: O(T) per pair, no (T, T) map formed."""
    outer = k[:, :, :, None] * k[:, :, None, :]  # (B, T, 2, 2, qk/2): k_j k_j^T per pair
    running = outer.cumsum(dim=1) if causal else outer.sum(dim=1, keepdim=True)
    return torch.einsum("btcp,btcdp,btdp->p", q, running, q)


def _in_order(rows: Tensor, order: Tensor) -> Tensor:
    """Turned rows (B, T, 2, P) -> (B, T, 2P) with pair ``order[i]``'s two dims at columns
    ``2i, 2i + 1``: the leading pairs of the ranking are a slice."""
    return rows.index_select(-1, order).transpose(-1, -2).flatten(-2)


@dataclass
class HeadPass:
    """What one query head's attention maps gave so far: per candidate number of kept pairs
    the largest attention-weight change, the largest |logit|, and the summed normalised
    entropies of the rows with two keys or more, with their count."""

    largest: dict[int, float]
    bound: float = 0.0
    entropy: float = 0.0
    rows: int = 0

    def stats(self) -> HeadStats:
        return HeadStats(self.bound, self.entropy / max(1, self.rows))


def head_pass(q: Tensor, k: Tensor, causal: bool, into: HeadPass) -> None:
    """Add windows ``q`` (scaled), ``k`` (B, T, 2P), pairs in rank order (``_in_order``), to
    ``into``: query rows a block at a time against the keys they may see, the teacher's
    weights from one ``log_softmax`` (its entropy read from the log-probabilities: no
    cancellation in float32), then the kept logits grown by one candidate's segment of pairs in
    place (``baddbmm_``) and compared with them."""
    t = q.shape[1]
    for r0 in range(0, t, ROW_BLOCK):
        r1 = min(t, r0 + ROW_BLOCK)
        keys = r1 if causal else t
        hidden = torch.ones(r1 - r0, keys, dtype=torch.bool).triu(r0 + 1) if causal else None
        mask = torch.zeros(r1 - r0, keys)  # -inf where the query may not see the key
        if hidden is not None:
            mask.masked_fill_(hidden, float("-inf"))
        qb, kb = q[:, r0:r1], k[:, :keys].transpose(1, 2)  # (B, R, 2P), (B, 2P, keys)
        logits = torch.bmm(qb, kb)  # (B, R, keys)
        into.bound = max(into.bound, float(logits.abs().add_(mask).amax()))  # allowed keys
        logits.add_(mask)  # hidden keys -inf
        log_p = torch.log_softmax(logits, dim=-1)
        full = log_p.exp()
        if hidden is not None:  # hidden keys: p = 0 adds nothing (and 0 * -inf is NaN)
            log_p.masked_fill_(hidden, 0.0)
        entropy = -(full * log_p).sum(-1).double()  # (B, R)
        n = torch.arange(r0 + 1, r1 + 1) if causal else torch.full((r1 - r0,), t)
        counted = n >= 2
        into.entropy += float((entropy[:, counted] / n[counted].double().log()).sum())
        into.rows += int(counted.sum()) * q.shape[0]
        _changes(qb, kb, mask, full, into.largest)


def _changes(qb: Tensor, kb: Tensor, mask: Tensor, full: Tensor, largest: dict[int, float]
             ) -> None:
    """Per candidate ``n`` of ``largest``: its largest attention-weight change so far, with
    this block of rows (``full``: the teacher's weights) when only the leading ``n`` pairs are
    kept."""
    logits, done = mask.expand_as(full).clone(), 0  # the leading pairs' terms so far
    for n in largest:  # increasing: ``rank_pairs`` builds it from the sorted candidates
        logits.baddbmm_(qb[..., 2 * done:2 * n], kb[:, 2 * done:2 * n])
        done = n
        change = torch.softmax(logits, dim=-1).sub_(full).abs_().amax()
        largest[n] = max(largest[n], float(change))


@torch.no_grad()
def rank_pairs(heads: Sequence[HeadMap], x: Tensor | None, ranks: Sequence[int],
               causal: bool) -> PairRanking:
    """Rank the frequency pairs of one key/value head (``heads``: the query heads reading it).

    With a sample ``x`` (B, T, d [+ 1]), pairs are ranked by their mean squared logit term
    summed over the query heads (what the logits really receive from each pair, after RoPE;
    ``_pair_scores``), and each candidate rank's error is the largest attention-weight change
    when only its leading pairs are kept (``head_pass``, which also gives each query head's
    statistics); without one, by the summed ``pair_norms``. A chunk of windows at a time
    (memory: a few (windows, rows, T) maps and the chunk's projections).
    """
    bounds = {h.head: h.pair_norms() for h in heads}
    if x is None:
        score = np.sum([bounds[h.head] for h in heads], axis=0)
        order = tuple(int(i) for i in np.argsort(-score, kind="stable"))
        return PairRanking(order, {h: b[list(order)] for h, b in bounds.items()})
    t = x.shape[1]
    pairs = heads[0].a.shape[1] // 2
    # per window: a few (rows, T) maps, or a head's projections and running 2 x 2 sums
    chunks = window_chunks(x, max(4 * 4 * ROW_BLOCK * t, 96 * t * pairs))
    # projections and maps in float32 (an attention weight's change is read to 1e-6, far
    # below any tolerance); the scores summed in float64 (sums of many squares)
    total = torch.zeros(pairs, dtype=torch.float64)
    # the projections are kept for the second pass when they fit a chunk's bytes
    keep = 4 * x.shape[0] * t * 2 * pairs * (len(heads) + 1) <= CHUNK_BYTES
    kept_projections = []
    for chunk in chunks:
        k, qs = _project(heads, chunk)
        for q in qs:
            total += _pair_scores(q.double(), k.double(), causal)
        if keep:
            kept_projections.append((k, qs))
    score = total.numpy()  # the scale is common to every pair: the order does not need it
    order = tuple(int(i) for i in np.argsort(-score, kind="stable"))
    kept = sorted({r // 2 for r in ranks if 0 < r // 2 < pairs})  # all pairs: no error
    passes = {h.head: HeadPass(dict.fromkeys(kept, 0.0)) for h in heads}
    ranked = torch.tensor(order, dtype=torch.long)
    for keys, qs in kept_projections or (_project(heads, chunk) for chunk in chunks):
        k = _in_order(keys, ranked)
        for h, q in zip(heads, qs):
            head_pass(_in_order(q, ranked) / math.sqrt(2 * pairs), k, causal, passes[h.head])
    errors = {head: {r: p.largest.get(r // 2, 0.0) for r in ranks}  # ranks are even
              for head, p in passes.items()}
    return PairRanking(order, {h: b[list(order)] for h, b in bounds.items()}, errors,
                       {head: p.stats() for head, p in passes.items()})


DEROTATION_ROWS = 64  # query rows per window that price un-turning a pair


@torch.no_grad()
def derotation_order(heads: Sequence[HeadMap], x: Tensor, causal: bool) -> tuple[int, ...]:
    """One key/value head's frequency pairs, the one that costs most to leave unturned first
    (docs/theory.md §10.6): a latent part without RoPE computes pair ``p``'s logit term as
    ``q_p . k_p`` where the teacher turns them, ``(R_i q_p) . (R_j k_p)``; the price of that is
    the squared change of the term weighted by the teacher's attention, ``sum A_ij
    (z_p,turned - z_p,unturned)^2 / qk``, summed over the query heads reading it and over
    ``DEROTATION_ROWS`` query rows per window, spread over the window (``x``: (B, T, d [+ 1])).
    A pair that turns slowly over the distances the heads attend across costs little whatever
    its size; MHA2MLA's norm ranking sees only the size."""
    t, pairs = x.shape[1], heads[0].a.shape[1] // 2
    rows = torch.linspace(t // 8, t - 1, min(DEROTATION_ROWS, t)).round().long().unique()
    total = torch.zeros(pairs, dtype=torch.float64)
    scale = 1.0 / math.sqrt(2 * pairs)
    for chunk in window_chunks(x, 4 * 4 * len(rows) * t * (pairs + 2)):
        xf = chunk.float()
        k_turned = _turned(heads[0], xf, "b")  # (B, T, 2, P)
        k_plain = (xf @ torch.from_numpy(heads[0].b).float()).unflatten(-1, (2, pairs))
        for head in heads:
            q_turned = _turned(head, xf, "a")[:, rows]  # (B, R, 2, P)
            q_plain = (xf[:, rows] @ torch.from_numpy(head.a).float()).unflatten(-1, (2, pairs))
            turned = torch.einsum("bicp,bjcp->bpij", q_turned, k_turned) * scale
            plain = torch.einsum("bicp,bjcp->bpij", q_plain, k_plain) * scale
            logits = turned.sum(1)  # (B, R, T): the teacher's
            if causal:
                logits = logits.masked_fill(torch.arange(t)[None, :] > rows[:, None],
                                            float("-inf"))
            weights = torch.softmax(logits, dim=-1)[:, None]  # (B, 1, R, T)
            total += (weights * (turned - plain).square()).sum((0, 2, 3)).double()
    return tuple(int(i) for i in np.argsort(-total.numpy(), kind="stable"))
