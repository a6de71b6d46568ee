"""Latent attention: one low-rank latent per token and layer, from which keys and values are
rebuilt (multi-head latent attention, DeepSeek-AI, "DeepSeek-V2", 2024; docs/theory.md §10.5).

A decoder caches, per token, the layer's latent ``c = W_down x`` (``latent_dim`` units) and
every key/value head's RoPE part ``W_K_rope x`` (``rope_dim`` units, turned), instead of its
keys and values. Each key head is ``[RoPE part | latent part]``: its first ``rope_dim`` dims come
from the input directly and are turned by RoPE; the other ``qk_dim - rope_dim`` are rows of
``W_up c``, turned too only when the layer says ``rotate_latent`` (low-rank keys that keep
every rotation, as Palu does; without it they carry no position, as in MHA2MLA). Values are the
other rows of ``W_up c``. Query heads use the same layout, and attention then runs per head
group exactly as in ``mhsa``. With ``rope_shared`` the RoPE part is one key head per group,
shared by all its query heads (DeepSeek-V2's decoupled key): it is cached once (``rope_dim``
units per group) and read by every key/value head of the group.

At full rank (``latent_dim`` at least the rank of the stacked key and value maps) a latent
layer computes what the ``mhsa`` layer it is cut from computes
(``workers.compression.latent_students``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from arch import ArchConfig, LayerSpec
from workers.models.attention import (
    AttentionFn,
    GroupedAttention,
    init_linear,
    out_std,
    rope_frequencies,
    sdpa,
)


class LatentAttention(GroupedAttention):
    """Queries ``q``; the latent ``down`` (no bias); RoPE keys ``k_rope`` (absent when
    ``rope_dim = 0``); ``up``: latent -> every key head's latent part, then every value head;
    output ``out``. Rows of each map run group after group, head after head."""

    def __init__(self, arch: ArchConfig, layer: LayerSpec, index: int,
                 attention_fn: AttentionFn = sdpa) -> None:
        super().__init__(arch, layer, index, attention_fn)
        d, r, in_bias = arch.d_model, layer.rope_dim, arch.bias or arch.qkv_bias
        self.rope_dim, self.latent_dim = r, layer.latent_dim
        self.rotate_latent = layer.rotate_latent  # the vocabulary allows it with RoPE only
        self.rope_heads = [1 if layer.rope_shared else kv for _, _, _, kv in self.groups]
        self.q_width = sum(count * qk for count, qk, _, _ in self.groups)
        self.rope_widths = [heads * r for heads in self.rope_heads]
        self.key_widths = [kv * (qk - r) for _, qk, _, kv in self.groups]  # latent parts
        self.v_width = sum(kv * v for _, _, v, kv in self.groups)
        self.width = layer.width
        self.q = init_linear(d, self.q_width, bias=in_bias)
        self.k_rope = init_linear(d, sum(self.rope_widths), bias=in_bias) if r else None
        self.down = init_linear(d, self.latent_dim)
        self.up = init_linear(self.latent_dim, sum(self.key_widths) + self.v_width,
                              bias=in_bias)
        self.out = init_linear(self.width, d, out_std(arch), bias=arch.bias)
        if self.rotate_latent:
            for j, (_, qk, _, kv) in enumerate(self.groups):
                freqs = rope_frequencies(qk - r, self.rope_theta).expand(kv, -1).clone()
                self.register_buffer(f"inv_freq_latent{j}", freqs)

    def frequency_blocks(self, j: int) -> list[Tensor]:
        """The RoPE part's frequencies, then the latent part's when it is turned too."""
        blocks = [self.frequencies(j)]
        if self.rotate_latent:
            blocks.append(getattr(self, f"inv_freq_latent{j}"))
        return blocks

    def keys_values(self, x: Tensor, latent: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs (B, T, d) and their latents (B, T, latent_dim) -> keys (B, T, sum kv * qk),
        each head ``[RoPE part | latent part]``, and values (B, T, sum kv * v), unturned."""
        latent_keys, v = self.up(latent).split([sum(self.key_widths), self.v_width], dim=-1)
        if self.k_rope is None:
            return latent_keys, v
        b, t, _ = x.shape
        heads = []
        for (_, qk, _, kv), rope_heads, rope, rest in zip(
                self.groups, self.rope_heads, self.k_rope(x).split(self.rope_widths, dim=-1),
                latent_keys.split(self.key_widths, dim=-1)):
            # a shared RoPE part (one head) is read by every key/value head of the group
            pair = [rope.view(b, t, rope_heads, self.rope_dim).expand(b, t, kv, self.rope_dim),
                    rest.view(b, t, kv, qk - self.rope_dim)]
            heads.append(torch.cat(pair, dim=-1).view(b, t, kv * qk))
        return torch.cat(heads, dim=-1) if len(heads) > 1 else heads[0], v

    def cached(self, x: Tensor) -> Tensor:
        """The latent (B, T, latent_dim), then every key/value head's RoPE part (B, T, sum
        kv * rope_dim; one per group when shared), here before RoPE turns it: keys and values
        are rebuilt from these."""
        latent = self.down(x)
        return latent if self.k_rope is None else torch.cat([latent, self.k_rope(x)], dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        k, v = self.keys_values(x, self.down(x))
        return self.out(self.attend(self.q(x), k, v))
