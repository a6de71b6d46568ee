"""The project's vocabulary: what a model is (``ArchConfig`` of ``LayerSpec`` of ``HeadGroup``),
what each attention kind has (``KINDS``), how it is trained (``TrainConfig``), its analytic
parameter counts, the flat parameter names a study records (``codec``) and the memory kernels
of the allocator. Frozen, typed, validated dataclasses that own their serialisation; imports no
torch or Ray."""

from arch import codec
from arch.config import ArchConfig, ModelIO
from arch.errors import ConfigError
from arch.kinds import KINDS, KindTraits, kind_traits, kinds_text, kinds_where
from arch.layers import HeadGroup, LayerSpec, merge_groups
from arch.names import (
    ATTENTION_KINDS,
    MAX_DEPTH,
    MAX_WIDTH,
    MLP_KINDS,
    NORMS,
    POSITIONALS,
    ROLES,
    SCHEMA_VERSION,
    AttentionKind,
    Positional,
)
from arch.params import ParamCount, attention_params, layer_params, param_count
from arch.training import OPTIMIZERS, TrainConfig

__all__ = [
    "ATTENTION_KINDS",
    "KINDS",
    "MAX_DEPTH",
    "MAX_WIDTH",
    "MLP_KINDS",
    "NORMS",
    "OPTIMIZERS",
    "POSITIONALS",
    "ROLES",
    "SCHEMA_VERSION",
    "ArchConfig",
    "AttentionKind",
    "ConfigError",
    "HeadGroup",
    "KindTraits",
    "LayerSpec",
    "ModelIO",
    "ParamCount",
    "Positional",
    "TrainConfig",
    "attention_params",
    "codec",
    "kind_traits",
    "kinds_text",
    "kinds_where",
    "layer_params",
    "merge_groups",
    "param_count",
]
