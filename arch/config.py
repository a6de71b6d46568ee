"""The shared vocabulary: ``HeadGroup`` -> ``LayerSpec`` -> ``ArchConfig``.

Every component of the project (allocator, search spaces, workers, study records) describes a
candidate network with these frozen dataclasses. They validate on construction, collecting every
problem before raising, and own their serialisation: ``to_dict`` / ``from_dict`` (unknown keys
rejected with the list of valid ones), JSON and YAML, and a stable ``arch_id``.

Example:
    >>> arch = ArchConfig(d_model=512, input_dim=64, max_seq_len=256,
    ...                   layers=(LayerSpec("mhsa", (HeadGroup(8, 64),)),))
    >>> ArchConfig.from_yaml(arch.to_yaml()) == arch
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import yaml

from arch.checks import (
    ConfigError,
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
    need_number,
)
from common.files import dump_yaml, load_yaml

SCHEMA_VERSION = 1
# The vocabulary: each name set is a Literal type, and its tuple is derived from it.
AttentionKind = Literal["mhsa", "mssa", "mixit", "frozen_qk"]
Role = Literal["extract", "process"]
Positional = Literal["learned", "sinusoidal", "rope"]
Norm = Literal["layernorm", "rmsnorm"]
MlpKind = Literal["gelu", "gelu_tanh", "swiglu"]  # gelu_tanh: GPT-2's approximation
ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)
ROLES: tuple[Role, ...] = get_args(Role)
POSITIONALS: tuple[Positional, ...] = get_args(Positional)
NORMS: tuple[Norm, ...] = get_args(Norm)
MLP_KINDS: tuple[MlpKind, ...] = get_args(MlpKind)
# Attention kinds whose heads have one width: MSSA uses one basis as query, key and value;
# MixiT has no query/key at all. Their groups must have qk_dim == v_dim, so the allocator never
# reduces their qk_dim.
SINGLE_WIDTH_KINDS: frozenset[AttentionKind] = frozenset({"mssa", "mixit"})
# The widest model and the deepest the tools take (every size read from a file or a flag is
# bounded): d_model and depth.
MAX_WIDTH, MAX_DEPTH = 65_536, 1_024

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

    @property
    def kv_width(self) -> int:
        """Key plus value units per token: what a decoder caches, ``kv_heads (qk_dim + v_dim)``."""
        return self.kv_heads * (self.qk_dim + self.v_dim)

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
    """

    attention: AttentionKind
    heads: tuple[HeadGroup, ...]
    mlp_ratio: float = 0.0
    role: Role = "process"
    freeze_mlp: bool = False
    eta: float = 1.0
    tied_output: bool = False

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
        heads = v["heads"]
        if heads is None:
            pass
        elif not isinstance(heads, tuple) or not heads:
            problems.append(f"heads = {heads!r}: must be a non-empty list of head groups")
        elif not all(isinstance(g, HeadGroup) for g in heads):
            problems.append("heads: every entry must be a HeadGroup")
        elif v["attention"] in SINGLE_WIDTH_KINDS:
            for j, g in enumerate(heads):
                if g.qk_dim != g.v_dim:
                    problems.append(f"heads[{j}] = {g}: {v['attention']} heads have one width, "
                                    "so qk_dim must equal v_dim")
                if g.grouped:
                    problems.append(f"heads[{j}] = {g}: grouped key/value heads are for mhsa "
                                    f"and frozen_qk layers ({v['attention']} has no separate "
                                    "keys and values)")
        ratio = v["mlp_ratio"]
        if not is_number(ratio) or ratio < 0:
            problems.append(f"mlp_ratio = {ratio!r}: must be a number >= 0 (0 = no MLP)")
        need_choice(problems, "role", v["role"], ROLES)
        need_bool(problems, "freeze_mlp", v["freeze_mlp"])
        need_bool(problems, "tied_output", v["tied_output"])
        if v["freeze_mlp"] is True and ratio == 0:
            problems.append("freeze_mlp = True: needs an MLP (mlp_ratio > 0)")
        if v["tied_output"] is True and v["attention"] != "mssa":
            problems.append(f"tied_output = True: only valid for mssa, not {v['attention']!r}")
        if not is_number(v["eta"]) or v["eta"] <= 0:
            problems.append(f"eta = {v['eta']!r}: must be a number > 0")
        return problems

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
    def kv_width(self) -> int:
        """Key plus value units a decoder caches per token for this layer."""
        return sum(g.kv_width for g in self.heads)

    @property
    def heads_str(self) -> str:
        """Head groups as ``2x64+4x16/64``."""
        return "+".join(str(g) for g in self.heads)

    def to_dict(self) -> dict[str, Any]:
        return fields_to_dict(self)

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> LayerSpec:
        keys = field_names(cls)
        check_keys(data, keys, path)
        problems: list[str] = []
        heads_data = data.get("heads")
        heads: list[HeadGroup] = []
        if not isinstance(heads_data, list) or not heads_data:
            problems.append(f"{path}.heads = {heads_data!r}: must be a non-empty list of head "
                            "groups such as [{count: 8, qk_dim: 64}] or ['8x64']")
        else:
            for j, item in enumerate(heads_data):
                try:
                    heads.append(HeadGroup.from_dict(item, f"{path}.heads[{j}]"))
                except ConfigError as err:
                    problems.extend(err.problems)
        kwargs = {k: data[k] for k in keys if k in data and k != "heads"}
        if problems:  # report this layer's own problems too, not only its head groups'
            values = {**field_defaults(cls), "attention": None, **kwargs, "heads": None}
            problems += [f"{path}.{p}" for p in cls._problems(values)]
            raise ConfigError(problems)
        try:
            return cls(heads=tuple(heads), **kwargs)
        except ConfigError as err:
            raise ConfigError([f"{path}.{p}" for p in err.problems]) from None



@dataclass(frozen=True)
class ArchConfig:
    """A whole network: global fields plus one ``LayerSpec`` per layer (depth = ``len(layers)``).

    Exactly one of ``vocab_size`` (token inputs: embedding + LM head) and ``input_dim`` (vector
    inputs: linear in/out, ``output_dim`` defaulting to ``input_dim``) is set.
    """

    d_model: int
    layers: tuple[LayerSpec, ...]
    max_seq_len: int
    vocab_size: int | None = None
    input_dim: int | None = None
    output_dim: int | None = None
    causal: bool = True
    positional: Positional = "learned"
    norm: Norm = "layernorm"
    mlp: MlpKind = "gelu"
    tie_embeddings: bool = False
    bias: bool = False  # biases on the attention and MLP maps (the GPT-2 layout)
    qkv_bias: bool = False  # biases on the query, key and value maps only (Qwen2)
    rope_theta: float = 10000.0  # RoPE's base: pair i turns by theta ** (-2i / qk_dim) a step
    norm_eps: float | None = None  # the norms' epsilon (None: torch's default for the kind)
    seed: int = 0
    schema_version: int = SCHEMA_VERSION
    # Derived, excluded from equality and serialisation.
    arch_id: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        if is_int(self.rope_theta):
            object.__setattr__(self, "rope_theta", float(self.rope_theta))
        if self.output_dim is None and self.vocab_size is None and self.input_dim is not None:
            object.__setattr__(self, "output_dim", self.input_dim)
        problems = self._problems(field_values(self))
        if problems:
            raise ConfigError(problems)
        digest = hashlib.sha256(self.to_json().encode()).hexdigest()
        object.__setattr__(self, "arch_id", digest[:16])

    @staticmethod
    def _problems(v: dict[str, Any]) -> list[str]:
        """Problems of the field values ``v``; ``v["layers"] is None`` when already reported."""
        problems: list[str] = []
        need_int(problems, "d_model", v["d_model"], 1)
        need_int(problems, "max_seq_len", v["max_seq_len"], 1)
        need_int(problems, "seed", v["seed"], 0)
        if v["schema_version"] != SCHEMA_VERSION:
            problems.append(f"schema_version = {v['schema_version']!r}: this code reads "
                            f"version {SCHEMA_VERSION}")
        need_choice(problems, "positional", v["positional"], POSITIONALS)
        need_choice(problems, "norm", v["norm"], NORMS)
        need_choice(problems, "mlp", v["mlp"], MLP_KINDS)
        need_bool(problems, "causal", v["causal"])
        need_bool(problems, "tie_embeddings", v["tie_embeddings"])
        need_bool(problems, "bias", v["bias"])
        need_bool(problems, "qkv_bias", v["qkv_bias"])
        if v["qkv_bias"] is True and v["bias"] is True:
            problems.append("qkv_bias = True: bias = true already puts biases on the query, key "
                            "and value maps; set one of them")
        need_number(problems, "rope_theta", v["rope_theta"], 0.0, strict=True)
        if v["norm_eps"] is not None:
            need_number(problems, "norm_eps", v["norm_eps"], 0.0, 1.0, strict=True)
        problems += _io_problems(v)
        layers = v["layers"]
        if layers is None:
            pass
        elif not isinstance(layers, tuple) or not layers:
            problems.append("layers: must be a non-empty list of layer specs")
        elif not all(isinstance(layer, LayerSpec) for layer in layers):
            problems.append("layers: every entry must be a LayerSpec")
        else:
            problems += _cross_layer_problems(v["d_model"], v["positional"], layers)
            for flag in ("bias", "qkv_bias"):
                if v[flag] is True:
                    problems += [f"layers[{i}].attention = {x.attention!r}: {flag} = true is "
                                 "for mhsa and frozen_qk layers"
                                 for i, x in enumerate(layers)
                                 if x.attention in SINGLE_WIDTH_KINDS]
        return problems

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def token_inputs(self) -> bool:
        return self.vocab_size is not None

    def describe(self) -> str:
        """One line per layer: ``mhsa 4x16 mlp4 | mssa 2x32``."""
        return " | ".join(f"{x.attention} {x.heads_str}" + (f" mlp{x.mlp_ratio:g}" if x.mlp_ratio
                                                             else "") for x in self.layers)

    @property
    def kv_width(self) -> int:
        """Key plus value units a decoder caches per token, summed over layers (MixiT layers
        cache values only; MSSA's one projection serves as key and value)."""
        return sum(_layer_kv_width(layer) for layer in self.layers)

    def mlp_hidden(self, layer: LayerSpec) -> int:
        """MLP hidden units of ``layer`` (0 for an attention-only layer)."""
        return round(layer.mlp_ratio * self.d_model)

    def to_dict(self) -> dict[str, Any]:
        """Canonical dict: every field explicit (but fields added after the canonical form was
        fixed, at their default: ``arch_id`` must not drift), ``arch_id`` excluded, layers
        last."""
        data = fields_to_dict(self)
        for name, default in _LATER_FIELDS.items():
            if data[name] == default:
                del data[name]
        data["layers"] = data.pop("layers")
        return data

    @classmethod
    def from_dict(cls, data: Any) -> ArchConfig:
        """Build from a dict, collecting every problem; unknown keys list the valid ones."""
        keys = field_names(cls)
        check_keys(data, keys, "")
        problems: list[str] = []
        layers: list[LayerSpec] = []
        layers_data = data.get("layers")
        if not isinstance(layers_data, list) or not layers_data:
            problems.append(f"layers = {layers_data!r}: must be a non-empty list of layer specs")
        else:
            for i, item in enumerate(layers_data):
                try:
                    layers.append(LayerSpec.from_dict(item, f"layers[{i}]"))
                except ConfigError as err:
                    problems.extend(err.problems)
        kwargs = {k: data[k] for k in keys if k in data and k != "layers"}
        if problems:  # report the global fields' problems too, not only the layers'
            values = {**field_defaults(cls), "d_model": None, "max_seq_len": None, **kwargs}
            if values["output_dim"] is None and values["vocab_size"] is None:
                values["output_dim"] = values["input_dim"]
            problems += cls._problems({**values, "layers": None})
            raise ConfigError(problems)
        return cls(layers=tuple(layers), **kwargs)

    def with_io(self, io: ModelIO) -> ArchConfig:
        """The same layers wired to ``io`` (a task's length, inputs and outputs)."""
        return dataclasses.replace(self, **io.fields(self.tie_embeddings))

    def to_json(self, indent: int | None = None) -> str:
        separators = (",", ":") if indent is None else None
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent, separators=separators)

    @classmethod
    def from_json(cls, text: str) -> ArchConfig:
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict())

    @classmethod
    def from_yaml(cls, text: str) -> ArchConfig:
        try:
            data = load_yaml(text)
        except yaml.YAMLError as err:
            raise ConfigError([f"not valid YAML ({str(err).splitlines()[0]})"]) from None
        if isinstance(data, dict) and "arch" in data and "d_model" not in data:
            data = data["arch"]  # accept the allocator's full JSON/YAML report too
        return cls.from_dict(data)


# Fields added to ArchConfig after its canonical form (and so every arch_id) was fixed: left
# out of the canonical dict at their default.
_LATER_FIELDS: dict[str, Any] = {"bias": False, "qkv_bias": False, "rope_theta": 10000.0,
                                 "norm_eps": None}


@dataclass(frozen=True)
class ModelIO:
    """What a task fixes in an ``ArchConfig``: the sequence length and the input/output maps.

    Exactly one of ``vocab_size`` (token model) and ``input_dim`` (vector model) is set. The
    search builds every trial's architecture with the task's ``ModelIO`` before recording it, so
    the study holds the model that is trained.
    """

    max_seq_len: int
    vocab_size: int | None = None
    input_dim: int | None = None
    output_dim: int | None = None

    def fields(self, tie_embeddings: bool = False) -> dict[str, Any]:
        """The ``ArchConfig`` keyword arguments this fixes (weight tying only for tokens)."""
        tokens = self.vocab_size is not None
        return {"max_seq_len": self.max_seq_len, "vocab_size": self.vocab_size,
                "input_dim": None if tokens else self.input_dim,
                "output_dim": None if tokens else self.output_dim,
                "tie_embeddings": tie_embeddings and tokens}


def _layer_kv_width(layer: LayerSpec) -> int:
    return layer.width if layer.attention in SINGLE_WIDTH_KINDS else layer.kv_width


def _io_problems(v: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    vocab, input_dim, output_dim = v["vocab_size"], v["input_dim"], v["output_dim"]
    if (vocab is None) == (input_dim is None):
        problems.append(f"vocab_size = {vocab!r}, input_dim = {input_dim!r}: "
                        "set exactly one (tokens or vectors)")
    if vocab is not None:
        need_int(problems, "vocab_size", vocab, 1)
        if output_dim is not None:
            problems.append(f"output_dim = {output_dim!r}: only for vector inputs "
                            "(input_dim); token models predict vocab_size logits")
    if input_dim is not None:
        need_int(problems, "input_dim", input_dim, 1)
        need_int(problems, "output_dim", output_dim, 1)
        if v["tie_embeddings"] is True:
            problems.append("tie_embeddings = True: only for token inputs (vocab_size)")
    return problems


def _cross_layer_problems(d_model: Any, positional: Any,
                          layers: tuple[LayerSpec, ...]) -> list[str]:
    problems: list[str] = []
    for i, layer in enumerate(layers):
        hidden = layer.mlp_ratio * d_model if is_int(d_model) else 0.0
        if abs(hidden - round(hidden)) > 1e-9:
            problems.append(f"layers[{i}].mlp_ratio = {layer.mlp_ratio!r}: mlp_ratio * "
                            f"d_model = {hidden:g} must be a whole number of units")
        if positional == "rope" and layer.attention == "mixit":
            problems.append(f"layers[{i}].attention = 'mixit': RoPE is not offered for mixit "
                            "(it has no queries or keys); use positional: learned")
        if positional == "rope" and any(g.qk_dim % 2 for g in layer.heads):
            problems.append(f"layers[{i}].heads = {layer.heads_str}: RoPE needs even qk_dim")
    return problems
