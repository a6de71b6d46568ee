"""The attention layers of a transformer-alloc model in ``transformers`` (remote code).

Copied into every exported student folder beside ``modeling_transformer_alloc.py``, which
imports it, so it too imports only torch, transformers and the standard library. Layers hold
head groups ``(count, qk_dim, v_dim, kv_heads)``; each query head ``h`` of a group reads
key/value head ``h // (count / kv_heads)``; ``out`` maps the concatenated heads back to the
model width.

- ``AllocAttention`` (``mhsa``, ``frozen_qk``): one fused projection (``qkv``; or a frozen
  ``qk`` plus ``v``), rows ordered every query head, then every key head, then every value
  head, group after group. RoPE (rotate-half form) turns pair ``i`` of key/value head ``h`` of
  group ``j`` by ``position * inv_freq{j}[h, i]``: the frequencies are saved buffers, since a
  compressed student keeps a subset of its teacher's and they cannot be recomputed from the
  config. The ``transformers`` ``DynamicCache`` holds a layer's turned keys as one tensor (B, 1,
  T, sum of kv_heads * qk_dim) and its values as (B, 1, T, sum of kv_heads * v_dim).
- ``AllocLatentAttention`` (``latent``): keys ``[RoPE part | latent part]`` and values rebuilt
  by ``up`` from a latent ``down(x)`` per token; the cache holds the latents (its keys, (B, 1,
  T, latent_dim)) and the keys' turned RoPE parts (its values, (B, 1, T, sum of kv_heads *
  rope_dim)).

Copies. Being standalone, this file repeats some of ``workers.models.attention``: the head split and
merge and the RoPE rotation. Each repeated function is marked ``# Copied from
workers.models.attention.NAME`` and must stay identical to its source, text for text (docstring
included), which ``tests/test_hf_export.py`` checks, as ``transformers`` checks its own ``#
Copied from`` functions (``utils/check_copies.py``): a change made in one place and not the
other fails the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.cache_utils import Cache


@dataclass(frozen=True)
class Group:
    """One head group: ``count`` query heads of ``qk`` dims reading ``kv`` key/value heads of
    ``qk`` (keys) and ``v`` (values) dims."""

    count: int
    qk: int
    v: int
    kv: int


def parse_groups(heads: list[Any]) -> list[Group]:
    """Head groups from a layer's ``heads`` list (dicts with count, qk_dim, optional v_dim and
    kv_heads, which default to qk_dim and count)."""
    groups = []
    for g in heads:
        if not isinstance(g, dict):
            raise ValueError(f"head group {g!r}: expected a dict with count and qk_dim")
        count, qk = int(g["count"]), int(g["qk_dim"])
        groups.append(Group(count, qk, int(g.get("v_dim") or qk), int(g.get("kv_heads") or count)))
    return groups


# Copied from workers.models.attention.rope_frequencies
def rope_frequencies(dim: int, theta: float) -> Tensor:
    """RoPE's ``dim / 2`` angular frequencies, pair ``i`` turning ``theta ** (-2i / dim)`` per
    position (computed as ``transformers`` does, so angles agree to the last bit)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


# Copied from workers.models.attention.rope_tables
def rope_tables(t: int, inv_freq: Tensor, dtype: torch.dtype, start: int = 0
                ) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``position * inv_freq[h, i]`` for the ``t`` positions from
    ``start``, each (H, t, dim/2) (angles in float32, then ``dtype``); ``inv_freq``: (H, dim/2)."""
    positions = torch.arange(start, start + t, dtype=torch.float32, device=inv_freq.device)
    angles = positions[None, :, None] * inv_freq[:, None, :].float()
    return angles.cos().to(dtype), angles.sin().to(dtype)


# Copied from workers.models.attention.turn
def turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in rotate-half form: pair ``i`` of a head is dims ``(i, i + dim/2)``, turned by the
    angles of ``rope_tables``. ``x``: (B, H, T, dim)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# Copied from workers.models.attention.rotate
def rotate(x: Tensor, inv_freq: Tensor, start: int = 0) -> Tensor:
    """``x`` (B, H, T, dim) at positions ``start ..`` turned by RoPE with frequencies
    ``inv_freq`` (H, dim/2)."""
    return turn(x, *rope_tables(x.shape[-2], inv_freq, x.dtype, start))


# Copied from workers.models.attention.split_heads
def split_heads(x: Tensor, count: int) -> Tensor:
    """(B, T, count * dim) -> (B, count, T, dim)"""
    b, t, _ = x.shape
    return x.view(b, t, count, -1).transpose(1, 2)


# Copied from workers.models.attention.merge_heads
def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, dim) -> (B, T, H * dim)"""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def through_cache(cache: Cache | None, index: int, first: Tensor, second: Tensor
                  ) -> tuple[Tensor, Tensor]:
    """Two (B, T, width) tensors of the new tokens appended to layer ``index``'s cache (its
    keys and values, each stored (B, 1, T, width)), and those of every cached token back; as
    they are without a cache."""
    if cache is None:
        return first, second
    first_all, second_all = cache.update(first[:, None], second[:, None], index)
    return first_all[:, 0], second_all[:, 0]


def attend(g: Group, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Group ``g``'s softmax attention: queries (B, count, t, qk) of the newest ``t`` tokens
    over keys (B, kv, total, qk) and values (B, kv, total, v) of every token -> (B, t,
    count * v). New queries see every cached key and the new ones up to their own."""
    t, total = q.shape[-2], k.shape[-2]
    mask = None
    if 1 < t < total:
        mask = torch.ones(t, total, dtype=torch.bool, device=q.device).tril(total - t)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=t == total and t > 1,
                                       scale=1.0 / math.sqrt(g.qk), enable_gqa=g.kv != g.count)
    return merge_heads(o)


class AllocAttention(nn.Module):
    """Grouped attention of one layer (``mhsa``: ``qkv``; ``frozen_qk``: ``qk`` and ``v``)."""

    def __init__(self, arch: dict[str, Any], layer: dict[str, Any], index: int) -> None:
        super().__init__()
        self.index = index
        self.groups = parse_groups(layer["heads"])
        d = int(arch["d_model"])
        in_bias = bool(arch.get("bias") or arch.get("qkv_bias"))
        self.q_width = sum(g.count * g.qk for g in self.groups)
        self.k_width = sum(g.kv * g.qk for g in self.groups)
        self.v_width = sum(g.kv * g.v for g in self.groups)
        width = sum(g.count * g.v for g in self.groups)
        self.qkv: nn.Linear | None = None
        self.qk: nn.Linear | None = None
        self.v: nn.Linear | None = None
        if layer["attention"] == "frozen_qk":
            self.qk = nn.Linear(d, self.q_width + self.k_width, bias=in_bias)
            self.v = nn.Linear(d, self.v_width, bias=in_bias)
        else:
            self.qkv = nn.Linear(d, self.q_width + self.k_width + self.v_width, bias=in_bias)
        self.out = nn.Linear(width, d, bias=bool(arch.get("bias")))
        self.rope = arch.get("positional", "learned") == "rope"
        if self.rope:
            theta = float(arch.get("rope_theta", 10000.0))
            for j, g in enumerate(self.groups):
                freqs = rope_frequencies(g.qk, theta).expand(g.kv, -1).clone()
                self.register_buffer(f"inv_freq{j}", freqs)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d) -> queries (B, T, q_width), keys (B, T, k_width), values (B, T, v_width)."""
        if self.qkv is not None:
            q, k, v = self.qkv(x).split([self.q_width, self.k_width, self.v_width], dim=-1)
            return q, k, v
        assert self.qk is not None and self.v is not None
        q, k = self.qk(x).split([self.q_width, self.k_width], dim=-1)
        return q, k, self.v(x)

    def positioned(self, q: Tensor, k: Tensor, start: int) -> tuple[list[Tensor], Tensor]:
        """Per group queries (B, count, T, qk) and all keys flat (B, T, k_width), turned by RoPE
        at positions from ``start`` when the model uses it."""
        qs = q.split([g.count * g.qk for g in self.groups], dim=-1)
        ks = k.split([g.kv * g.qk for g in self.groups], dim=-1)
        q_heads, k_flat = [], []
        for j, (g, qg, kg) in enumerate(zip(self.groups, qs, ks)):
            qh, kh = split_heads(qg, g.count), split_heads(kg, g.kv)
            if self.rope:
                freqs: Tensor = getattr(self, f"inv_freq{j}")  # (kv, qk / 2)
                q_freqs = freqs.repeat_interleave(g.count // g.kv, dim=0)  # (count, qk / 2)
                qh, kh = rotate(qh, q_freqs, start), rotate(kh, freqs, start)
            q_heads.append(qh)
            k_flat.append(merge_heads(kh))
        return q_heads, torch.cat(k_flat, dim=-1) if len(k_flat) > 1 else k_flat[0]

    def forward(self, x: Tensor, start: int, cache: Cache | None) -> Tensor:
        """(B, T, d) -> (B, T, d) for the tokens at positions ``start ..``; with ``cache``,
        their keys and values are appended to the layer's and every cached one is read."""
        q, k, v = self.project(x)
        q_heads, k = self.positioned(q, k, start)
        k, v = through_cache(cache, self.index, k, v)
        ks = k.split([g.kv * g.qk for g in self.groups], dim=-1)
        vs = v.split([g.kv * g.v for g in self.groups], dim=-1)
        outs = [attend(g, qh, split_heads(kg, g.kv), split_heads(vg, g.kv))
                for g, qh, kg, vg in zip(self.groups, q_heads, ks, vs)]
        out: Tensor = self.out(torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0])
        return out


# New tokens per call up to which a latent layer without turned latent parts reads its cache in
# the absorbed form (decoding); a longer call (a prompt) rebuilds keys and values and runs the
# fused attention, whose (T, T) logits are never held at once.
ABSORB_MAX_TOKENS = 16


def turn_part(x: Tensor, freqs: Tensor, start: int, first: int) -> Tensor:
    """``x`` (B, H, T, dim) with dims ``first .. first + 2 n`` turned by RoPE at positions
    ``start ..`` (``freqs``: (H, n)); the others as they are."""
    end = first + 2 * freqs.shape[-1]
    return torch.cat([x[..., :first], rotate(x[..., first:end], freqs, start), x[..., end:]],
                     dim=-1)


class AllocLatentAttention(nn.Module):
    """A latent layer: each token caches the latent ``down(x)`` and its keys' turned RoPE parts
    ``k_rope(x)``; keys ``[RoPE part | latent part]`` and values are rebuilt from the cached
    latents by ``up`` (the latent parts turned too with ``rotate_latent``)."""

    def __init__(self, arch: dict[str, Any], layer: dict[str, Any], index: int) -> None:
        super().__init__()
        self.index, self.groups = index, parse_groups(layer["heads"])
        d, bias = int(arch["d_model"]), bool(arch.get("bias") or arch.get("qkv_bias"))
        c, r = int(layer["latent_dim"]), int(layer.get("rope_dim", 0))
        self.rope_dim, self.rotate_latent = r, bool(layer.get("rotate_latent"))
        # one RoPE key head per group when shared (DeepSeek-V2's decoupled key), else one per
        # key/value head
        self.rope_heads = [1 if layer.get("rope_shared") else g.kv for g in self.groups]
        self.rope_widths = [heads * r for heads in self.rope_heads]
        self.key_widths = [g.kv * (g.qk - r) for g in self.groups]
        self.v_widths = [g.kv * g.v for g in self.groups]
        self.q = nn.Linear(d, sum(g.count * g.qk for g in self.groups), bias=bias)
        self.k_rope = nn.Linear(d, sum(self.rope_widths), bias=bias) if r else None
        self.down = nn.Linear(d, c, bias=False)
        self.up = nn.Linear(c, sum(self.key_widths) + sum(self.v_widths), bias=bias)
        self.out = nn.Linear(sum(g.count * g.v for g in self.groups), d,
                             bias=bool(arch.get("bias")))
        theta = float(arch.get("rope_theta", 10000.0))
        for j, g in enumerate(self.groups):
            if arch.get("positional") == "rope":
                self.register_buffer(f"inv_freq{j}", rope_frequencies(r, theta).expand(g.kv, -1)
                                     .clone())
            if self.rotate_latent:
                self.register_buffer(f"inv_freq_latent{j}", rope_frequencies(g.qk - r, theta)
                                     .expand(g.kv, -1).clone())

    def rope_keys(self, x: Tensor, start: int) -> Tensor:
        """(B, T, d) -> every key head's RoPE part turned at positions ``start ..``, flat."""
        if self.k_rope is None:
            return x.new_zeros(x.shape[0], x.shape[1], 0)
        parts = self.k_rope(x).split(self.rope_widths, dim=-1)
        return torch.cat([merge_heads(rotate(split_heads(p, heads),
                                             getattr(self, f"inv_freq{j}")[:heads], start))
                          for j, (heads, p) in enumerate(zip(self.rope_heads, parts))], dim=-1)

    def head_keys(self, j: int, rope: Tensor, latent_keys: Tensor) -> Tensor:
        """Group ``j``'s keys (B, kv, T, qk) from every cached token's turned RoPE parts and
        latent parts (each flat for the group)."""
        g = self.groups[j]
        rest = split_heads(latent_keys, g.kv)
        if self.rotate_latent:
            rest = rotate(rest, getattr(self, f"inv_freq_latent{j}"))
        shared = split_heads(rope, self.rope_heads[j])  # (B, 1 or kv, T, r)
        return torch.cat([shared.expand(-1, g.kv, -1, -1), rest], dim=-1)

    def head_queries(self, j: int, q: Tensor, start: int) -> Tensor:
        """Group ``j``'s queries (B, count, T, qk), turned like the keys they read."""
        g, qh = self.groups[j], split_heads(q, self.groups[j].count)
        share = g.count // g.kv
        if self.rope_dim:
            qh = turn_part(qh, getattr(self, f"inv_freq{j}").repeat_interleave(share, 0),
                           start, 0)
        if self.rotate_latent:
            qh = turn_part(qh, getattr(self, f"inv_freq_latent{j}")
                           .repeat_interleave(share, 0), start, self.rope_dim)
        return qh

    def forward(self, x: Tensor, start: int, cache: Cache | None) -> Tensor:
        """(B, T, d) -> (B, T, d) for the tokens at positions ``start ..``; with ``cache``,
        their latents (the cache's keys) and RoPE parts (its values) are appended. A few new
        tokens (decoding) read the cached latents as they are (``absorbed``) when the latent
        parts are not turned; otherwise every cached token's keys and values are rebuilt."""
        latent, rope = through_cache(cache, self.index, self.down(x), self.rope_keys(x, start))
        qs = self.q(x).split([g.count * g.qk for g in self.groups], dim=-1)
        rebuild = self.rotate_latent or x.shape[1] > ABSORB_MAX_TOKENS
        heads = self.rebuilt if rebuild else self.absorbed
        outs = [heads(j, self.head_queries(j, qg, start), latent, rg)
                for j, (qg, rg) in enumerate(zip(qs, rope.split(self.rope_widths, -1)))]
        out: Tensor = self.out(torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0])
        return out

    def up_rows(self, j: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Group ``j``'s rows of ``up``: its keys' latent parts (kv * (qk - rope_dim), c), its
        values (kv * v, c), and their biases (or None)."""
        keys, values = self.up.weight.split([sum(self.key_widths), sum(self.v_widths)])
        k_rows, v_rows = keys.split(self.key_widths)[j], values.split(self.v_widths)[j]
        if self.up.bias is None:
            return k_rows, v_rows, None, None
        k_bias, v_bias = self.up.bias.split([sum(self.key_widths), sum(self.v_widths)])
        return k_rows, v_rows, k_bias.split(self.key_widths)[j], v_bias.split(self.v_widths)[j]

    def rebuilt(self, j: int, q: Tensor, latent: Tensor, rope: Tensor) -> Tensor:
        """Group ``j``'s attention over every token's keys and values rebuilt from its latent:
        queries (B, count, t, qk), latents (B, T, c) and turned RoPE parts (B, T, kv * r)
        -> (B, t, count * v)."""
        k_rows, v_rows, k_bias, v_bias = self.up_rows(j)
        keys, values = F.linear(latent, k_rows, k_bias), F.linear(latent, v_rows, v_bias)
        g = self.groups[j]
        return attend(g, q, self.head_keys(j, rope, keys), split_heads(values, g.kv))

    def absorbed(self, j: int, q: Tensor, latent: Tensor, rope: Tensor) -> Tensor:
        """``rebuilt`` without rebuilding a key or a value (multi-head latent attention's
        absorbed form, DeepSeek-V2): each query's latent part is mapped into the latent space
        once (``q_lat W_up,k``), its logits read the cached latents ``c_s`` directly, and the
        attention-weighted latents are mapped to values once. Exact: a key bias adds one
        constant to a query's logits (softmax ignores it) and a value bias passes the
        weighted sum unchanged (the weights sum to 1). A new token then reads ``c + kv * r``
        numbers per cached token (``c + r`` with a shared RoPE part), not ``kv * (qk + v)``."""
        g, r = self.groups[j], self.rope_dim
        b, _, t, _ = q.shape
        total, c, share = latent.shape[1], latent.shape[2], g.count // g.kv
        k_rows, v_rows, _, v_bias = self.up_rows(j)
        q = q / math.sqrt(g.qk)  # the logits' scale, on the few new queries
        q_lat = q[..., r:].reshape(b, g.kv, share * t, g.qk - r)
        # (B, kv, share t, qk - r) @ (kv, qk - r, c): every query in the latent space
        q_abs = q_lat @ k_rows.view(g.kv, g.qk - r, c)
        logits = q_abs.reshape(b, g.count * t, c) @ latent.transpose(1, 2)  # (B, count t, T)
        if r:  # (B, kv or 1 when shared, T, r), turned when cached
            rope_keys = split_heads(rope, self.rope_heads[j])
            logits += (q[..., :r].reshape(b, g.kv, share * t, r)
                       @ rope_keys.transpose(-1, -2)).view(b, g.count * t, total)
        logits = logits.view(b, g.count, t, total)
        if t > 1:  # new queries see every cached key and the new ones up to their own
            hidden = torch.ones(t, total, dtype=torch.bool, device=q.device).triu(total - t + 1)
            logits = logits.masked_fill(hidden, float("-inf"))
        weights = torch.softmax(logits, dim=-1).view(b, g.count * t, total)
        mixed = (weights @ latent).view(b, g.kv, share * t, c)  # weighted latents
        values = mixed @ v_rows.view(g.kv, g.v, c).transpose(-1, -2)  # (B, kv, share t, v)
        if v_bias is not None:
            values = values + v_bias.view(g.kv, 1, g.v)
        return merge_heads(values.view(b, g.count, t, g.v))
