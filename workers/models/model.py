"""Models built from an ``ArchConfig``: ``build_model(arch)``.

Bottom-up: norm -> MLP -> pre-norm block -> model. A block is

    h = h + eta * Attn(Norm(h))
    h = h + MLP(Norm(h))          # only when mlp_ratio > 0 (attention-only AoT layer otherwise)

Token models embed ``(B, T)`` ids and return ``(B, T, vocab)`` logits (optionally tied);
vector models map ``(B, T, input_dim)`` to ``(B, T, output_dim)`` with linear maps. Linear maps have
no bias unless ``arch.bias`` (GPT-2); the parameter count equals ``search_spaces.param_count``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from arch import ArchConfig, LayerSpec
from workers.models.attention import INIT_STD, AttentionFn, init_linear, out_std, sdpa
from workers.models.kinds import make_attention


def make_norm(arch: ArchConfig) -> nn.Module:
    if arch.norm == "layernorm":
        return nn.LayerNorm(arch.d_model, eps=arch.norm_eps or 1e-5)
    return nn.RMSNorm(arch.d_model, eps=arch.norm_eps)


class MLP(nn.Module):
    """GELU MLP ``d -> h -> d`` (exact, or GPT-2's tanh approximation), or gated SiLU (SwiGLU)
    ``d -> 2h -> d``."""

    def __init__(self, arch: ArchConfig, layer: LayerSpec) -> None:
        super().__init__()
        hidden = arch.mlp_hidden(layer)
        self.gated = arch.mlp == "swiglu"
        self.up = init_linear(arch.d_model, (2 if self.gated else 1) * hidden, bias=arch.bias)
        self.down = init_linear(hidden, arch.d_model, out_std(arch), bias=arch.bias)
        self.tanh = arch.mlp == "gelu_tanh"
        if layer.freeze_mlp:  # Frozen-MLP ablation: the MLP stays at its random init
            self.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            return self.down(nn.functional.silu(gate) * value)
        return self.down(nn.functional.gelu(h, approximate="tanh" if self.tanh else "none"))


class Block(nn.Module):
    """Pre-norm residual block ``index`` of ``arch``."""

    def __init__(self, arch: ArchConfig, index: int, attention_fn: AttentionFn = sdpa) -> None:
        super().__init__()
        layer = arch.layers[index]
        self.eta = layer.eta
        self.attn_norm = make_norm(arch)
        self.attn = make_attention(arch, layer, index, attention_fn)
        self.mlp_norm = make_norm(arch) if layer.mlp_ratio > 0 else None
        self.mlp = MLP(arch, layer) if layer.mlp_ratio > 0 else None

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.eta * self.attn(self.attn_norm(h))
        if self.mlp is not None and self.mlp_norm is not None:
            h = h + self.mlp(self.mlp_norm(h))
        return h


def sinusoidal_table(seq_len: int, dim: int) -> Tensor:
    """Vaswani et al. positions, (seq_len, dim)."""
    position = torch.arange(seq_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(seq_len, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : dim // 2]
    return table


class Model(nn.Module):
    """Embedding (or linear in) + positions -> blocks -> final norm -> head (or linear out)."""

    pos_table: Tensor

    def __init__(self, arch: ArchConfig, attention_fn: AttentionFn = sdpa) -> None:
        super().__init__()
        self.arch = arch
        d = arch.d_model
        if arch.vocab_size is not None:
            self.embed: nn.Module = nn.Embedding(arch.vocab_size, d)
            nn.init.normal_(self.embed.weight, std=INIT_STD)
            self.head = init_linear(d, arch.vocab_size)
            if arch.tie_embeddings:
                self.head.weight = self.embed.weight
        else:
            assert arch.input_dim is not None and arch.output_dim is not None
            self.embed = init_linear(arch.input_dim, d, 1.0 / math.sqrt(arch.input_dim))
            self.head = init_linear(d, arch.output_dim)
        self.pos: nn.Embedding | None = None
        if arch.positional == "learned":
            self.pos = nn.Embedding(arch.max_seq_len, d)
            nn.init.normal_(self.pos.weight, std=INIT_STD)
        elif arch.positional == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(arch.max_seq_len, d),
                                 persistent=False)
        self.blocks = nn.ModuleList(Block(arch, i, attention_fn) for i in range(arch.n_layers))
        self.norm = make_norm(arch)

    def block(self, index: int) -> Block:
        """Block ``index`` (typed: ``self.blocks[index]`` is a plain ``nn.Module``)."""
        block = self.blocks[index]
        assert isinstance(block, Block)
        return block

    def forward(self, x: Tensor) -> Tensor:
        """Ids ``(B, T)`` -> logits ``(B, T, vocab)``, or ``(B, T, in)`` -> ``(B, T, out)``."""
        return self.tail(self.inputs(x))

    def tail(self, h: Tensor, start: int = 0) -> Tensor:
        """The output from the residual stream ``h`` (B, T, d_model) entering block ``start``:
        the blocks from there on, the final norm and the head (what a cut in block ``start``
        changes; the blocks before it need not run again)."""
        for block in self.blocks[start:]:
            h = block(h)
        return self.head(self.norm(h))

    def hidden(self, x: Tensor) -> Tensor:
        """The residual stream after the last block, ``(B, T, d_model)`` (no final norm)."""
        h = self.inputs(x)
        for block in self.blocks:
            h = block(h)
        return h

    def inputs(self, x: Tensor) -> Tensor:
        """The residual stream before the first block: the embedding and the positions,
        ``(B, T, d_model)``."""
        t = x.shape[1]
        if t > self.arch.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.arch.max_seq_len}")
        h = self.embed(x)
        if self.pos is not None:
            h = h + self.pos.weight[:t]
        elif self.arch.positional == "sinusoidal":
            h = h + self.pos_table[:t].to(h.dtype)
        return h


def build_model(arch: ArchConfig, attention_fn: AttentionFn = sdpa) -> Model:
    """The ``nn.Module`` described by ``arch`` (on CPU, float32)."""
    return Model(arch, attention_fn)


def count_params(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameters, shared (tied) tensors counted once."""
    params = list(model.parameters())
    return (sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))


def maybe_compile(model: nn.Module, enabled: bool) -> nn.Module:
    """``torch.compile`` behind a flag (off by default: compile time dominates short trials)."""
    return torch.compile(model) if enabled else model  # type: ignore[return-value]
