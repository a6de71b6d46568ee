"""A trained model's query-key heads as matrices: ``HeadMap`` (one query head's query map and
the key map of the key/value head it reads, biases folded in, RoPE frequencies attached) and
``head_maps(model)``, shared by the measurement (``workers.compression.measure``) and the students
(``workers.compression.students``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from alloc.compression import CompressionError
from workers.models.attention import FrozenQKAttention, MultiHeadAttention
from workers.models.model import Model


@dataclass(frozen=True)
class HeadMap:
    """One query head's query map and its key/value head's key map, biases folded in: logits
    are ``(x A)(y B)^T`` (after RoPE's rotations, with ``freqs``) for ``x = [input, 1]`` (the
    ``1`` only with biases); ``A, B`` are ``(d [+ 1], qk_dim)``. ``kv`` is the key/value head
    (within the group) the query head reads."""

    layer: int
    group: int
    head: int
    a: np.ndarray
    b: np.ndarray
    kv: int = 0
    freqs: np.ndarray | None = None  # RoPE: (qk_dim / 2,) frequencies of the key/value head

    @property
    def matrix(self) -> np.ndarray:
        """``M = A B^T / sqrt(qk_dim)``, the scaled bilinear map of the logits (without RoPE)."""
        return self.a @ self.b.T / math.sqrt(self.a.shape[1])

    def singular_values(self) -> np.ndarray:
        """The spectrum of ``M``.

        Raises:
            CompressionError: a RoPE head, whose logits are not ``x M y^T``: RoPE turns queries
                and keys by their positions between the two maps (see ``pair_norms``).
        """
        if self.freqs is not None:
            raise CompressionError("positional 'rope': a RoPE head's query-key map depends on "
                                   "the positions, so no single matrix's SVD describes it")
        return np.linalg.svd(self.matrix, compute_uv=False)[: self.a.shape[1]]

    def pair_norms(self) -> np.ndarray:
        """RoPE: per frequency pair ``i`` (dims ``i`` and ``i + qk/2``), ``||A_i|| ||B_i|| /
        sqrt(qk_dim)`` (spectral norms of the ``(d, 2)`` blocks), which bounds the pair's
        logit term by ``|x| |y|`` times it whatever the rotation (docs/theory.md §10.2)."""
        half = self.a.shape[1] // 2

        def block_norm(m: np.ndarray, i: int) -> float:
            return float(np.linalg.norm(m[:, [i, i + half]], ord=2))

        return np.array([block_norm(self.a, i) * block_norm(self.b, i) for i in range(half)]
                        ) / math.sqrt(self.a.shape[1])


def head_maps(model: Model) -> list[HeadMap]:
    """Every query-key head of the model (mhsa and frozen_qk layers; MSSA and MixiT heads have
    no separate query and key maps), RoPE heads with their frequencies."""
    return [m for i in range(model.arch.n_layers) for m in layer_maps(model.block(i).attn, i)]


def layer_maps(attn: object, i: int) -> list[HeadMap]:
    """The query-key heads of layer ``i``'s attention module ``attn`` (none for MSSA and
    MixiT)."""
    if not isinstance(attn, MultiHeadAttention):
        return []
    linear = attn.qk if isinstance(attn, FrozenQKAttention) else attn.qkv
    weight = linear.weight.detach().double()
    bias = None if linear.bias is None else linear.bias.detach().double()
    out = []
    for j, g in enumerate(attn.layout.heads):
        freqs = attn.frequencies(j).detach().double().numpy() if attn.rope else None
        for h in range(g.count):
            kv = attn.layout.kv_head(j, h)
            rows, krows = attn.layout.query_rows(j, h), attn.layout.key_rows(j, kv)
            a, b = weight[rows].T, weight[krows].T  # (d, qk_dim)
            if bias is not None:
                a, b = torch.cat([a, bias[rows][None]]), torch.cat([b, bias[krows][None]])
            out.append(HeadMap(i, j, h, a.numpy(), b.numpy(), kv,
                               None if freqs is None else freqs[kv]))
    return out
