"""Planning a trained model's compression (docs/theory.md §10): from what its attention was
measured to use, the smallest aligned ``qk_dim`` of every head group whose attention error stays
within a tolerance, as a typed ``CompressionPlan`` that ``workers.compress`` builds.

The measurement itself runs the model, so it lives with torch (``workers.measure``, asked for
with a ``MeasureRequest``); it reaches this module as a ``CheckpointMeasurement``, which
``workers.profile`` hands to ``plan_compression``. Planning is pure: numpy and the saturation
bound of ``alloc.saturation``.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import yaml

from alloc.saturation import jacobian_bound
from arch import ArchConfig, ConfigError, HeadGroup
from arch.memory import kv_cache_bytes
from common.cli import render_table
from common.errors import TransformerAllocError
from common.files import dump_yaml, load_yaml
from common.plots import new_figure, write_figure
from userdata import DataSpec

Rule = Literal["bound", "measured", "loss"]
RULES: tuple[Rule, ...] = get_args(Rule)
# Share of a head's spectrum (sum of singular values) that its effective rank may discard: a
# description of the spectrum, separate from the attention-error tolerance that sets the plan.
RANK_TAIL = 0.05


class CompressionError(TransformerAllocError):
    """A plan that cannot be made or used: no measurer, a broken plan file, a plan for another
    model."""


# --- what the torch side measures ------------------------------------------------------------


@dataclass(frozen=True)
class HeadStats:
    """One head on the data sample: its largest |logit|, and its mean attention entropy over
    ``ln N`` (1: uniform attention, 0: one key)."""

    logit_bound: float
    entropy: float


@dataclass(frozen=True)
class HeadMeasurement:
    """One query-key head: the singular values of ``M_h = W_Q,h W_K,h^T / sqrt(qk_dim)`` and,
    with a data sample, the largest attention-weight change measured at each candidate rank.

    A RoPE head has no such matrix (docs/theory.md §10.2): ``pairs`` is the order in which a
    student keeps its key/value head's frequency pairs, ``sigma`` each pair's logit bound in that
    order (split over its two dims, so that the tail beyond rank ``r`` is what dropping all but
    the leading ``r / 2`` pairs can change), and the errors are of keeping those pairs."""

    group: int
    head: int
    sigma: tuple[float, ...]
    measured_errors: Mapping[int, float] | None = None
    pairs: tuple[int, ...] = ()


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer: its query-key heads (none for MSSA and MixiT), the largest attention-input
    norm (measured, or bounded from the norm's parameters without data), and per-head logit
    statistics on the sample."""

    index: int
    heads: tuple[HeadMeasurement, ...]
    token_norm: float
    head_stats: tuple[HeadStats, ...] = ()
    # per head group: candidate qk_dim -> the sample's next-token loss increase (nats per token)
    # when only this group is cut to it (token models, when asked for: one forward each)
    loss_increases: tuple[Mapping[int, float], ...] = ()


@dataclass(frozen=True)
class CheckpointMeasurement:
    """Everything planning needs of a trained model."""

    arch: ArchConfig
    seq_len: int  # N of the saturation rule: the sample's window, or the model's length
    align: int  # the candidate qk_dims measured are multiples of it
    layers: tuple[LayerMeasurement, ...]
    sample: str | None = None  # what was sampled ("--task lm", "--data x.txt"); None: no data
    checkpoint: str = ""
    layout: str = ""

    @property
    def measured(self) -> bool:
        return self.sample is not None


@dataclass(frozen=True)
class MeasureRequest:
    """What to measure: a checkpoint, on a sample of ``data`` or of a generated ``task`` (or on
    none: spectra and norm bounds only)."""

    checkpoint: Path
    align: int = 8
    data: DataSpec | None = None
    task: str | None = None
    task_params: Mapping[str, Any] = field(default_factory=dict)
    smoke_test: bool = False  # the task at its smoke size
    seq_len: int | None = None  # sample window (default: the model's max_seq_len)
    sample_tokens: int | None = None
    seed: int = 0
    loss_sensitivity: bool = False  # also each group's loss increase at each candidate
    quiet: bool = False  # no progress on stderr


# --- the rule ----------------------------------------------------------------------------------


def effective_rank(sigma: Sequence[float], tolerance: float = RANK_TAIL) -> int:
    """Smallest r whose discarded singular values sum to at most ``tolerance`` of the total."""
    values = np.asarray(sigma, dtype=float)
    tail = np.concatenate([np.cumsum(values[::-1])[::-1], [0.0]])
    return int(np.argmax(tail <= tolerance * max(tail[0], 1e-300)))


def truncation_error_bound(sigma: Sequence[float], rank: int, seq_len: int, logit_bound: float,
                           norm: float) -> float:
    """Bound on the largest attention-weight change of a rank-``rank`` student of this head:
    ``||J|| * max |delta logit|`` with ``||J|| <= min(1/2, 2 e^{2R'} / N)``, ``R'`` bounding the
    teacher's and the student's logits, and ``|delta logit| <= norm^2 sum_{i>r} sigma_i``
    (docs/theory.md §4, §10)."""
    delta = norm * norm * float(np.sum(np.asarray(sigma, dtype=float)[rank:]))
    return jacobian_bound(seq_len, logit_bound + delta) * delta


def candidate_dims(qk_dim: int, align: int) -> list[int]:
    """The ``qk_dim`` a head group of ``qk_dim`` may be reduced to: multiples of ``align``
    below it, and itself."""
    return sorted({*range(align, qk_dim, align), qk_dim})


# --- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPlan:
    """One head group's decision: ``qk_dim`` -> ``reduced_qk_dim``, with the error bound and
    the measured error of every candidate (the worst head of the group)."""

    count: int
    qk_dim: int
    v_dim: int
    reduced_qk_dim: int
    error_bounds: Mapping[int, float]
    measured_errors: Mapping[int, float] | None = None
    loss_increases: Mapping[int, float] | None = None
    kv_heads: int = 0  # 0 (a plan written before grouped-query attention): one per query head

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

    @property
    def measured(self) -> bool:
        return self.sample is not None

    @property
    def reduces(self) -> bool:
        """Whether any head group's ``qk_dim`` is lowered."""
        return any(g.reduced_qk_dim < g.qk_dim for layer in self.layers for g in layer.groups)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["student"] = self.student.to_dict()
        for layer, plan in zip(data["layers"], self.layers):
            layer["logit_bound"], layer["entropy"] = plan.logit_bound, plan.entropy
            for group, decided in zip(layer["groups"], plan.groups):
                group["error_bound"] = decided.error_bound
                group["measured_error"] = decided.measured_error
                group["loss_increase"] = decided.loss_increase
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
                       kv_cache=None if data.get("kv_cache") is None else float(data["kv_cache"]))
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
                             int(g.get("kv_heads", g["count"])))
                   for g in data["groups"])
    spectra = tuple(HeadSpectrum(int(s["group"]), int(s["head"]),
                                 tuple(float(v) for v in s["sigma"]), int(s["effective_rank"]),
                                 tuple(int(p) for p in s.get("pairs", ())))
                    for s in data.get("spectra", ()))
    stats = tuple(HeadStats(float(s["logit_bound"]), float(s["entropy"]))
                  for s in data.get("head_stats", ()))
    return LayerPlan(int(data["index"]), str(data["attention"]), str(data["heads"]),
                     float(data["token_norm"]), groups, spectra, stats)


def _plain(value: Any) -> Any:
    """Tuples as lists and numpy scalars as floats, so that YAML writes them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def group_plan(heads: Sequence[HeadMeasurement], group: HeadGroup, seq_len: int,
               logit_bound: float, norm: float, tolerance: float, align: int,
               rule: Rule = "bound", loss_increases: Mapping[int, float] | None = None
               ) -> GroupPlan:
    """The smallest aligned ``qk_dim`` of the group whose error stays within ``tolerance`` for
    every head: the bound's (``rule="bound"``, docs/theory.md §4), the attention error measured
    on the data sample (``"measured"``), or the sample's loss increase (``"loss"``, the group
    alone cut); each candidate's bound and measured errors are kept."""
    candidates = candidate_dims(group.qk_dim, align)
    bounds = {r: max(truncation_error_bound(h.sigma, r, seq_len, logit_bound, norm)
                     for h in heads) for r in candidates}
    measured = None
    if all(h.measured_errors is not None for h in heads):
        measured = {r: max(h.measured_errors[r] for h in heads if h.measured_errors is not None)
                    for r in candidates}
    plan = GroupPlan(group.count, group.qk_dim, group.v_dim, group.qk_dim, bounds, measured,
                     loss_increases, group.kv_heads)
    decide = plan.errors(rule)
    chosen = next(r for r in candidates if decide[r] <= tolerance or r == group.qk_dim)
    return dataclasses.replace(plan, reduced_qk_dim=chosen)


def plan_compression(measured: CheckpointMeasurement, tolerance: float,
                     rule: Rule | None = None, logit_bound: float | None = None
                     ) -> CompressionPlan:
    """The per-layer plan of a measured model (docs/theory.md §10).

    Args:
        measured: the model's spectra, norms and (with a sample) logit statistics and errors.
        tolerance: allowed attention error per head.
        rule: ``bound`` (the saturation rule's guarantee) or ``measured`` (the error measured
            on the sample; needs one); default: measured with a sample, else bound.
        logit_bound: assumed R without a sample (None: any logits, ``||J|| <= 1/2``).

    Raises:
        CompressionError: ``rule="measured"`` without a sample.
    """
    rule = rule or ("measured" if measured.measured else "bound")
    if rule == "measured" and not measured.measured:
        raise CompressionError("--rule measured: needs a sample to measure the errors on "
                               "(--data or --task)")
    if rule == "loss" and not any(layer.loss_increases for layer in measured.layers):
        raise CompressionError("--rule loss: needs the loss of a token model on a sample "
                               "(--data or --task), measured with the loss sensitivity")
    layers = tuple(_layer_plan(measured, m, tolerance, rule, logit_bound)
                   for m in measured.layers)
    return CompressionPlan(
        arch_id=measured.arch.arch_id, seq_len=measured.seq_len, tolerance=tolerance,
        align=measured.align, rule=rule, layers=layers,
        student=student_arch(measured.arch, layers), sample=measured.sample,
        checkpoint=measured.checkpoint, layout=measured.layout)


def _layer_plan(measured: CheckpointMeasurement, layer: LayerMeasurement, tolerance: float,
                rule: Rule, logit_bound: float | None) -> LayerPlan:
    spec = measured.arch.layers[layer.index]
    if layer.head_stats:
        r_bound = max(s.logit_bound for s in layer.head_stats)
    else:
        r_bound = logit_bound if logit_bound is not None else math.inf
    spectra = tuple(HeadSpectrum(h.group, h.head, h.sigma, effective_rank(h.sigma), h.pairs)
                    for h in layer.heads)
    groups: tuple[GroupPlan, ...] = ()
    if layer.heads:
        losses = layer.loss_increases or (None,) * len(spec.heads)
        groups = tuple(group_plan([h for h in layer.heads if h.group == j], group,
                                  measured.seq_len, r_bound, layer.token_norm, tolerance,
                                  measured.align, rule, loss)
                       for j, (group, loss) in enumerate(zip(spec.heads, losses)))
    return LayerPlan(layer.index, spec.attention, spec.heads_str, layer.token_norm, groups,
                     spectra, layer.head_stats)


def plan_for_kv_cache(plan: CompressionPlan, fraction: float) -> CompressionPlan:
    """The plan's per-group ``qk_dim`` chosen again under a KV cache budget instead of a
    tolerance: the student caches at most ``fraction`` of the teacher's key and value units per
    token, spent where the plan's rule says a cut costs most. With ``rule="loss"`` the sum of
    the groups' loss increases is minimised (each group measured alone: additive to first
    order), otherwise the largest error (minimax); exactly, by dynamic programming over the
    groups (docs/theory.md §10.3).

    Raises:
        CompressionError: a fraction below what the values alone take with the smallest
            candidate keys, or above 1.
    """
    groups = [g for layer in plan.layers for g in layer.groups]
    if not groups:
        raise CompressionError(f"--kv-cache {fraction:g}: the model has no query-key heads to "
                               "cut (mssa and mixit layers only)")
    # what no plan changes: the values, and the layers without query-key heads
    fixed = plan.student.kv_width - sum(g.key_heads * g.reduced_qk_dim for g in groups)
    teacher_kv = fixed + sum(g.key_heads * g.qk_dim for g in groups)
    floor = fixed + sum(g.key_heads * min(g.error_bounds) for g in groups)
    budget = math.floor(fraction * teacher_kv + 1e-9) - fixed
    if not 0 < fraction <= 1 or budget + fixed < floor:
        raise CompressionError(f"--kv-cache {fraction:g}: must be in [{floor / teacher_kv:.3g}, "
                               "1]: the values and the smallest candidate keys take "
                               f"{floor / teacher_kv:.3g} of the teacher's KV cache")
    chosen = _budget_choice(groups, budget, plan.rule)
    it = iter(chosen)
    layers = tuple(dataclasses.replace(layer, groups=tuple(
        dataclasses.replace(g, reduced_qk_dim=next(it)) for g in layer.groups))
        for layer in plan.layers)
    worst = max((g.errors(plan.rule)[g.reduced_qk_dim] for layer in layers
                 for g in layer.groups), default=0.0)
    student = student_arch(plan.student, layers)
    return dataclasses.replace(plan, layers=layers, student=student, tolerance=worst,
                               kv_cache=fraction)


def _budget_choice(groups: Sequence[GroupPlan], budget: int, rule: Rule) -> list[int]:
    """Per group a candidate ``qk_dim`` with ``sum key_heads * qk_dim <= budget`` minimising the
    sum (rule ``loss``) or the maximum (otherwise; among those, the sum) of the groups'
    errors."""
    errors = [{r: max(e, 0.0) for r, e in g.errors(rule).items()} for g in groups]
    if rule != "loss":  # the least achievable maximum first, then the least sum under it
        worst = _best_choices(groups, errors, budget, combine=max)[0]
        errors = [{r: e for r, e in es.items() if e <= worst} for es in errors]
    return _best_choices(groups, errors, budget, combine=operator.add)[1]


def _best_choices(groups: Sequence[GroupPlan], errors: Sequence[Mapping[int, float]],
                  budget: int, combine: Callable[[float, float], float]
                  ) -> tuple[float, list[int]]:
    """Dynamic programming over the groups: the least ``combine``-d error of choices that fit
    ``budget`` key units, and the choices."""
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}  # key units used -> best so far
    for g, candidates in zip(groups, errors):
        step: dict[int, tuple[float, list[int]]] = {}
        for used, (value, choices) in best.items():
            for r, error in candidates.items():
                spent = used + g.key_heads * r
                total = combine(value, error)
                if spent <= budget and (spent not in step or total < step[spent][0]):
                    step[spent] = (total, [*choices, r])
        best = step
    # ties go to the plan that keeps more dims (a cut that costs nothing measurable is no gain)
    most = max(best, key=lambda spent: (-best[spent][0], spent))
    return best[most]


def student_arch(teacher: ArchConfig, layers: Sequence[LayerPlan]) -> ArchConfig:
    """``teacher`` with each planned group's ``qk_dim`` reduced."""
    specs = list(teacher.layers)
    for plan in layers:
        if plan.groups:
            heads = tuple(dataclasses.replace(old, qk_dim=g.reduced_qk_dim)
                          for old, g in zip(specs[plan.index].heads, plan.groups))
            specs[plan.index] = dataclasses.replace(specs[plan.index], heads=heads)
    return ArchConfig.from_dict({**teacher.to_dict(), "layers": [x.to_dict() for x in specs]})


# --- showing a plan ----------------------------------------------------------------------------


def render_plan(plan: CompressionPlan) -> str:
    """The plan as a table: per layer what was measured and each group's decision."""
    rows = []
    for layer in plan.layers:
        decisions = "  ".join(
            f"{g.count}x{g.qk_dim}->{g.reduced_qk_dim} (bound {g.error_bound:.3g}"
            + (f", measured {g.measured_error:.3g}" if g.measured_error is not None else "")
            + (f", loss {g.loss_increase:+.3g}" if g.loss_increase is not None else "")
            + ")" for g in layer.groups) or "-"
        ranks = ",".join(str(s.effective_rank) for s in layer.spectra) or "-"
        rows.append([layer.index, layer.attention, layer.heads, _fmt(layer.logit_bound),
                     _fmt(layer.token_norm), _fmt(layer.entropy), ranks, decisions])
    budget = ("tolerance" if plan.kv_cache is None else
              f"KV cache {plan.kv_cache:g} of the teacher's, worst")
    head = (f"checkpoint profile: N = {plan.seq_len}, {budget} {plan.tolerance:.3g} on the "
            f"{plan.rule} error, sample: "
            + (plan.sample or "none (||J|| <= 1/2, norms bounded from the norm layers)"))
    table = render_table(["layer", "attention", "heads", "R", "max |x|", "entropy/ln N",
                          "effective ranks", "qk_dim plan (errors)"], rows,
                         right=[True, False, False, True, True, True, False, False])
    return f"{head}\n{table}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


# What each rule's error is, on the plot's axis.
RULE_AXES = {"bound": "attention weight change (bound)",
             "measured": "attention weight change\n(solid: measured, dotted: bound)",
             "loss": "sample loss increase (nats per token)"}


def plot_plan(plan: CompressionPlan, path: Path) -> None:
    """``heads.png``: every head's query-key spectrum; per layer the chosen ``qk_dim`` against
    the teacher's; and the error of each candidate ``qk_dim`` against the tolerance, the chosen
    one marked (solid: measured on the sample, dotted: the bound)."""
    fig, axes = new_figure(3, (16, 4.4))
    _plot_spectra(axes[0], plan)
    _plot_dims(axes[1], plan)
    _plot_errors(axes[2], plan)
    write_figure(fig, path)


def _plot_spectra(ax: Any, plan: CompressionPlan) -> None:
    for layer in plan.layers:
        for k, spectrum in enumerate(layer.spectra):
            sigma = np.maximum(np.asarray(spectrum.sigma), 1e-12)
            ax.semilogy(np.arange(1, len(sigma) + 1), sigma, color=f"C{layer.index % 10}",
                        alpha=0.6, label=f"layer {layer.index}" if k == 0 else None)
    ax.set_xlabel("singular value index i")
    ax.set_ylabel("sigma_i of W_Q,h W_K,h^T / sqrt(d_qk) (floor 1e-12)")
    ax.set_title("query-key spectrum of every head")
    ax.legend(fontsize=8)


def _plot_dims(ax: Any, plan: CompressionPlan) -> None:
    """Bars per head group: the teacher's ``qk_dim`` (outline) and the chosen one (filled)."""
    for layer in plan.layers:
        width = 0.8 / max(1, len(layer.groups))
        for j, group in enumerate(layer.groups):
            x = layer.index - 0.4 + width * (j + 0.5)
            ax.bar(x, group.qk_dim, width * 0.9, fill=False, edgecolor="0.4",
                   label="teacher" if (layer.index, j) == (0, 0) else None)
            ax.bar(x, group.reduced_qk_dim, width * 0.9, color=f"C{layer.index % 10}",
                   alpha=0.8)
            ax.annotate(f"{group.count}x{group.reduced_qk_dim}", (x, group.reduced_qk_dim),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks([layer.index for layer in plan.layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("qk_dim per head (outline: teacher, filled: chosen)")
    cut = sum(g.key_heads * (g.qk_dim - g.reduced_qk_dim) for layer in plan.layers
              for g in layer.groups)
    kept = kv_cache_bytes(plan.student, "float32")
    ax.set_title(f"qk_dim per head group\n(the student caches {kept / (kept + 4 * cut):.0%} "
                 "of the teacher's keys and values)")


def _plot_errors(ax: Any, plan: CompressionPlan) -> None:
    """Each candidate ``qk_dim``'s error under the plan's rule (dotted: the bound, where the rule
    measured something else), the chosen one marked, and the tolerance on the rule's axis."""
    shown = [(layer.index, j, group, group.errors(plan.rule)) for layer in plan.layers
             for j, group in enumerate(layer.groups)]
    positive = [e for *_, errors in shown for e in errors.values() if e > 0]
    floor = min(positive) / 10 if positive else 1e-12  # an exact candidate (0) sits on it
    for index, j, group, errors in shown:
        color = f"C{index % 10}"
        dims = sorted(group.error_bounds)
        if plan.rule == "measured":
            ax.plot(dims, [max(group.error_bounds[r], floor) for r in dims], ":", color=color)
        label = f"layer {index}" + (f" g{j}" if j or len(shown) > len(plan.layers) else "")
        ax.plot(dims, [max(errors[r], floor) for r in dims], "-", color=color, label=label)
        ax.plot([group.reduced_qk_dim], [max(errors[group.reduced_qk_dim], floor)], "o",
                color=color, markersize=9)
    if plan.kv_cache is None:
        ax.axhline(plan.tolerance, color="k", linestyle="--",
                   label=f"tolerance {plan.tolerance:g}")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_yscale("log")
    ax.set_xlabel("candidate qk_dim")
    ax.set_ylabel(RULE_AXES[plan.rule])
    ax.set_title("error of each candidate qk_dim (o: chosen)")
    ax.legend(fontsize=7)
