"""Head groups and layers: ``HeadGroup`` (query heads sharing dims, reading key/value heads) and
``LayerSpec`` (an attention kind with its head groups and an optional MLP), validated on
construction and owning their serialisation (docs/architecture.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from arch.checks import (
    check_keys,
    field_defaults,
    field_names,
    field_values,
    fields_to_dict,
    is_int,
    is_number,
    need_bool,
    need_choice,
    need_int,
    parse_items,
)
from arch.errors import ConfigError
from arch.kinds import KINDS, KindTraits, kind_traits, kinds_text
from arch.names import ATTENTION_KINDS, MAX_WIDTH, ROLES, AttentionKind, Role

_SHORTHAND = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*(?:/\s*(\d+))?\s*(?:kv\s*(\d+))?\s*$")


@dataclass(frozen=True)
class HeadGroup:
    """``count`` query heads sharing a query/key dimension ``qk_dim`` and a value dimension
    ``v_dim``, reading ``kv_heads`` key/value heads (grouped-query attention, Ainslie et al.,
    2023: each key/value head serves ``count / kv_heads`` consecutive query heads).

    ``v_dim = 0`` (the default) means "same as ``qk_dim``" and ``kv_heads = 0`` "one per query
    head" (standard attention); both are resolved on construction.
    """

    count: int
    qk_dim: int
    v_dim: int = 0
    kv_heads: int = 0

    def __post_init__(self) -> None:
        if self.v_dim == 0 and is_int(self.qk_dim):
            object.__setattr__(self, "v_dim", self.qk_dim)
        if self.kv_heads == 0 and is_int(self.count):
            object.__setattr__(self, "kv_heads", self.count)
        problems: list[str] = []
        need_int(problems, "count", self.count, 1)
        need_int(problems, "qk_dim", self.qk_dim, 1)
        need_int(problems, "v_dim", self.v_dim, 1)
        need_int(problems, "kv_heads", self.kv_heads, 1)
        if not problems and self.count % self.kv_heads:
            problems.append(f"kv_heads = {self.kv_heads}: must divide count = {self.count} "
                            "(each key/value head serves the same number of query heads)")
        if problems:
            raise ConfigError(problems)

    @property
    def width(self) -> int:
        """Attention width of the group: ``count * v_dim``."""
        return self.count * self.v_dim

    @property
    def grouped(self) -> bool:
        """True when key/value heads are shared (fewer than query heads)."""
        return self.kv_heads < self.count

    def __str__(self) -> str:
        dims = f"{self.qk_dim}" if self.qk_dim == self.v_dim else f"{self.qk_dim}/{self.v_dim}"
        return f"{self.count}x{dims}" + (f"kv{self.kv_heads}" if self.grouped else "")

    def to_dict(self) -> dict[str, int]:
        """Every field, but ``kv_heads`` only when grouped (ungrouped groups keep the canonical
        form, and so the ``arch_id``, they had before grouped-query attention existed)."""
        data = fields_to_dict(self)
        if not self.grouped:
            del data["kv_heads"]
        return data

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> HeadGroup:
        """Build from ``{count, qk_dim[, v_dim][, kv_heads]}`` or the shorthand ``"8x64"`` /
        ``"4x16/64"`` / ``"8x64kv2"``."""
        if isinstance(data, str):
            match = _SHORTHAND.match(data)
            if not match:
                raise ConfigError([f"{path} = {data!r}: a head group string must look like "
                                   "'8x64' (count x dim), '4x16/64' (count x qk_dim/v_dim) or "
                                   "'8x64kv2' (8 query heads reading 2 key/value heads)"])
            count, qk, v, kv = match.groups()
            data = {"count": int(count), "qk_dim": int(qk), "v_dim": int(v or qk),
                    "kv_heads": int(kv or 0)}
        check_keys(data, field_names(cls), path)
        try:
            return cls(data.get("count"), data.get("qk_dim"), data.get("v_dim", 0),
                       data.get("kv_heads", 0))
        except ConfigError as err:
            raise ConfigError([f"{path}.{p}" for p in err.problems]) from None


def merge_groups(groups: Iterable[HeadGroup]) -> tuple[HeadGroup, ...]:
    """The canonical form of a layer's head groups: groups of identical dims and query heads
    per key/value head merged, ordered by decreasing v_dim, qk_dim, then sharing (the model
    computes the same function in any order)."""
    counts: dict[tuple[int, int, int], tuple[int, int]] = {}
    for g in groups:
        key = (g.qk_dim, g.v_dim, g.count // g.kv_heads)
        count, kv = counts.get(key, (0, 0))
        counts[key] = (count + g.count, kv + g.kv_heads)
    ordered = sorted(counts.items(), key=lambda item: (-item[0][1], -item[0][0], item[0][2]))
    return tuple(HeadGroup(c, qk, v, kv) for (qk, v, _), (c, kv) in ordered)


@dataclass(frozen=True)
class LayerSpec:
    """One residual block: an attention kind with its head groups, and an optional MLP.

    Attributes:
        attention: registry name, one of ``ATTENTION_KINDS``.
        heads: the head groups; the layer's attention width is ``sum(count * v_dim)``.
        mlp_ratio: MLP hidden size over ``d_model``; 0 makes an attention-only (AoT) layer.
        role: ``extract`` or ``process`` (informational, set by the allocator).
        freeze_mlp: keep the MLP weights at initialisation (Frozen-MLP, docs/theory.md §8).
        eta: residual step size, ``h = h + eta * Attn(Norm(h))`` (docs/theory.md §7).
        tied_output: MSSA only; output map ``[U_1..U_K]`` instead of a separate projection.
        latent_dim: latent layers only: the units of the one latent a decoder caches per token
            for the whole layer, from which every key's latent part and every value are
            reconstructed (multi-head latent attention, docs/theory.md §10.5).
        rope_dim: latent layers only: the first ``rope_dim`` dims of every query and key head
            are computed from the input directly and turned by RoPE (the keys' part is cached
            beside the latent); the other ``qk_dim - rope_dim`` come from the latent.
        rotate_latent: latent layers only: turn the keys' latent part by RoPE too, after it
            is reconstructed (low-rank keys that keep every rotation, as Palu does).
        rope_shared: latent layers only: the RoPE part is one key head per head group, shared
            by every query head of the group (multi-head latent attention's decoupled key),
            instead of one per key/value head; a decoder caches ``rope_dim`` units per group.
    """

    attention: AttentionKind
    heads: tuple[HeadGroup, ...]
    mlp_ratio: float = 0.0
    role: Role = "process"
    freeze_mlp: bool = False
    eta: float = 1.0
    tied_output: bool = False
    latent_dim: int = 0
    rope_dim: int = 0
    rotate_latent: bool = False
    rope_shared: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.heads, list):
            object.__setattr__(self, "heads", tuple(self.heads))
        if is_int(self.mlp_ratio):
            object.__setattr__(self, "mlp_ratio", float(self.mlp_ratio))
        if is_int(self.eta):
            object.__setattr__(self, "eta", float(self.eta))
        problems = self._problems(field_values(self))
        if problems:
            raise ConfigError(problems)

    @staticmethod
    def _problems(v: dict[str, Any]) -> list[str]:
        """Problems of the field values ``v``; ``v["heads"] is None`` when already reported."""
        problems: list[str] = []
        need_choice(problems, "attention", v["attention"], ATTENTION_KINDS)
        kind = KINDS.get(v["attention"]) if isinstance(v["attention"], str) else None
        heads = v["heads"]
        if heads is None:
            pass
        elif not isinstance(heads, tuple) or not heads:
            problems.append(f"heads = {heads!r}: must be a non-empty list of head groups")
        elif not all(isinstance(g, HeadGroup) for g in heads):
            problems.append("heads: every entry must be a HeadGroup")
        elif kind is not None and kind.single_width:
            for j, g in enumerate(heads):
                if g.qk_dim != g.v_dim:
                    problems.append(f"heads[{j}] = {g}: {v['attention']} heads have one width, "
                                    "so qk_dim must equal v_dim")
                if g.grouped:
                    problems.append(f"heads[{j}] = {g}: grouped key/value heads are for "
                                    f"{GROUPED_KV_KINDS} layers ({v['attention']} has no "
                                    "separate keys and values)")
        ratio = v["mlp_ratio"]
        if not is_number(ratio) or ratio < 0:
            problems.append(f"mlp_ratio = {ratio!r}: must be a number >= 0 (0 = no MLP)")
        need_choice(problems, "role", v["role"], ROLES)
        need_bool(problems, "freeze_mlp", v["freeze_mlp"])
        need_bool(problems, "tied_output", v["tied_output"])
        if v["freeze_mlp"] is True and ratio == 0:
            problems.append("freeze_mlp = True: needs an MLP (mlp_ratio > 0)")
        if v["tied_output"] is True and not (kind is not None and kind.ties_output):
            problems.append(f"tied_output = True: only valid for "
                            f"{kinds_text(lambda t: t.ties_output)}, not "
                            f"{v['attention']!r}")
        if not is_number(v["eta"]) or v["eta"] <= 0:
            problems.append(f"eta = {v['eta']!r}: must be a number > 0")
        return problems + _latent_problems(v, kind)

    @property
    def width(self) -> int:
        """Attention width ``sum(count * v_dim)``; may differ from ``d_model``."""
        return sum(g.width for g in self.heads)

    @property
    def n_heads(self) -> int:
        return sum(g.count for g in self.heads)

    @property
    def n_groups(self) -> int:
        return len(self.heads)

    @property
    def kv_heads(self) -> int:
        """Key/value heads of the layer (its query heads without grouped-query attention)."""
        return sum(g.kv_heads for g in self.heads)

    @property
    def kind(self) -> KindTraits:
        """What the layer's attention kind has (``arch.kinds``)."""
        return kind_traits(self.attention)

    @property
    def kv_width(self) -> int:
        """Units a decoder caches per token for this layer: keys and values, MSSA's one
        projection, MixiT's values, or a latent layer's latent and keys' RoPE parts (the
        kind's ``KindTraits.kv_units``)."""
        return self.kind.kv_units(self.heads, self.latent_dim, self.rope_dim, self.rope_shared)

    @property
    def heads_str(self) -> str:
        """Head groups as ``2x64+4x16/64``."""
        return "+".join(str(g) for g in self.heads)

    def to_dict(self) -> dict[str, Any]:
        """Every field, but those added after the canonical form was fixed only when set (the
        ``arch_id`` of every other layer must not drift)."""
        data = fields_to_dict(self)
        for name, default in _LATER_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> LayerSpec:
        keys = field_names(cls)
        check_keys(data, keys, path)
        problems: list[str] = []
        heads = parse_items(problems, data.get("heads"), f"{path}.heads", HeadGroup.from_dict,
                            "must be a non-empty list of head groups such as "
                            "[{count: 8, qk_dim: 64}] or ['8x64']")
        kwargs = {k: data[k] for k in keys if k in data and k != "heads"}
        if problems:  # report this layer's own problems too, not only its head groups'
            values = {**field_defaults(cls), "attention": None, **kwargs, "heads": None}
            problems += [f"{path}.{p}" for p in cls._problems(values)]
            raise ConfigError(problems)
        try:
            return cls(heads=tuple(heads), **kwargs)
        except ConfigError as err:
            raise ConfigError([f"{path}.{p}" for p in err.problems]) from None


# Kinds whose query heads may share key/value heads, for messages.
GROUPED_KV_KINDS = kinds_text(lambda t: t.grouped_kv)
# Fields added to LayerSpec after its canonical form was fixed: left out at their default.
_LATER_FIELDS: dict[str, Any] = {"latent_dim": 0, "rope_dim": 0, "rotate_latent": False,
                                 "rope_shared": False}


def _latent_problems(v: dict[str, Any], kind: KindTraits | None) -> list[str]:
    """Problems of a layer's latent fields: set on latent layers only, with a latent of at
    least one unit and a RoPE part that fits every head in whole pairs."""
    problems: list[str] = []
    latent = kind is not None and kind.latent
    need_int(problems, "latent_dim", v["latent_dim"], 1 if latent else 0, MAX_WIDTH)
    need_int(problems, "rope_dim", v["rope_dim"], 0)
    need_bool(problems, "rotate_latent", v["rotate_latent"])
    need_bool(problems, "rope_shared", v["rope_shared"])
    if problems:
        return problems
    if not latent:
        return [f"{name} = {v[name]!r}: only for latent layers, not {v['attention']!r}"
                for name in _LATER_FIELDS if v[name] != _LATER_FIELDS[name]]
    if v["rope_dim"] % 2:
        problems.append(f"rope_dim = {v['rope_dim']}: must be even (RoPE turns pairs of dims)")
    if v["rope_shared"] and (not v["rope_dim"] or v["rotate_latent"]):
        problems.append("rope_shared = True: needs a RoPE part (rope_dim > 0) and no "
                        "rotate_latent (the latent part is then unturned)")
    heads = v["heads"]
    if isinstance(heads, tuple) and all(isinstance(g, HeadGroup) for g in heads):
        for j, g in enumerate(heads):
            if v["rope_dim"] > g.qk_dim:
                problems.append(f"rope_dim = {v['rope_dim']}: must not exceed heads[{j}]'s "
                                f"qk_dim = {g.qk_dim}")
            elif v["rotate_latent"] and (g.qk_dim - v["rope_dim"]) % 2:
                problems.append(f"heads[{j}] = {g}: with rotate_latent, qk_dim - rope_dim "
                                "must be even (RoPE turns pairs of dims)")
    return problems
