"""Attention kinds (their registry, ``ATTENTION[name](arch, layer, index)``, is
``workers.models.kinds``), each ``forward(x) -> x``.

Every kind maps ``(B, T, d_model) -> (B, T, d_model)`` and supports head groups of different
``qk_dim`` / ``v_dim`` in one layer: one fused projection for the whole layer, then one attention
call per group over all of its heads (no Python loop over heads).

- ``mhsa``      standard multi-head attention (Vaswani et al., 2017).
- ``frozen_qk`` mhsa whose query/key maps stay at initialisation (Dong et al., "Attention
                Retrieves, MLP Memorizes", 2025).
- ``mssa``      multi-head subspace self-attention: one basis ``U_k`` per head is query, key and
                value; output ``[U_1..U_K]`` (tied) or a projection (Wang et al., 2025, AoT).
- ``mixit``     random static attention ``A = I + W - rowmean(W)``, frozen, input independent
                (Dong et al., 2025, eq. 2.3).
- ``latent``    keys and values rebuilt from one cached low-rank latent per token
                (``workers.models.latent``).

The attention function is separate from the projections (``attention_fn`` argument, an
``AttentionFn``): ``sdpa`` by default, or e.g. ``thresholded_softmax(tau)``, the one of Thm 3.1 of
Wang et al. (2025), docs/theory.md §7. (Not the allocator's memory kernel rho(s): that one is
``arch.kernels``.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from arch import ArchConfig, HeadGroup, LayerSpec

# attention_fn(q, k, v, causal, scale) -> out: q, k (B, H, T, qk) and v (B, H, T, v) -> (B, H, T, v)
AttentionFn = Callable[[Tensor, Tensor, Tensor, bool, float], Tensor]
INIT_STD = 0.02


def sdpa(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
    """Softmax attention through PyTorch's fused kernel (keys and values may have fewer heads
    than queries: its grouped-query path)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def thresholded_softmax(tau: float) -> AttentionFn:
    """Thm 3.1 of Wang et al. (2025): ``phi(x) = tau * 1{softmax(x) > tau}`` on unscaled logits
    (the attention under which one MSSA step multiplies every cluster's SNR by exactly
    ``1 + eta*tau``)."""

    def thresholded(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
        a = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return (tau * (a > tau).to(v.dtype)) @ v

    return thresholded


def future_mask(t: int, device: torch.device | str = "cpu") -> Tensor:
    """(t, t) bool, True where a query would see a later key: what causal attention hides."""
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


class LogitRecorder:
    """Softmax attention (what SDPA computes) that keeps every call's logits (B, H, T, T), causal
    entries -inf, or what ``reduce`` makes of them (so a long sample need not keep every T x T
    map): one call per head group and layer, in forward order. For measuring a model."""

    def __init__(self, reduce: Callable[[Tensor], Any] | None = None) -> None:
        self.logits: list[Any] = []
        self.reduce = reduce

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
        z = (q @ k.transpose(-1, -2)).mul_(scale)  # in place: one (B, H, T, T) map held
        if causal:
            t = z.shape[-1]
            z.masked_fill_(future_mask(t, z.device), float("-inf"))
        self.logits.append(z if self.reduce is None else self.reduce(z))
        return torch.softmax(z, dim=-1) @ v


def split_heads(x: Tensor, count: int) -> Tensor:
    """(B, T, count * dim) -> (B, count, T, dim)"""
    b, t, _ = x.shape
    return x.view(b, t, count, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, dim) -> (B, T, H * dim)"""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def rope_frequencies(dim: int, theta: float) -> Tensor:
    """RoPE's ``dim / 2`` angular frequencies, pair ``i`` turning ``theta ** (-2i / dim)`` per
    position (computed as ``transformers`` does, so angles agree to the last bit)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def rope_tables(t: int, inv_freq: Tensor, dtype: torch.dtype, start: int = 0
                ) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``position * inv_freq[h, i]`` for the ``t`` positions from
    ``start``, each (H, t, dim/2) (angles in float32, then ``dtype``); ``inv_freq``: (H, dim/2)."""
    positions = torch.arange(start, start + t, dtype=torch.float32, device=inv_freq.device)
    angles = positions[None, :, None] * inv_freq[:, None, :].float()
    return angles.cos().to(dtype), angles.sin().to(dtype)


def turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in rotate-half form: pair ``i`` of a head is dims ``(i, i + dim/2)``, turned by the
    angles of ``rope_tables``. ``x``: (B, H, T, dim)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rotate(x: Tensor, inv_freq: Tensor, start: int = 0) -> Tensor:
    """``x`` (B, H, T, dim) at positions ``start ..`` turned by RoPE with frequencies
    ``inv_freq`` (H, dim/2)."""
    return turn(x, *rope_tables(x.shape[-2], inv_freq, x.dtype, start))


def expand_kv(x: Tensor, count: int) -> Tensor:
    """(B, kv, T, dim) -> (B, count, T, dim): query head ``h`` reads key/value head
    ``h // (count / kv)``, the layout of grouped-query attention."""
    return x if x.shape[1] == count else x.repeat_interleave(count // x.shape[1], dim=1)


class GroupedAttention(nn.Module):
    """Shared plumbing: head groups, RoPE, the attention function, causality.

    With RoPE, each head group ``j`` holds its frequencies as the buffer ``inv_freq{j}``,
    ``(kv_heads, qk_dim / 2)``, saved with the weights: a model built from an ``ArchConfig``
    has RoPE's standard frequencies in every row, and a compressed student keeps, per key/value
    head, the frequency pairs of the teacher it retained (docs/theory.md §10.2). A checkpoint
    written before the buffers existed loads with the standard ones.
    """

    def __init__(self, arch: ArchConfig, layer: LayerSpec, index: int,
                 attention_fn: AttentionFn = sdpa) -> None:
        super().__init__()
        self.groups = [(g.count, g.qk_dim, g.v_dim, g.kv_heads) for g in layer.heads]
        # Dims of each head turned by RoPE, from its first: all of them but in latent layers
        self.rope_dims = [layer.rope_dim if layer.kind.latent else g.qk_dim
                          for g in layer.heads]
        self.causal = arch.causal
        self.attention_fn = attention_fn
        self.index = index
        self.rope = arch.positional == "rope"
        self.rope_theta = arch.rope_theta
        if self.rope:
            for j, freqs in enumerate(self.standard_frequencies()):
                self.register_buffer(f"inv_freq{j}", freqs)
            self.register_load_state_dict_pre_hook(self._fill_frequencies)

    def cached(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, units): what a decoder keeps of each token for the later
        ones, which read the earlier tokens through it alone: ``LayerSpec.kv_width`` units
        (the kind's ``arch.kinds.KindTraits.kv_units``)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what it caches")

    def standard_frequencies(self) -> list[Tensor]:
        """Per group, RoPE's standard frequencies (of a head of its turned dims) in every
        key/value head's row."""
        return [rope_frequencies(dims, self.rope_theta).expand(kv, -1).clone()
                for dims, (_, _, _, kv) in zip(self.rope_dims, self.groups)]

    def _fill_frequencies(self, module: nn.Module, state: dict[str, Tensor], prefix: str,
                          *_: Any) -> None:
        """A state dict without the frequencies (written before they were saved) loads with
        the standard ones."""
        for j, freqs in enumerate(self.standard_frequencies()):
            state.setdefault(f"{prefix}inv_freq{j}", freqs)

    def frequencies(self, j: int) -> Tensor:
        """(kv_heads, qk_dim / 2) RoPE frequencies of group ``j`` (a latent layer's: of its
        heads' first ``rope_dim`` dims)."""
        freqs: Tensor = getattr(self, f"inv_freq{j}")
        return freqs

    def frequency_blocks(self, j: int) -> list[Tensor]:
        """The RoPE frequencies of group ``j``'s consecutive blocks of dims, each turned in
        rotate-half form by its own (kv_heads, block / 2) table, from a head's first dim on;
        dims after the last block are not turned."""
        return [self.frequencies(j)]

    def turn_heads(self, q: Tensor, k: Tensor, j: int) -> tuple[Tensor, Tensor]:
        """Queries (B, count, T, qk) and keys (B, kv, T, qk) of group ``j`` turned by RoPE,
        block by block: one table per key/value head, shared by the query heads reading it."""
        share = q.shape[1] // k.shape[1]
        q_parts, k_parts, done = [], [], 0
        for freqs in self.frequency_blocks(j):
            cos, sin = rope_tables(k.shape[-2], freqs, k.dtype)
            end = done + 2 * freqs.shape[-1]
            k_parts.append(turn(k[..., done:end], cos, sin))
            q_parts.append(turn(q[..., done:end], cos.repeat_interleave(share, 0),
                                sin.repeat_interleave(share, 0)))
            done = end
        if done < k.shape[-1]:
            q_parts.append(q[..., done:])
            k_parts.append(k[..., done:])
        if len(k_parts) == 1:
            return q_parts[0], k_parts[0]
        return torch.cat(q_parts, dim=-1), torch.cat(k_parts, dim=-1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Per group: queries (B, T, count*qk), keys (B, T, kv*qk) and values (B, T, kv*v)
        -> (B, T, width)."""
        outs = []
        qs = q.split([c * qk for c, qk, _, _ in self.groups], dim=-1)
        ks = k.split([kv * qk for _, qk, _, kv in self.groups], dim=-1)
        vs = v.split([kv * dv for _, _, dv, kv in self.groups], dim=-1)
        for j, ((count, qk, _, kv), qg, kg, vg) in enumerate(zip(self.groups, qs, ks, vs)):
            qh, kh, vh = split_heads(qg, count), split_heads(kg, kv), split_heads(vg, kv)
            if self.rope:
                qh, kh = self.turn_heads(qh, kh, j)
            if self.attention_fn is not sdpa:  # SDPA reads grouped keys itself; others see all
                kh, vh = expand_kv(kh, count), expand_kv(vh, count)
            out = self.attention_fn(qh, kh, vh, self.causal, 1.0 / math.sqrt(qk))
            outs.append(merge_heads(out))
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


def init_linear(d_in: int, d_out: int, std: float = INIT_STD, bias: bool = False
                ) -> nn.Linear:
    """A linear map with normal(0, std) weights and a zero bias if ``bias`` (none by
    default)."""
    layer = nn.Linear(d_in, d_out, bias=bias)
    nn.init.normal_(layer.weight, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def out_std(arch: ArchConfig) -> float:
    """Residual-branch output init, scaled down with depth (GPT-2)."""
    return INIT_STD / math.sqrt(2 * arch.n_layers)


@dataclass(frozen=True)
class QKVLayout:
    """Where each head's rows sit in a layer's fused input projection: every query head, then
    every key head, then every value head, group after group (``qkv``; ``frozen_qk`` holds the
    query and key blocks as ``qk`` and the value block as ``v``). Query head ``h`` of a group
    reads key/value head ``h // (count / kv_heads)``.

    The one statement of that layout: the attention modules (``MultiHeadAttention.layout``),
    the measurement's head maps, the students and the GPT-2 and Llama readers and writers all
    go through it."""

    heads: tuple[HeadGroup, ...]

    @classmethod
    def of(cls, layer: LayerSpec) -> QKVLayout:
        return cls(tuple(layer.heads))

    @property
    def widths(self) -> tuple[int, int, int]:
        """Rows of the query, key and value blocks."""
        return (sum(g.count * g.qk_dim for g in self.heads),
                sum(g.kv_heads * g.qk_dim for g in self.heads),
                sum(g.kv_heads * g.v_dim for g in self.heads))

    def kv_head(self, group: int, head: int) -> int:
        """The key/value head that query head ``head`` of group ``group`` reads."""
        g = self.heads[group]
        return head // (g.count // g.kv_heads)

    def query_heads(self, group: int, kv: int) -> range:
        """The query heads of group ``group`` that read its key/value head ``kv``."""
        g = self.heads[group]
        share = g.count // g.kv_heads
        return range(kv * share, (kv + 1) * share)

    def query_rows(self, group: int, head: int) -> slice:
        """Rows of query head ``head`` of group ``group``."""
        start = sum(g.count * g.qk_dim for g in self.heads[:group])
        qk = self.heads[group].qk_dim
        return slice(start + head * qk, start + (head + 1) * qk)

    def key_rows(self, group: int, kv: int) -> slice:
        """Key rows of key/value head ``kv`` of group ``group``."""
        start = self.widths[0] + sum(g.kv_heads * g.qk_dim for g in self.heads[:group])
        qk = self.heads[group].qk_dim
        return slice(start + kv * qk, start + (kv + 1) * qk)

    def split(self, rows: Tensor) -> tuple[list[list[Tensor]], list[list[Tensor]], Tensor]:
        """Fused rows (weights ``(n, d)`` or biases ``(n,)``; the value block may be absent, as
        in ``frozen_qk``'s ``qk``) -> per group the rows of each query head, per group the key
        rows of each key/value head, and the rest (the value rows)."""
        q_width, k_width, _ = self.widths
        q, k, rest = rows.split([q_width, k_width, rows.shape[0] - q_width - k_width])
        qs = q.split([g.count * g.qk_dim for g in self.heads])
        ks = k.split([g.kv_heads * g.qk_dim for g in self.heads])
        return ([list(x.split(g.qk_dim)) for x, g in zip(qs, self.heads)],
                [list(x.split(g.qk_dim)) for x, g in zip(ks, self.heads)], rest)

    @staticmethod
    def fuse(queries: Sequence[Tensor], keys: Sequence[Tensor], rest: Tensor) -> Tensor:
        """The inverse of ``split``: query heads' rows, key/value heads' key rows (each in
        order, group after group) and the rest, as one fused block."""
        return torch.cat([*queries, *keys, rest])



class MultiHeadAttention(GroupedAttention):
    """Standard attention: fused ``W_qkv`` (its rows laid out by ``self.layout``, a
    ``QKVLayout``), one SDPA call per head group, ``W_o``."""

    def __init__(self, arch: ArchConfig, layer: LayerSpec, index: int,
                 attention_fn: AttentionFn = sdpa) -> None:
        super().__init__(arch, layer, index, attention_fn)
        self.layout = QKVLayout.of(layer)
        self.qk_width, self.k_width, self.v_width = self.layout.widths  # query, key, value rows
        self.width = layer.width
        self.qkv = init_linear(arch.d_model, self.qk_width + self.k_width + self.v_width,
                               bias=arch.bias or arch.qkv_bias)
        self.out = init_linear(self.width, arch.d_model, out_std(arch), bias=arch.bias)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv(x).split([self.qk_width, self.k_width, self.v_width], dim=-1)
        return q, k, v

    def cached(self, x: Tensor) -> Tensor:
        """Keys (B, T, k_width), here before RoPE turns them by position, then values (B, T,
        v_width): ``kv_heads (qk_dim + v_dim)`` per group."""
        _, k, v = self.project(x)
        return torch.cat([k, v], dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.attend(*self.project(x)))


class FrozenQKAttention(MultiHeadAttention):
    """Query/key maps frozen at a variance-preserving random init; value/output trained.

    Frozen maps must give informative (non-uniform) attention at init, so they are drawn with
    std ``1/sqrt(d_model)`` (logits of unit variance) rather than the small trained-layer init.
    They stay in ``state_dict`` (checkpoints keep them) with ``requires_grad=False``.
    """

    def __init__(self, arch: ArchConfig, layer: LayerSpec, index: int,
                 attention_fn: AttentionFn = sdpa) -> None:
        super().__init__(arch, layer, index, attention_fn)
        del self.qkv
        bias = arch.bias or arch.qkv_bias
        self.qk = init_linear(arch.d_model, self.qk_width + self.k_width,
                              1.0 / math.sqrt(arch.d_model), bias=bias)
        self.qk.requires_grad_(False)
        self.v = init_linear(arch.d_model, self.v_width, bias=bias)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k = self.qk(x).split([self.qk_width, self.k_width], dim=-1)
        return q, k, self.v(x)


class SubspaceAttention(GroupedAttention):
    """MSSA: ``p = U^T z`` is query, key and value; output ``U p A`` (tied) or ``W_o p A``."""

    def __init__(self, arch: ArchConfig, layer: LayerSpec, index: int,
                 attention_fn: AttentionFn = sdpa) -> None:
        super().__init__(arch, layer, index, attention_fn)
        self.width = layer.width
        self.basis = init_linear(arch.d_model, self.width)  # weight = [U_1 .. U_K]^T
        self.out = None if layer.tied_output else init_linear(self.width, arch.d_model,
                                                          out_std(arch))

    def cached(self, x: Tensor) -> Tensor:
        """``p`` (B, T, width): the one projection, each token's key and value at once."""
        p: Tensor = self.basis(x)
        return p

    def forward(self, x: Tensor) -> Tensor:
        p = self.basis(x)  # (B, T, width): every head's coordinates in its subspace
        o = self.attend(p, p, p)
        if self.out is None:
            return o @ self.basis.weight  # sum_k U_k o_k
        return self.out(o)


def mixing_matrix(heads: int, seq_len: int, width: int, causal: bool,
                  generator: torch.Generator) -> Tensor:
    """MixiT attention ``A = I + W - rowmean(W)`` per head, rows summing to one.

    ``W`` has i.i.d. N(0, 1/(width * seq_len)) entries (variance preserving); a causal matrix
    keeps the lower triangle and subtracts the mean over allowed positions only.
    Returns (heads, seq_len, seq_len).
    """
    w = torch.randn(heads, seq_len, seq_len, generator=generator) / math.sqrt(width * seq_len)
    if causal:
        allowed = (~future_mask(seq_len)).float()
        w = w * allowed
        mean = w.sum(-1, keepdim=True) / allowed.sum(-1, keepdim=True)
        w = (w - mean) * allowed
    else:
        w = w - w.mean(-1, keepdim=True)
    return w + torch.eye(seq_len)


class MixiTAttention(GroupedAttention):
    """Random static mixing per head (no queries, no keys); value and output are trained.

    The matrices are non-persistent buffers regenerated from ``(arch.seed, index)``: checkpoints
    stay small and reproducible. Shorter sequences use the top-left block of ``W``.
    """

    def __init__(self, arch: ArchConfig, layer: LayerSpec, index: int,
                 attention_fn: AttentionFn = sdpa) -> None:
        super().__init__(arch, layer, index, attention_fn)
        self.width = layer.width
        self.v = init_linear(arch.d_model, self.width)
        self.out = init_linear(self.width, arch.d_model, out_std(arch))
        generator = torch.Generator().manual_seed(arch.seed * 1_000_003 + index)
        for j, (count, _, dv, _) in enumerate(self.groups):
            mix = mixing_matrix(count, arch.max_seq_len, dv, arch.causal, generator)
            self.register_buffer(f"mix{j}", mix, persistent=False)
        self.max_seq_len = arch.max_seq_len

    def mixing(self, j: int, t: int) -> Tensor:
        """(count, t, t) mixing of group ``j`` for a length-``t`` sequence."""
        mix: Tensor = getattr(self, f"mix{j}")
        if t == self.max_seq_len:
            return mix
        block = mix[:, :t, :t] - torch.eye(t, device=mix.device, dtype=mix.dtype)
        if self.causal:  # the causal rows only mix earlier positions: the block is exact
            return mix[:, :t, :t]
        return block - block.mean(-1, keepdim=True) + torch.eye(t, device=mix.device)

    def cached(self, x: Tensor) -> Tensor:
        """Values (B, T, width): the mixing is fixed, so no keys."""
        v: Tensor = self.v(x)
        return v

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        vs = self.v(x).split([c * dv for c, _, dv, _ in self.groups], dim=-1)
        outs = [merge_heads(self.mixing(j, t).to(x.dtype) @ split_heads(vg, count))
                for j, ((count, _, _, _), vg) in enumerate(zip(self.groups, vs))]
        return self.out(torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0])
