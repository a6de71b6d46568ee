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
from dataclasses import dataclass, field
from typing import Any

import yaml

from arch.checks import (
    check_keys,
    field_defaults,
    field_names,
    field_values,
    fields_to_dict,
    is_int,
    need_bool,
    need_choice,
    need_int,
    need_number,
    parse_items,
)
from arch.errors import ConfigError
from arch.kinds import kinds_text
from arch.layers import LayerSpec
from arch.names import (
    MLP_KINDS,
    NORMS,
    POSITIONALS,
    SCHEMA_VERSION,
    MlpKind,
    Norm,
    Positional,
)
from common.files import dump_yaml, load_yaml


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
                                 f"for {_BIASED_KINDS} layers"
                                 for i, x in enumerate(layers) if not x.kind.input_biases]
        return problems

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def token_inputs(self) -> bool:
        return self.vocab_size is not None

    def describe(self) -> str:
        """One line per layer: ``mhsa 4x16 mlp4 | mssa 2x32 | latent 4x16kv2 c24 rope8``."""
        return " | ".join(f"{x.attention} {x.heads_str}" + _latent_str(x)
                          + (f" mlp{x.mlp_ratio:g}" if x.mlp_ratio else "") for x in self.layers)

    @property
    def kv_width(self) -> int:
        """Units a decoder caches per token, summed over layers (``LayerSpec.kv_width``: keys
        and values; MSSA's one projection, which serves as key and value; MixiT's values; a
        latent layer's latent and keys' RoPE parts)."""
        return sum(layer.kv_width for layer in self.layers)

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
        layers = parse_items(problems, data.get("layers"), "layers", LayerSpec.from_dict,
                             "must be a non-empty list of layer specs")
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


# Kinds whose query/key/value maps may have biases, for messages.
_BIASED_KINDS = kinds_text(lambda t: t.input_biases)
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


def _latent_str(layer: LayerSpec) -> str:
    """`` c24 rope8`` for a latent layer (latent units, RoPE dims), else nothing."""
    if not layer.kind.latent:
        return ""
    return (f" c{layer.latent_dim}" + (f" rope{layer.rope_dim}" if layer.rope_dim else "")
            + (" shared" if layer.rope_shared else "")
            + (" rotated" if layer.rotate_latent else ""))


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
        if positional == "rope" and not layer.kind.queries_keys:
            problems.append(f"layers[{i}].attention = {layer.attention!r}: RoPE is not offered "
                            f"for {layer.attention} (it has no queries or keys); use "
                            "positional: learned")
        if positional == "rope" and not layer.kind.latent and any(
                g.qk_dim % 2 for g in layer.heads):
            problems.append(f"layers[{i}].heads = {layer.heads_str}: RoPE needs even qk_dim")
        if positional != "rope" and (layer.rope_dim or layer.rotate_latent):
            field = "rope_dim" if layer.rope_dim else "rotate_latent"
            problems.append(f"layers[{i}].{field} = {getattr(layer, field)!r}: needs "
                            f"positional: rope, not {positional!r}")
    return problems
