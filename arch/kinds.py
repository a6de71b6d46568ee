"""The attention kinds' table: what each kind a layer may name (``arch.ATTENTION_KINDS``) has,
one ``KindTraits`` per kind in ``KINDS``: its projections, what a decoder caches of it per
token (``KindTraits.kv_units``, the one statement of the KV cache width), whether RoPE applies,
whether its heads have one width, and which tools plan or cut it.

Every question about a kind is asked of this table (``kind_traits(name)``, or
``LayerSpec.kind``), not of its name; the kind's torch module is ``workers.models.kinds.ATTENTION``.
Adding a kind is its name in ``AttentionKind``, its row here and its module there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from arch.errors import ConfigError
from arch.names import ATTENTION_KINDS, AttentionKind

# How a kind computes its queries, keys and values from the input:
# - "qkv": a query, a key and a value map (keys and values on ``kv_heads`` heads per group);
# - "shared": one map per head whose output is query, key and value at once (MSSA);
# - "values": a value map only, mixed by a fixed matrix (MixiT: no queries, no keys);
# - "latent": a query map, and keys and values rebuilt from one low-rank latent per token.
Projections = Literal["qkv", "shared", "values", "latent"]
# What a decoder keeps of each token for the later ones: keys and values; the one shared
# projection (it is the key and the value); values only; the latent and the keys' RoPE parts.
KvCache = Literal["keys_values", "shared", "values", "latent"]
_CACHES: dict[Projections, KvCache] = {"qkv": "keys_values", "shared": "shared",
                                       "values": "values", "latent": "latent"}


class HeadShape(Protocol):
    """A head group's sizes (``arch.HeadGroup`` has them): ``count`` query heads of
    ``qk_dim`` (queries and keys) and ``v_dim`` (values), reading ``kv_heads`` key/value
    heads."""

    @property
    def count(self) -> int: ...

    @property
    def qk_dim(self) -> int: ...

    @property
    def v_dim(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...


@dataclass(frozen=True)
class KindTraits:
    """What an attention kind has.

    Attributes:
        name: the kind's registry name.
        summary: what it computes, with the paper it comes from.
        projections: how it computes queries, keys and values (``Projections``).
        frozen_qk: its query and key maps stay at initialisation.
        planned: the allocator plans its heads (a latent width is a compression's choice).
        cut_keys: a compression plan measures its query-key heads and lowers their ``qk_dim``.
        cut_values: a compression plan may lower its values' ``v_dim`` (the loss rule).
        to_latent: a compression may rebuild its keys and values from a latent (its keys and
            values are trained maps of the input, in one fused projection).
    """

    name: AttentionKind
    summary: str
    projections: Projections
    frozen_qk: bool = False
    planned: bool = True
    cut_keys: bool = False
    cut_values: bool = False
    to_latent: bool = False

    @property
    def cache(self) -> KvCache:
        """What a decoder caches of each token for a layer of this kind."""
        return _CACHES[self.projections]

    @property
    def queries_keys(self) -> bool:
        """Whether it computes attention logits from queries and keys (RoPE then applies,
        and its logits can be recorded)."""
        return self.projections != "values"

    @property
    def single_width(self) -> bool:
        """Whether its heads have one width (``qk_dim == v_dim``, a key/value head per query
        head): MSSA's one projection is query, key and value; MixiT has values only."""
        return self.projections in ("shared", "values")

    @property
    def grouped_kv(self) -> bool:
        """Whether query heads may share key/value heads (separate keys and values)."""
        return not self.single_width

    @property
    def input_biases(self) -> bool:
        """Whether its query/key/value maps may have biases (``bias`` / ``qkv_bias``)."""
        return not self.single_width

    @property
    def ties_output(self) -> bool:
        """Whether its output map may be its projection's transpose (``tied_output``)."""
        return self.projections == "shared"

    @property
    def latent(self) -> bool:
        """Whether a layer of it has a latent (``latent_dim``, ``rope_dim``,
        ``rotate_latent``); RoPE then turns each head's first ``rope_dim`` dims, not all."""
        return self.projections == "latent"

    def kv_units(self, heads: Iterable[HeadShape], latent_dim: int = 0,
                 rope_dim: int = 0, rope_shared: bool = False) -> int:
        """Units a decoder caches per token for a layer of this kind with head groups
        ``heads`` (and, latent layers, ``latent_dim`` and ``rope_dim``), what its torch
        module's ``cached`` returns per token:

        - ``keys_values``: each key/value head's key and value, ``kv_heads (qk_dim + v_dim)``;
        - ``shared``: each head's one projection, ``count * v_dim`` (key and value at once);
        - ``values``: each head's value, ``count * v_dim`` (the mixing needs no keys);
        - ``latent``: the layer's latent and every key/value head's RoPE part,
          ``latent_dim + kv_heads * rope_dim`` (``rope_shared``: one RoPE part per head group,
          ``latent_dim + groups * rope_dim``).
        """
        cache = self.cache
        if cache == "keys_values":
            return sum(g.kv_heads * (g.qk_dim + g.v_dim) for g in heads)
        if cache == "latent":
            groups = list(heads)
            rope_heads = len(groups) if rope_shared else sum(g.kv_heads for g in groups)
            return latent_dim + rope_heads * rope_dim
        return sum(g.count * g.v_dim for g in heads)


# One row per kind, in ``ATTENTION_KINDS``' order (tests/test_attention.py checks it).
KINDS: Mapping[str, KindTraits] = {t.name: t for t in (
    KindTraits("mhsa", "standard multi-head attention (Vaswani et al., 2017)", "qkv",
               cut_keys=True, cut_values=True, to_latent=True),
    KindTraits("mssa", "multi-head subspace self-attention: one basis per head is query, key "
               "and value (Wang et al., 2025)", "shared"),
    KindTraits("mixit", "random static attention A = I + W - rowmean(W) (Dong et al., 2025)",
               "values"),
    KindTraits("frozen_qk", "mhsa whose query/key maps stay at initialisation (Dong et al., "
               "2025)", "qkv", frozen_qk=True, cut_keys=True),
    KindTraits("latent", "keys and values rebuilt from one cached low-rank latent per token "
               "(DeepSeek-AI, 2024)", "latent", planned=False),
)}


def kind_traits(name: str) -> KindTraits:
    """The row of kind ``name``.

    Raises:
        ConfigError: not a kind; the message lists the kinds.
    """
    if name not in KINDS:
        raise ConfigError([f"attention = {name!r}: must be one of {', '.join(ATTENTION_KINDS)}"])
    return KINDS[name]


def kinds_where(test: Callable[[KindTraits], bool],
                among: Iterable[str] = ATTENTION_KINDS) -> tuple[AttentionKind, ...]:
    """The kinds (of ``among``) whose row passes ``test``, in the table's order."""
    wanted = set(among)
    return tuple(t.name for t in KINDS.values() if t.name in wanted and test(t))


def kinds_text(test: Callable[[KindTraits], bool],
               among: Iterable[str] = ATTENTION_KINDS) -> str:
    """``kinds_where`` for a message: ``mhsa, frozen_qk and latent``."""
    names = kinds_where(test, among)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
