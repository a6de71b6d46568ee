"""The vocabulary's names and limits: the attention kinds, roles, positions, norms and MLPs an
``ArchConfig`` may name (each a ``Literal`` type with its tuple derived from it), and the
largest sizes the tools take."""

from __future__ import annotations

from typing import Literal, get_args

SCHEMA_VERSION = 1
# The vocabulary: each name set is a Literal type, and its tuple is derived from it. What each
# attention kind has is the table ``arch.kinds.KINDS``.
AttentionKind = Literal["mhsa", "mssa", "mixit", "frozen_qk", "latent"]
Role = Literal["extract", "process"]
Positional = Literal["learned", "sinusoidal", "rope"]
Norm = Literal["layernorm", "rmsnorm"]
MlpKind = Literal["gelu", "gelu_tanh", "swiglu"]  # gelu_tanh: GPT-2's approximation
ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)
ROLES: tuple[Role, ...] = get_args(Role)
POSITIONALS: tuple[Positional, ...] = get_args(Positional)
NORMS: tuple[Norm, ...] = get_args(Norm)
MLP_KINDS: tuple[MlpKind, ...] = get_args(MlpKind)
# The widest model and the deepest the tools take (every size read from a file or a flag is
# bounded): d_model and depth.
MAX_WIDTH, MAX_DEPTH = 65_536, 1_024
