"""The project's shared vocabulary (``ArchConfig``), its parameter counts, the flat parameter
names of a study (``codec``), memory kernels and search spaces; imports no torch or Ray."""

from search_spaces import codec
from search_spaces.arch import (
    ATTENTION_KINDS,
    MLP_KINDS,
    NORMS,
    POSITIONALS,
    ROLES,
    SCHEMA_VERSION,
    SINGLE_WIDTH_KINDS,
    ArchConfig,
    AttentionKind,
    HeadGroup,
    LayerSpec,
    ModelIO,
    Positional,
    merge_groups,
)
from search_spaces.checks import ConfigError
from search_spaces.loader import load_space, parse_space, shipped_spaces
from search_spaces.params import ParamCount, attention_params, layer_params, param_count
from search_spaces.space import (
    FixedSuggester,
    RandomSuggester,
    SearchSpace,
    SpaceError,
    Suggester,
)

__all__ = [
    "ATTENTION_KINDS",
    "MLP_KINDS",
    "NORMS",
    "POSITIONALS",
    "ROLES",
    "SCHEMA_VERSION",
    "SINGLE_WIDTH_KINDS",
    "ArchConfig",
    "AttentionKind",
    "ConfigError",
    "FixedSuggester",
    "HeadGroup",
    "LayerSpec",
    "ModelIO",
    "ParamCount",
    "Positional",
    "RandomSuggester",
    "SearchSpace",
    "SpaceError",
    "Suggester",
    "attention_params",
    "codec",
    "layer_params",
    "load_space",
    "merge_groups",
    "param_count",
    "parse_space",
    "shipped_spaces",
]
