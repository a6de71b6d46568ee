"""The project's vocabulary: what a model is (``ArchConfig`` of ``LayerSpec`` of ``HeadGroup``),
what each attention kind has (``KINDS``), how it is trained (``TrainConfig``), its analytic
parameter counts, the flat parameter names a study records (``codec``) and the memory kernels
of the allocator. Frozen, typed, validated dataclasses that own their serialisation; imports no
torch or Ray.

The public names are those of ``__all__``, imported from here; the public modules are
``checks`` (the one validation kit) and ``codec``. Every other module is private to the
package: outside it, import its names from ``arch`` (tests/test_layering checks)."""

from arch import checks, codec
from arch.config import ArchConfig, ModelIO
from arch.errors import ConfigError, KernelError
from arch.kernels import kernel_shape, parse_kernel, read_values
from arch.kinds import KINDS, KindTraits, kind_traits, kinds_text, kinds_where
from arch.layers import HeadGroup, LayerSpec, merge_groups
from arch.memory import (
    DTYPE_BYTES,
    dtype_bytes,
    gib,
    kv_cache_bytes,
    training_bytes,
    training_dtype,
)
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
    Role,
)
from arch.params import ParamCount, attention_params, layer_params, param_count
from arch.training import OPTIMIZERS, RECIPE, SMOKE_TRAIN, SMOKE_TRIAL, TrainConfig, width_lr

__all__ = [
    "ATTENTION_KINDS",
    "DTYPE_BYTES",
    "KINDS",
    "MAX_DEPTH",
    "MAX_WIDTH",
    "MLP_KINDS",
    "NORMS",
    "OPTIMIZERS",
    "POSITIONALS",
    "RECIPE",
    "ROLES",
    "SCHEMA_VERSION",
    "SMOKE_TRAIN",
    "SMOKE_TRIAL",
    "ArchConfig",
    "AttentionKind",
    "ConfigError",
    "HeadGroup",
    "KernelError",
    "KindTraits",
    "LayerSpec",
    "ModelIO",
    "ParamCount",
    "Positional",
    "Role",
    "TrainConfig",
    "attention_params",
    "checks",
    "codec",
    "dtype_bytes",
    "gib",
    "kernel_shape",
    "kind_traits",
    "kinds_text",
    "kinds_where",
    "kv_cache_bytes",
    "layer_params",
    "merge_groups",
    "param_count",
    "parse_kernel",
    "read_values",
    "training_bytes",
    "training_dtype",
    "width_lr",
]
