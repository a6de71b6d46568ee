"""A transformer-alloc model as a ``transformers`` causal language model (remote code).

This file is copied into every exported student folder and loaded with
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``, so it imports only
torch, transformers and the standard library. It reads the architecture from the config's
``arch`` field (the ``ArchConfig`` dict of transformer-alloc) and names its parameters as that
package's ``Model`` does (``embed.weight``, ``blocks.{i}.attn.qkv.weight``, ...), so the saved
state dict loads as it is.

What it computes, per block ``h = h + eta * Attn(Norm(h))`` then ``h = h + MLP(Norm(h))`` (when
the layer has an MLP):

- attention layers hold head groups ``(count, qk_dim, v_dim, kv_heads)``: one fused projection
  (``qkv``; or a frozen ``qk`` plus ``v``), rows ordered every query head, then every key head,
  then every value head, group after group; one softmax attention call per group, each query
  head ``h`` reading key/value head ``h // (count / kv_heads)``; ``out`` maps the concatenated
  heads back to the model width;
- RoPE (rotate-half form) turns pair ``i`` of key/value head ``h`` of group ``j`` by
  ``position * inv_freq{j}[h, i]``: the frequencies are saved buffers, since a compressed
  student keeps a subset of its teacher's and they cannot be recomputed from the config;
- positions: learned (``pos``), sinusoidal (computed) or RoPE; norms LayerNorm or RMSNorm; MLPs
  GELU (exact or tanh) or SwiGLU (``up`` = [gate; value]).

The key/value cache is a ``transformers`` ``DynamicCache``: a layer stores its rotated keys as
one tensor (B, 1, T, sum of kv_heads * qk_dim) and its values as (B, 1, T, sum of kv_heads *
v_dim), split per group on read. Padding masks are refused (every ``attention_mask`` entry must
be 1).

Copies. Being standalone, this file repeats some of ``workers.attention``: the head split and
merge and the RoPE rotation. Each repeated function is marked ``# Copied from
workers.attention.NAME`` and must stay identical to its source, text for text (docstring
included), which ``tests/test_hf_export.py`` checks, as ``transformers`` checks its own ``#
Copied from`` functions (``utils/check_copies.py``): a change made in one place and not the
other fails the tests. The file is written by hand and kept, not generated from the source, so
that it reads as one model file and is copied into a student folder as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

MODEL_TYPE = "transformer_alloc"
ATTENTION_KINDS = ("mhsa", "frozen_qk")
# The output's cache field: ``cache`` from transformers 5.24 on, ``past_key_values`` before
# (generation reads the field its own version names).
CACHE_FIELD = next(name for name in ("cache", "past_key_values")
                   if name in CausalLMOutputWithPast.__dataclass_fields__)


class TransformerAllocConfig(PretrainedConfig):
    """The configuration: ``arch`` is transformer-alloc's ``ArchConfig`` as a dict; the other
    fields repeat what ``transformers`` reads (vocabulary, width, depth, length, tying)."""

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["cache", "past_key_values"]  # noqa: RUF012 (transformers'
    # class API; both names of the cache, see CACHE_FIELD)

    arch: dict[str, Any] | None = None
    vocab_size: int = 1
    hidden_size: int = 1
    num_hidden_layers: int = 1
    max_position_embeddings: int = 1
    tie_word_embeddings: bool = False
    use_cache: bool = True


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


def arch_of(config: TransformerAllocConfig) -> dict[str, Any]:
    """The config's architecture dict, checked for what this file implements."""
    arch = config.arch
    if not isinstance(arch, dict) or "layers" not in arch:
        raise ValueError("config.arch: expected transformer-alloc's architecture dict")
    if arch.get("vocab_size") is None:
        raise ValueError("config.arch: this model needs token inputs (vocab_size)")
    if not arch.get("causal", True):
        raise ValueError("config.arch: causal = false; a causal language model needs causal "
                         "attention")
    for i, layer in enumerate(arch["layers"]):
        if layer["attention"] not in ATTENTION_KINDS:
            raise ValueError(f"config.arch.layers[{i}].attention = {layer['attention']!r}: "
                             f"this file implements {', '.join(ATTENTION_KINDS)}")
    return arch


# Copied from workers.attention.rope_frequencies
def rope_frequencies(dim: int, theta: float) -> Tensor:
    """RoPE's ``dim / 2`` angular frequencies, pair ``i`` turning ``theta ** (-2i / dim)`` per
    position (computed as ``transformers`` does, so angles agree to the last bit)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


# Copied from workers.attention.rope_tables
def rope_tables(t: int, inv_freq: Tensor, dtype: torch.dtype, start: int = 0
                ) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``position * inv_freq[h, i]`` for the ``t`` positions from
    ``start``, each (H, t, dim/2) (angles in float32, then ``dtype``); ``inv_freq``: (H, dim/2)."""
    positions = torch.arange(start, start + t, dtype=torch.float32, device=inv_freq.device)
    angles = positions[None, :, None] * inv_freq[:, None, :].float()
    return angles.cos().to(dtype), angles.sin().to(dtype)


# Copied from workers.attention.turn
def turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in rotate-half form: pair ``i`` of a head is dims ``(i, i + dim/2)``, turned by the
    angles of ``rope_tables``. ``x``: (B, H, T, dim)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# Copied from workers.attention.rotate
def rotate(x: Tensor, inv_freq: Tensor, start: int = 0) -> Tensor:
    """``x`` (B, H, T, dim) at positions ``start ..`` turned by RoPE with frequencies
    ``inv_freq`` (H, dim/2)."""
    return turn(x, *rope_tables(x.shape[-2], inv_freq, x.dtype, start))


def sinusoidal(start: int, t: int, dim: int, device: torch.device) -> Tensor:
    """Vaswani et al. positions ``start .. start + t - 1``: (t, dim)."""
    position = torch.arange(start, start + t, dtype=torch.float32, device=device)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device)
                     * (-math.log(10000.0) / dim))
    table = torch.zeros(t, dim, device=device)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : dim // 2]
    return table


# Copied from workers.attention.split_heads
def split_heads(x: Tensor, count: int) -> Tensor:
    """(B, T, count * dim) -> (B, count, T, dim)"""
    b, t, _ = x.shape
    return x.view(b, t, count, -1).transpose(1, 2)


# Copied from workers.attention.merge_heads
def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, dim) -> (B, T, H * dim)"""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def make_norm(arch: dict[str, Any]) -> nn.Module:
    """LayerNorm (epsilon 1e-5 unless set) or RMSNorm (torch's default epsilon unless set)."""
    d, eps = int(arch["d_model"]), arch.get("norm_eps")
    if arch.get("norm", "layernorm") == "layernorm":
        return nn.LayerNorm(d, eps=eps or 1e-5)
    return nn.RMSNorm(d, eps=eps)


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
        if cache is not None:  # one (B, 1, T, width) tensor each for keys and values
            k_all, v_all = cache.update(k[:, None], v[:, None], self.index)
            k, v = k_all[:, 0], v_all[:, 0]
        t, total = x.shape[1], k.shape[1]
        mask = None
        if 1 < t < total:  # new queries see every cached key and the new ones up to their own
            mask = torch.ones(t, total, dtype=torch.bool, device=x.device).tril(total - t)
        ks = k.split([g.kv * g.qk for g in self.groups], dim=-1)
        vs = v.split([g.kv * g.v for g in self.groups], dim=-1)
        outs = []
        for g, qh, kg, vg in zip(self.groups, q_heads, ks, vs):
            kh, vh = split_heads(kg, g.kv), split_heads(vg, g.kv)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask,
                                               is_causal=t == total and t > 1,
                                               scale=1.0 / math.sqrt(g.qk),
                                               enable_gqa=g.kv != g.count)
            outs.append(merge_heads(o))
        out: Tensor = self.out(torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0])
        return out


class AllocMLP(nn.Module):
    """GELU ``d -> h -> d`` (exact or tanh), or SwiGLU ``d -> 2h -> d`` (``up`` = [gate;
    value])."""

    def __init__(self, arch: dict[str, Any], hidden: int) -> None:
        super().__init__()
        d, bias, kind = int(arch["d_model"]), bool(arch.get("bias")), arch.get("mlp", "gelu")
        self.gated, self.tanh = kind == "swiglu", kind == "gelu_tanh"
        self.up = nn.Linear(d, (2 if self.gated else 1) * hidden, bias=bias)
        self.down = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            out: Tensor = self.down(F.silu(gate) * value)
            return out
        out = self.down(F.gelu(h, approximate="tanh" if self.tanh else "none"))
        return out


class AllocBlock(nn.Module):
    """Pre-norm residual block: attention scaled by ``eta``, then the MLP if the layer has
    one."""

    def __init__(self, arch: dict[str, Any], index: int) -> None:
        super().__init__()
        layer = arch["layers"][index]
        self.eta = float(layer.get("eta", 1.0))
        self.attn_norm = make_norm(arch)
        self.attn = AllocAttention(arch, layer, index)
        hidden = round(float(layer.get("mlp_ratio", 0.0)) * int(arch["d_model"]))
        self.mlp_norm = make_norm(arch) if hidden > 0 else None
        self.mlp = AllocMLP(arch, hidden) if hidden > 0 else None

    def forward(self, h: Tensor, start: int, cache: Cache | None) -> Tensor:
        h = h + self.eta * self.attn(self.attn_norm(h), start, cache)
        if self.mlp is not None and self.mlp_norm is not None:
            h = h + self.mlp(self.mlp_norm(h))
        return h


class TransformerAllocPreTrainedModel(PreTrainedModel):
    """Shared ``transformers`` settings: the config class and weight initialisation."""

    config_class = TransformerAllocConfig
    base_model_prefix = "transformer_alloc"
    _no_split_modules = ["AllocBlock"]  # noqa: RUF012 (transformers' class API)
    _supports_cache_class = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, 0.02) weights and zero biases for weights the file does not hold."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.RMSNorm):
            nn.init.ones_(module.weight)


class TransformerAllocForCausalLM(TransformerAllocPreTrainedModel, GenerationMixin):
    """Embedding + positions -> blocks -> final norm -> head (tied to the embedding when the
    config says so)."""

    _tied_weights_keys = {"head.weight": "embed.weight"}  # noqa: RUF012 (transformers' API)

    def __init__(self, config: TransformerAllocConfig) -> None:
        super().__init__(config)
        arch = arch_of(config)
        d, vocab = int(arch["d_model"]), int(arch["vocab_size"])
        self.max_seq_len = int(arch["max_seq_len"])
        self.positional = arch.get("positional", "learned")
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(self.max_seq_len, d) if self.positional == "learned" else None
        self.blocks = nn.ModuleList(AllocBlock(arch, i) for i in range(len(arch["layers"])))
        self.norm = make_norm(arch)
        self.head = nn.Linear(d, vocab, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        assert isinstance(value, nn.Embedding)
        self.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, cache: Cache | None = None,
                use_cache: bool | None = None, past_key_values: Cache | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast:
        """Ids (B, T) -> logits (B, T, vocab); with ``labels`` (B, T), the next-token loss
        (shifted inside, -100 ignored). Tokens follow the cached ones: ``transformers`` passes
        the cache as ``cache`` from 5.24 on and as ``past_key_values`` before, so both are
        read (and the output names it as the installed version's output class does)."""
        if input_ids is None:
            raise ValueError("input_ids is required (inputs_embeds is not supported)")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("attention_mask with zeros (padding) is not supported: pass "
                             "unpadded sequences of equal length")
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("cache and past_key_values: pass one key/value cache")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = DynamicCache(config=self.config)
        start = cache.get_seq_length() if cache is not None else 0
        t = input_ids.shape[1]
        if start + t > self.max_seq_len:
            raise ValueError(f"sequence length {start + t} exceeds max_seq_len "
                             f"{self.max_seq_len}")
        h = self.embed(input_ids)
        if self.pos is not None:
            h = h + self.pos.weight[start:start + t]
        elif self.positional == "sinusoidal":
            h = h + sinusoidal(start, t, h.shape[-1], h.device).to(h.dtype)
        for block in self.blocks:
            h = block(h, start, cache)
        logits = self.head(self.norm(h))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels,
                                      vocab_size=self.config.vocab_size, **kwargs)
        fields: dict[str, Any] = {"loss": loss, "logits": logits,
                                  CACHE_FIELD: cache if use_cache else None}
        return CausalLMOutputWithPast(**fields)


__all__ = ["TransformerAllocConfig", "TransformerAllocForCausalLM"]
