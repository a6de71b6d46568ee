"""The project's shared vocabulary (``ArchConfig``) and search spaces; imports no torch or Ray."""

from search_spaces.arch import (
    ATTENTION_KINDS,
    MLP_KINDS,
    NORMS,
    POSITIONALS,
    ROLES,
    SCHEMA_VERSION,
    ArchConfig,
    ConfigError,
    HeadGroup,
    LayerSpec,
    ModelIO,
)
from search_spaces.params import ParamCount, attention_params, layer_params, param_count

__all__ = [
    "ATTENTION_KINDS",
    "MLP_KINDS",
    "NORMS",
    "POSITIONALS",
    "ROLES",
    "SCHEMA_VERSION",
    "ArchConfig",
    "ConfigError",
    "HeadGroup",
    "LayerSpec",
    "ModelIO",
    "ParamCount",
    "attention_params",
    "layer_params",
    "param_count",
]
