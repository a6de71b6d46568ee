"""Analytic parameter counts of an ``ArchConfig`` (no torch).

The counts describe exactly what ``workers`` builds (tests compare them with the built
``nn.Module``): linear maps carry no bias unless ``arch.bias`` (then the attention's query, key,
value and output maps and the MLP's maps have one; with ``arch.qkv_bias`` only the query, key and
value maps; a frozen map's bias is frozen); LayerNorm has a
weight and a bias, RMSNorm a weight; every block has a pre-attention norm, a pre-MLP norm when it
has an MLP, and the model a final norm.

Per attention kind, for a head group of ``count`` query heads reading ``kv`` key/value heads (``kv =
count`` without grouped-query attention) with dims ``qk``/``v`` in a model of width ``d``:

========== ==================================== =============================================
kind       trainable                            frozen (counted in total, not trainable)
========== ==================================== =============================================
mhsa       Q: d·count·qk, K: d·kv·qk,
           V: d·kv·v, O: d·count·v
frozen_qk  V: d·kv·v, O: d·count·v              Q: d·count·qk, K: d·kv·qk
mssa       U: d·count·v (+ O: d·count·v untied)
mixit      V, O: 2·d·count·v                    (random mixing matrix is a buffer, not counted)
latent     Q: d·count·qk, K_rope: d·kv·r,
           up: c·kv·(qk - r + v), O: d·count·v;
           once per layer, down: d·c
========== ==================================== =============================================

A latent layer (latent width ``c = latent_dim``, RoPE dims ``r = rope_dim``) maps the input down
to the latent without a bias; its query, RoPE-key and up maps take the query/key/value biases.
"""

from __future__ import annotations

from dataclasses import dataclass

from arch.config import ArchConfig
from arch.layers import LayerSpec


@dataclass(frozen=True)
class ParamCount:
    """Trainable and total parameter counts (``total - trainable`` are frozen)."""

    trainable: int
    total: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(self.trainable + other.trainable, self.total + other.total)


ZERO = ParamCount(0, 0)


def _free(n: int) -> ParamCount:
    return ParamCount(n, n)


def _frozen(n: int) -> ParamCount:
    return ParamCount(0, n)


def attention_params(layer: LayerSpec, d_model: int, bias: bool = False,
                     qkv_bias: bool = False) -> ParamCount:
    """Parameters of the attention map of ``layer`` (projections only, no norm); ``bias``: the
    query/key/value and output maps have biases, ``qkv_bias``: only the query/key/value maps
    (both for mhsa and frozen_qk only). Keys and values have ``kv_heads`` heads per group."""
    count = _free(d_model) if bias else ZERO  # the output map's bias
    in_bias = bias or qkv_bias
    kind = layer.kind
    if kind.latent:
        return count + _latent_params(layer, d_model, in_bias)
    for g in layer.heads:
        q = (d_model + in_bias) * g.count * g.qk_dim  # W_Q (and its bias)
        k = (d_model + in_bias) * g.kv_heads * g.qk_dim  # W_K
        v = (d_model + in_bias) * g.kv_heads * g.v_dim  # W_V
        o = d_model * g.count * g.v_dim  # W_O
        if kind.projections == "qkv":
            count += _free(v + o) + (_frozen(q + k) if kind.frozen_qk else _free(q + k))
        elif kind.projections == "shared":  # one basis U (d x count*v), then O unless tied
            count += _free(o if layer.tied_output else 2 * o)
        else:  # "values": V and O (single width: v = d * count * v_dim = o)
            count += _free(v + o)
    return count


def _latent_params(layer: LayerSpec, d_model: int, in_bias: bool) -> ParamCount:
    """A latent layer's maps: down to the latent, then per group queries, RoPE keys, the up
    map to the keys' latent parts and the values, and the output."""
    c, r = layer.latent_dim, layer.rope_dim
    n = d_model * c  # W_down
    for g in layer.heads:
        rope_heads = 1 if layer.rope_shared else g.kv_heads
        n += (d_model + in_bias) * (g.count * g.qk_dim + rope_heads * r)  # W_Q, W_K_rope
        n += (c + in_bias) * g.kv_heads * (g.qk_dim - r + g.v_dim)  # W_up
        n += d_model * g.count * g.v_dim  # W_O
    return _free(n)


def norm_params(arch: ArchConfig) -> int:
    """Parameters of one normalisation layer."""
    return 2 * arch.d_model if arch.norm == "layernorm" else arch.d_model


def mlp_params(arch: ArchConfig, layer: LayerSpec) -> ParamCount:
    """Parameters of the MLP of ``layer``: GELU ``d->h->d`` or gated SiLU ``d->2h->d``."""
    hidden = arch.mlp_hidden(layer)
    if hidden == 0:  # an attention-only layer
        return ZERO
    up = 2 * hidden if arch.mlp == "swiglu" else hidden
    n = (arch.d_model + arch.bias) * up + (hidden + arch.bias) * arch.d_model
    return _frozen(n) if layer.freeze_mlp else _free(n)


def layer_params(arch: ArchConfig, index: int) -> ParamCount:
    """Parameters of block ``index``: norms, attention and MLP."""
    layer = arch.layers[index]
    norms = norm_params(arch) * (2 if layer.mlp_ratio > 0 else 1)
    return (_free(norms) + attention_params(layer, arch.d_model, arch.bias, arch.qkv_bias)
            + mlp_params(arch, layer))


def io_params(arch: ArchConfig) -> ParamCount:
    """Parameters outside the blocks: input/output maps, positions and the final norm."""
    d = arch.d_model
    if arch.vocab_size is not None:
        n = arch.vocab_size * d * (1 if arch.tie_embeddings else 2)
    else:
        assert arch.input_dim is not None and arch.output_dim is not None
        n = (arch.input_dim + arch.output_dim) * d
    if arch.positional == "learned":
        n += arch.max_seq_len * d
    return _free(n + norm_params(arch))


def param_count(arch: ArchConfig) -> ParamCount:
    """Total parameters of the model ``workers.build_model(arch)`` builds."""
    total = io_params(arch)
    for i in range(arch.n_layers):
        total += layer_params(arch, i)
    return total
