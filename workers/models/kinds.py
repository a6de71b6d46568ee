"""The attention kinds' registry: ``ATTENTION[name]`` is the module class of the kind an
``ArchConfig`` layer names (``arch.ATTENTION_KINDS``), built by ``make_attention``."""

from __future__ import annotations

from arch import ArchConfig, LayerSpec
from workers.models.attention import (
    AttentionFn,
    FrozenQKAttention,
    GroupedAttention,
    MixiTAttention,
    MultiHeadAttention,
    SubspaceAttention,
    sdpa,
)
from workers.models.latent import LatentAttention

ATTENTION: dict[str, type[GroupedAttention]] = {
    "mhsa": MultiHeadAttention,
    "frozen_qk": FrozenQKAttention,
    "mssa": SubspaceAttention,
    "mixit": MixiTAttention,
    "latent": LatentAttention,
}


def make_attention(arch: ArchConfig, layer: LayerSpec, index: int,
                   attention_fn: AttentionFn = sdpa) -> GroupedAttention:
    """Build the attention of ``layer`` from the registry (unknown names list the choices)."""
    try:
        cls = ATTENTION[layer.attention]
    except KeyError:
        raise ValueError(f"unknown attention {layer.attention!r}; choices: "
                         f"{', '.join(ATTENTION)}") from None
    return cls(arch, layer, index, attention_fn)
