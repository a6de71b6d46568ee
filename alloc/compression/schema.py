"""The compression plan as data: ``CompressionPlan`` (per layer, each head group's decision with
the error of every candidate ``qk_dim``, and the student it describes), written and read as YAML
with ``to_dict`` / ``from_dict`` / ``to_yaml`` / ``from_yaml``. Making a plan is
``alloc.compression.planner``'s job; showing one, ``alloc.compression.render``'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from alloc.compression.forms import RULES, Rule, StudentForm, form_of
from alloc.compression.measurement import HeadStats
from alloc.errors import CompressionError
from arch import ArchConfig, ConfigError, HeadGroup, KindTraits, kind_traits
from common.files import dump_yaml, load_yaml


@dataclass(frozen=True)
class GroupPlan:
    """One head group's decision: ``qk_dim`` -> ``reduced_qk_dim``, with the error bound and
    the measured error of every candidate (the worst head of the group); with the loss rule,
    also ``v_dim`` -> ``reduced_v_dim`` and each candidate ``v_dim``'s loss increase."""

    count: int
    qk_dim: int
    v_dim: int
    reduced_qk_dim: int
    error_bounds: Mapping[int, float]
    measured_errors: Mapping[int, float] | None = None
    loss_increases: Mapping[int, float] | None = None
    kv_heads: int = 0  # 0 (a plan written before grouped-query attention): one per query head
    reduced_v_dim: int = 0  # 0: the values are not planned (kept at v_dim)
    value_losses: Mapping[int, float] | None = None  # candidate v_dim -> loss increase

    @property
    def student_v_dim(self) -> int:
        return self.reduced_v_dim or self.v_dim

    @property
    def value_loss(self) -> float | None:
        return None if self.value_losses is None else self.value_losses[self.student_v_dim]

    @property
    def teacher(self) -> HeadGroup:
        """The teacher's head group."""
        return HeadGroup(self.count, self.qk_dim, self.v_dim, self.key_heads)

    @property
    def student(self) -> HeadGroup:
        """The student's head group: the chosen ``qk_dim`` and ``v_dim``."""
        return HeadGroup(self.count, self.reduced_qk_dim, self.student_v_dim, self.key_heads)

    @property
    def key_heads(self) -> int:
        """Key/value heads: what each unit of ``qk_dim`` costs in the KV cache."""
        return self.kv_heads or self.count

    @property
    def error_bound(self) -> float:
        return self.error_bounds[self.reduced_qk_dim]

    @property
    def measured_error(self) -> float | None:
        return None if self.measured_errors is None else self.measured_errors[self.reduced_qk_dim]

    @property
    def loss_increase(self) -> float | None:
        return None if self.loss_increases is None else self.loss_increases[self.reduced_qk_dim]

    def errors(self, rule: Rule) -> Mapping[int, float]:
        """Each candidate's error under ``rule`` (the bound's when nothing was measured)."""
        chosen = {"measured": self.measured_errors, "loss": self.loss_increases}.get(rule)
        return chosen if chosen is not None else self.error_bounds


@dataclass(frozen=True)
class HeadSpectrum:
    """A head's spectrum (a RoPE head's pair bounds, in its ``pairs`` order) as planned."""

    group: int
    head: int
    sigma: tuple[float, ...]
    effective_rank: int
    pairs: tuple[int, ...] = ()  # RoPE: the frequency pairs a student keeps, in order


@dataclass(frozen=True)
class LayerPlan:
    """A layer of the plan: what was measured and each head group's decision."""

    index: int
    attention: str
    heads: str  # the teacher's head groups, e.g. "4x16"
    token_norm: float
    groups: tuple[GroupPlan, ...] = ()
    spectra: tuple[HeadSpectrum, ...] = ()
    head_stats: tuple[HeadStats, ...] = ()
    input_scale: tuple[float, ...] = ()  # the values' or latent's SVD weights (RMS per feature)
    latent_dim: int = 0  # > 0: the student's layer is latent, caching this many units per token
    latent_losses: Mapping[int, float] | None = None  # candidate latent width -> loss increase
    rope_dim: int = 0  # a latent layer's decoupled RoPE part per key/value head (0: none)

    @property
    def latent_loss(self) -> float | None:
        return None if not self.latent_dim or self.latent_losses is None else \
            self.latent_losses[self.latent_dim]

    @property
    def kind(self) -> KindTraits:
        """What the teacher layer's attention kind has."""
        return kind_traits(self.attention)

    @property
    def teacher_kv_units(self) -> int:
        """Units the teacher's query-key groups of this layer cache per token."""
        return self.kind.kv_units(g.teacher for g in self.groups)

    @property
    def student_kv_units(self) -> int:
        """Units the student's query-key groups of this layer cache per token, at the planned
        ``qk_dim`` and ``v_dim`` (where the plan makes the layer latent, it caches its
        ``latent_dim`` and RoPE parts instead: ``LayerSpec.kv_width`` of the student's)."""
        return self.kind.kv_units(g.student for g in self.groups)

    @property
    def logit_bound(self) -> float | None:
        return max(s.logit_bound for s in self.head_stats) if self.head_stats else None

    @property
    def entropy(self) -> float | None:
        if not self.head_stats:
            return None
        return float(np.mean([s.entropy for s in self.head_stats]))


@dataclass(frozen=True)
class CompressionPlan:
    """The per-layer ``qk_dim`` plan of one checkpoint and the student it describes."""

    arch_id: str  # the teacher's
    seq_len: int
    tolerance: float
    align: int
    rule: Rule
    layers: tuple[LayerPlan, ...]
    student: ArchConfig
    sample: str | None = None
    checkpoint: str = ""
    layout: str = ""
    kv_cache: float | None = None  # planned under this KV cache budget (tolerance: the worst)
    # how a latent student's maps are fitted: "" the SVD weighted by the inputs' RMS (ASVD's
    # scaling), "curvature" the second-order fit of docs/theory.md §10.6, whose factors are
    # in the file ``factors`` names (beside the plan)
    latent_fit: str = ""
    factors: str = ""

    @property
    def measured(self) -> bool:
        return self.sample is not None

    @property
    def reduces(self) -> bool:
        """Whether any head group's ``qk_dim`` or ``v_dim`` is lowered, or a latent layer
        caches less than its teacher."""
        return any(g.reduced_qk_dim < g.qk_dim or g.student_v_dim < g.v_dim
                   for layer in self.layers for g in layer.groups) or any(
            0 < layer.latent_dim < layer.teacher_kv_units for layer in self.layers)

    @property
    def form(self) -> StudentForm:
        """The student's form (``alloc.compression.forms``): latent where its planned layers
        are (docs/theory.md §10.5), with a decoupled RoPE part where they keep one."""
        return form_of(any(layer.latent_dim for layer in self.layers),
                       max((layer.rope_dim for layer in self.layers), default=0))

    def input_scales(self) -> dict[int, tuple[float, ...]]:
        """Layer -> its attention inputs' RMS per feature, where the values or a latent were
        planned."""
        return {layer.index: layer.input_scale for layer in self.layers if layer.input_scale}

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["student"] = self.student.to_dict()
        for layer, plan in zip(data["layers"], self.layers):
            layer["logit_bound"], layer["entropy"] = plan.logit_bound, plan.entropy
            layer["latent_loss"] = plan.latent_loss
            for group, decided in zip(layer["groups"], plan.groups):
                group["error_bound"] = decided.error_bound
                group["measured_error"] = decided.measured_error
                group["loss_increase"] = decided.loss_increase
                group["value_loss"] = decided.value_loss
        return _plain(data)

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any) -> CompressionPlan:
        """The plan ``to_dict`` wrote (derived keys are ignored).

        Raises:
            CompressionError: not such a plan.
        """
        try:
            layers = tuple(_layer_from_dict(x) for x in data["layers"])
            return cls(arch_id=str(data["arch_id"]), seq_len=int(data["seq_len"]),
                       tolerance=float(data["tolerance"]), align=int(data["align"]),
                       rule=_rule(data["rule"]), layers=layers,
                       student=ArchConfig.from_dict(data["student"]), sample=data.get("sample"),
                       checkpoint=str(data.get("checkpoint", "")),
                       layout=str(data.get("layout", "")),
                       kv_cache=None if data.get("kv_cache") is None else float(data["kv_cache"]),
                       latent_fit=_latent_fit(data.get("latent_fit", "")),
                       factors=str(data.get("factors", "")))
        except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as err:
            what = f"missing key {err}" if isinstance(err, KeyError) else str(err)
            raise CompressionError(f"not a checkpoint profile ({what.splitlines()[0]})") \
                from None

    @classmethod
    def from_yaml(cls, text: str) -> CompressionPlan:
        try:
            data = load_yaml(text)
        except yaml.YAMLError as err:
            raise CompressionError(f"not YAML ({str(err).splitlines()[0]})") from None
        return cls.from_dict(data)


LATENT_FITS = ("", "curvature")


def _latent_fit(value: Any) -> str:
    if value not in LATENT_FITS:
        raise ValueError(f"latent_fit {value!r}: must be one of {LATENT_FITS}")
    return str(value)


def _rule(value: Any) -> Rule:
    if value not in RULES:
        raise ValueError(f"rule {value!r}: must be one of {', '.join(RULES)}")
    rule: Rule = value
    return rule


def _layer_from_dict(data: Mapping[str, Any]) -> LayerPlan:
    def by_rank(values: Mapping[Any, float] | None) -> dict[int, float] | None:
        return None if values is None else {int(r): float(e) for r, e in values.items()}

    groups = tuple(GroupPlan(int(g["count"]), int(g["qk_dim"]), int(g["v_dim"]),
                             int(g["reduced_qk_dim"]), by_rank(g["error_bounds"]) or {},
                             by_rank(g.get("measured_errors")), by_rank(g.get("loss_increases")),
                             int(g.get("kv_heads", g["count"])), int(g.get("reduced_v_dim", 0)),
                             by_rank(g.get("value_losses")))
                   for g in data["groups"])
    spectra = tuple(HeadSpectrum(int(s["group"]), int(s["head"]),
                                 tuple(float(v) for v in s["sigma"]), int(s["effective_rank"]),
                                 tuple(int(p) for p in s.get("pairs", ())))
                    for s in data.get("spectra", ()))
    stats = tuple(HeadStats(float(s["logit_bound"]), float(s["entropy"]))
                  for s in data.get("head_stats", ()))
    kind = kind_traits(str(data["attention"]))  # a kind the vocabulary knows
    return LayerPlan(int(data["index"]), kind.name, str(data["heads"]),
                     float(data["token_norm"]), groups, spectra, stats,
                     tuple(float(v) for v in data.get("input_scale", ())),
                     int(data.get("latent_dim", 0)), by_rank(data.get("latent_losses")),
                     int(data.get("rope_dim", 0)))


def _plain(value: Any) -> Any:
    """Tuples as lists and numpy scalars as floats, so that YAML writes them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
