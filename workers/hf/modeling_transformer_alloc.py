"""A transformer-alloc model as a ``transformers`` causal language model (remote code).

This file is copied into every exported student folder and loaded with
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``, so it imports only
torch, transformers, the standard library and its attention file (``transformers`` copies
files a remote model imports relatively). It reads the architecture from the config's
``arch`` field (the ``ArchConfig`` dict of transformer-alloc) and names its parameters as that
package's ``Model`` does (``embed.weight``, ``blocks.{i}.attn.qkv.weight``, ...), so the saved
state dict loads as it is.

What it computes, per block ``h = h + eta * Attn(Norm(h))`` then ``h = h + MLP(Norm(h))`` (when
the layer has an MLP): the attention of ``attention_transformer_alloc.py`` (copied beside this
file, and imported from it); positions learned (``pos``), sinusoidal (computed) or RoPE (in the
attention); norms LayerNorm or RMSNorm; MLPs GELU (exact or tanh) or SwiGLU (``up`` = [gate;
value]). The key/value cache is a ``transformers`` ``DynamicCache``. Padding masks are refused
(every ``attention_mask`` entry must be 1). The file is written by hand and kept, not
generated, so that it reads as one model file and is copied into a student folder as it is.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .attention_transformer_alloc import AllocAttention, AllocLatentAttention

MODEL_TYPE = "transformer_alloc"
ATTENTION_KINDS = ("mhsa", "frozen_qk", "latent")
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
    sliding_window: int | None = None  # the teacher's (max_position_embeddings is that window)


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


def sinusoidal(start: int, t: int, dim: int, device: torch.device) -> Tensor:
    """Vaswani et al. positions ``start .. start + t - 1``: (t, dim)."""
    position = torch.arange(start, start + t, dtype=torch.float32, device=device)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device)
                     * (-math.log(10000.0) / dim))
    table = torch.zeros(t, dim, device=device)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : dim // 2]
    return table


def make_norm(arch: dict[str, Any]) -> nn.Module:
    """LayerNorm (epsilon 1e-5 unless set) or RMSNorm (torch's default epsilon unless set)."""
    d, eps = int(arch["d_model"]), arch.get("norm_eps")
    if arch.get("norm", "layernorm") == "layernorm":
        return nn.LayerNorm(d, eps=eps or 1e-5)
    return nn.RMSNorm(d, eps=eps)


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
        kind = AllocLatentAttention if layer["attention"] == "latent" else AllocAttention
        self.attn = kind(arch, layer, index)
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
        # Where a longer input would be computed otherwise than by the teacher: past learned
        # positions, or past the window of a sliding-window teacher. RoPE and sinusoidal
        # positions go on, as they do in the teacher.
        self.context_ends = ("its learned positions" if self.pos is not None else
                             "its teacher's sliding window" if getattr(
                                 config, "sliding_window", None) else "")
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
        if self.context_ends and start + t > self.max_seq_len:
            raise ValueError(f"sequence length {start + t} exceeds max_seq_len "
                             f"{self.max_seq_len} ({self.context_ends})")
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
