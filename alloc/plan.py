"""The per-layer plan (docs/theory.md §5): extraction layers first, reduced ``qk_dim`` after them.

Layers ``0..k-1`` get the early-layer solution (exact grouped optimum, or the uniform layer),
layers ``k..L-1`` keep that layer's heads and value dims and take the smallest ``qk_dim`` the
saturation rule allows. With ``kv_heads`` every layer reads that many key/value heads
(grouped-query attention), shared by its groups in proportion to their query heads; later
layers keep them while their ``qk_dim`` shrinks. ``make_plan`` returns the ``ArchConfig`` and a
report whose keys are a contract other tools parse (``budget``, ``layers``, ``extract``, ``arch``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from alloc.continuous import ContinuousAllocation, solve_continuous
from alloc.extract import (
    Allocation,
    ErrorModel,
    ExtractProblem,
    UniformAllocation,
    solve_exact,
    solve_uniform,
    solve_with_dims,
)
from alloc.saturation import (
    attention_error,
    jacobian_bound,
    parse_spectrum,
    reduced_qk_dim,
    teacher_spectrum,
)
from arch import (
    ATTENTION_KINDS,
    POSITIONALS,
    SINGLE_WIDTH_KINDS,
    ArchConfig,
    AttentionKind,
    HeadGroup,
    LayerSpec,
    Positional,
    attention_params,
    merge_groups,
    param_count,
)
from arch.checks import is_number, need_bool, need_choice, need_int, need_number
from arch.kernels import KernelError, parse_kernel
from common.errors import TransformerAllocError

BASELINE_HEAD_DIM = 64
MLP_PRODUCT_ORDER = 2  # an MLP after the attention multiplies pairs of extracted tokens (§2.1)


@dataclass(frozen=True)
class PlanSettings:
    """Every allocator input; the defaults make the bare ``--budget 512`` meaningful.

    Validated on construction, like ``ArchConfig``: every rule that ties the inputs together
    is checked here (and only here), and a broken one raises ``PlanError`` naming the input as
    the ``alloc.solve`` flag that sets it (``--align 24: must divide --budget 512``).
    """

    budget: int = 512
    layers: int = 6
    extract_layers: int = 1
    seq_len: int = 256
    input_dim: int = 64
    kernel: str = "poly:1.0"
    align: int = 8
    c_proj: float = 1.0
    c_head: float = 1.0
    order: float = 2.0
    alpha: float = 0.01
    norm_bound: float | None = None
    tolerance: float = 0.05
    logit_bound: float = 1.0
    # Measured logit bound R of each later layer (e.g. from a checkpoint profile); None: the
    # one logit_bound for all of them.
    logit_bounds: tuple[float, ...] | None = None
    spectrum: str = "power:1"
    attention: AttentionKind = "mhsa"
    mlp_ratio: float = 4.0
    uniform: bool = False
    vocab_size: int | None = None
    positional: Positional = "learned"
    # k of the compression term (docs/theory.md §2.1): None = from the MLP, 2 when a layer has
    # one (it forms products of the extracted tokens), 1 for an attention-only layer.
    product_order: int | None = None
    # "file:PATH": the tokens' covariance eigenvalues as the first layer sees them (a pilot
    # profile's, docs/theory.md §9.2); None: isotropic tokens of input_dim dimensions.
    input_spectrum: str | None = None
    # Key/value heads of every layer (grouped-query attention); None: one per query head.
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.logit_bounds, list):
            object.__setattr__(self, "logit_bounds", tuple(self.logit_bounds))
        problems = settings_problems(self)
        if problems:
            raise PlanError("; ".join(problems))

    @classmethod
    def from_dict(cls, data: Any) -> PlanSettings:
        """Settings from a dict (a study's recorded ``alloc_inputs``); unknown keys are refused
        with the list of valid ones."""
        valid = tuple(f.name for f in fields(cls))
        if not isinstance(data, dict):
            raise PlanError(f"allocator inputs: expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(valid))
        if unknown:
            raise PlanError(f"allocator inputs: unknown key {unknown[0]!r}; valid keys: "
                            f"{', '.join(valid)}")
        return cls(**data)

    def order_for(self, mlp_ratio: float) -> int:
        """The compression term's order for a layer with this MLP ratio."""
        if self.product_order is not None:
            return self.product_order
        return MLP_PRODUCT_ORDER if mlp_ratio > 0 else 1

    def model_for(self, mlp_ratio: float) -> ErrorModel:
        variance = None if self.input_spectrum is None else input_variance(self.input_spectrum)
        return ErrorModel(self.input_dim, self.c_proj, self.c_head, self.order, self.alpha,
                          self.norm_bound, self.order_for(mlp_ratio), variance)

    @property
    def model(self) -> ErrorModel:
        """The bound of the plan's own layers (their MLP is ``mlp_ratio``)."""
        return self.model_for(self.mlp_ratio)


class PlanError(TransformerAllocError):
    """Allocator inputs that break a rule, or a request the plan cannot meet (key/value heads
    its head groups cannot share)."""


# (offset, heads, dim) choices of the exact solver above which it would take seconds and
# gigabytes: refused up front.
MAX_TABLE = 50_000_000
MAX_ERROR_TERM = 1e100  # the bound's largest term; products of a few stay finite in float64


def align_problem(align: int, budget: int, input_dim: int) -> str | None:
    """Why head dims in multiples of ``align`` cannot fill ``budget`` for tokens of
    ``input_dim`` dimensions (None: they can)."""
    if align > min(input_dim, budget):
        return (f"--align {align}: must be <= --input-dim ({input_dim}) and <= --budget "
                f"({budget}) so that an aligned head dimension exists")
    if budget % align:
        return (f"--align {align}: must divide --budget {budget} (head dims are multiples of "
                "--align and a uniform layer must fill the budget)")
    return None


def fitting_align(budget: int, input_dim: int, choices: tuple[int, ...] = (8, 4, 2, 1)) -> int:
    """The largest of ``choices`` that ``align_problem`` accepts (1 always is)."""
    return next(a for a in choices if align_problem(a, budget, input_dim) is None)


def settings_problems(s: PlanSettings) -> list[str]:
    """Every broken rule of ``s``: its values' types and ranges first, then the rules that tie
    them together (the bound's size and the exact solver's table only once those hold)."""
    problems = _value_problems(s)
    if problems:
        return problems
    problems += [p for p in (align_problem(s.align, s.budget, s.input_dim),) if p]
    if s.extract_layers > s.layers:
        problems.append(f"--extract-layers {s.extract_layers}: must be <= --layers {s.layers}")
    later = s.layers - s.extract_layers
    if s.logit_bounds is not None and len(s.logit_bounds) > later:
        problems.append(f"--logit-bounds: {len(s.logit_bounds)} values for {later} later "
                        f"layer(s) (--layers {s.layers} - --extract-layers {s.extract_layers})")
    hidden = s.mlp_ratio * s.budget
    if abs(hidden - round(hidden)) > 1e-9:
        problems.append(f"--mlp-ratio {s.mlp_ratio:g}: mlp-ratio * budget = {hidden:g} must be "
                        "a whole number of units")
    if s.kv_heads is not None and s.attention in SINGLE_WIDTH_KINDS:
        problems.append(f"--kv-heads {s.kv_heads}: grouped key/value heads are for mhsa and "
                        f"frozen_qk layers, not --attention {s.attention}")
    if s.positional == "rope" and s.attention == "mixit":
        problems.append("--positional rope: not offered for --attention mixit (no queries or "
                        "keys); use learned or sinusoidal")
    problems += _named_input_problems(s)
    return problems or _size_problems(s)


def _value_problems(s: PlanSettings) -> list[str]:
    problems: list[str] = []
    for name in ("budget", "layers", "seq_len", "input_dim", "align"):
        need_int(problems, _flag(name), getattr(s, name), 1)
    need_int(problems, "--extract-layers", s.extract_layers, 0)
    for name in ("c_proj", "c_head", "alpha", "mlp_ratio"):
        need_number(problems, _flag(name), getattr(s, name), 0.0)
    need_number(problems, "--order", s.order, 1.0)
    for name in ("tolerance", "logit_bound"):
        need_number(problems, _flag(name), getattr(s, name), 0.0, strict=True)
    if s.norm_bound is not None:
        need_number(problems, "--norm-bound", s.norm_bound, 0.0, strict=True)
    for name in ("product_order", "kv_heads", "vocab_size"):
        if getattr(s, name) is not None:
            need_int(problems, _flag(name), getattr(s, name), 1)
    if s.logit_bounds is not None and not all(is_number(b) and b > 0 for b in s.logit_bounds):
        problems.append(f"--logit-bounds {s.logit_bounds!r}: every value must be a number > 0")
    need_choice(problems, "--attention", s.attention, ATTENTION_KINDS)
    need_choice(problems, "--positional", s.positional, POSITIONALS)
    need_bool(problems, "--uniform", s.uniform)
    return problems


def _named_input_problems(s: PlanSettings) -> list[str]:
    """The kernel, the spectrum and the measured input spectrum (a file) as given."""
    problems: list[str] = []
    for flag, check in (("--kernel", lambda: parse_kernel(s.kernel, s.seq_len)),
                        ("--spectrum", lambda: parse_spectrum(s.spectrum))):
        try:
            check()
        except KernelError as err:
            problems.append(f"{flag}: {err}")
    if s.input_spectrum is not None:
        try:
            values = input_variance(s.input_spectrum)
        except TransformerAllocError as err:  # KernelError, or the file's own read error
            return [*problems, f"--input-spectrum: {err}"]
        if len(values) > s.input_dim or not any(values):
            problems.append(f"--input-spectrum {s.input_spectrum!r}: {len(values)} values; "
                            f"needs 1 to --input-dim ({s.input_dim}) values, not all zero")
    return problems


def _size_problems(s: PlanSettings) -> list[str]:
    """The bound's terms stay finite, and the exact solver's table stays small."""
    model = s.model
    with np.errstate(over="ignore"):  # an overflow is what is being checked
        largest = max(float(model.head_constant(s.seq_len)), float(model.compression(0)))
    if not largest <= MAX_ERROR_TERM:  # also catches an overflow to inf
        return [f"--c-proj {s.c_proj:g} / --c-head {s.c_head:g} / --order {s.order:g} / "
                f"--alpha {s.alpha:g} at --seq-len {s.seq_len}: the bound's terms reach "
                f"{largest:.3g} (c_head * B * exp(alpha (n + 1) N), c_proj * sqrt(d_in)); they "
                f"must stay <= {MAX_ERROR_TERM:g} for the solvers to stay finite "
                "(docs/theory.md §2)"]
    pairs = sum(s.budget // d for d in range(s.align, min(s.input_dim, s.budget) + 1, s.align))
    if s.seq_len * pairs > MAX_TABLE:
        return [f"--seq-len {s.seq_len}: with --budget {s.budget} and --align {s.align} the "
                f"instance has {s.seq_len * pairs:,} (offset, heads, dim) choices, over "
                f"{MAX_TABLE:,}; lower --seq-len or raise --align"]
    return []


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def share_kv_heads(heads: tuple[HeadGroup, ...], kv_heads: int) -> tuple[HeadGroup, ...]:
    """``heads`` reading ``kv_heads`` key/value heads in all, shared in proportion to the
    groups' query heads: each key/value head serves ``H / kv_heads`` query heads (``H`` the
    layer's), so group ``g`` gets ``g.count * kv_heads / H`` of them.

    Raises:
        PlanError: ``H / kv_heads`` is not a whole number dividing every group's count.
    """
    total = sum(g.count for g in heads)
    per = total // kv_heads if total % kv_heads == 0 else 0
    if not per or any(g.count % per for g in heads):
        shown = "+".join(str(HeadGroup(g.count, g.qk_dim, g.v_dim)) for g in heads)
        raise PlanError(f"kv_heads = {kv_heads}: the plan's layer has heads {shown} ({total} "
                        f"query heads); {kv_heads} key/value heads must divide {total} and "
                        f"the query heads per key/value head must divide every group's count")
    return tuple(HeadGroup(g.count, g.qk_dim, g.v_dim, g.count // per) for g in heads)


@functools.cache
def input_variance(spec: str) -> tuple[float, ...]:
    """The values of an ``--input-spectrum file:PATH`` (read once per process; ``KernelError``
    if it is not a file of non-negative numbers)."""
    kind, values = parse_spectrum(spec)
    if kind != "file":
        raise KernelError(f"input spectrum {spec!r}: must be file:PATH (one variance per line)")
    assert isinstance(values, np.ndarray)
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class Plan:
    settings: PlanSettings
    problem: ExtractProblem
    exact: Allocation
    continuous: ContinuousAllocation
    uniform: UniformAllocation
    arch: ArchConfig
    layer_errors: tuple[dict[str, float], ...]


def layer_logit_bound(settings: PlanSettings, index: int) -> float:
    """R of layer ``index``: its measured bound when given, else ``logit_bound``."""
    later = index - settings.extract_layers
    if settings.logit_bounds is None or not 0 <= later < len(settings.logit_bounds):
        return settings.logit_bound
    return settings.logit_bounds[later]


def _later_heads(settings: PlanSettings, heads: tuple[HeadGroup, ...], logit_bound: float
                 ) -> tuple[tuple[HeadGroup, ...], float]:
    """Reduced heads of a later layer whose logits are bounded by ``logit_bound``, and their
    worst per-head attention-error bound."""
    if settings.attention in SINGLE_WIDTH_KINDS:  # qk_dim == v_dim: nothing to reduce
        return heads, 0.0
    spectrum = parse_spectrum(settings.spectrum)
    reduced, worst = [], 0.0
    for g in heads:
        sigma = teacher_spectrum(spectrum, g.qk_dim, logit_bound)
        r = reduced_qk_dim(sigma, settings.seq_len, logit_bound, settings.tolerance,
                           settings.align)
        worst = max(worst, attention_error(sigma, r, settings.seq_len, logit_bound))
        reduced.append(HeadGroup(g.count, r, g.v_dim, g.kv_heads))  # keeps its key/value heads
    return merge_groups(reduced), worst


def _extract_heads(settings: PlanSettings, exact: Allocation,
                   uniform: UniformAllocation) -> tuple[HeadGroup, ...]:
    # Every offset truncated (no group beats skipping it): the layer must still exist, and
    # the best layer of equal heads is the bound's answer for its width.
    if settings.uniform or not exact.groups:
        heads: tuple[HeadGroup, ...] = (HeadGroup(uniform.count, uniform.dim),)
    else:
        heads = merge_groups([HeadGroup(g.count, g.dim) for g in exact.groups])
    if settings.kv_heads is None:
        return heads
    if settings.attention in SINGLE_WIDTH_KINDS:
        raise PlanError(f"kv_heads = {settings.kv_heads}: grouped key/value heads are for mhsa "
                        f"and frozen_qk layers, not {settings.attention}")
    return merge_groups(share_kv_heads(heads, settings.kv_heads))


def _arch(settings: PlanSettings, layers: list[LayerSpec]) -> ArchConfig:
    io: dict[str, Any] = ({"vocab_size": settings.vocab_size} if settings.vocab_size
                          else {"input_dim": settings.input_dim})
    return ArchConfig(d_model=settings.budget, layers=tuple(layers),
                      max_seq_len=settings.seq_len, positional=settings.positional, **io)


def make_plan(settings: PlanSettings) -> Plan:
    """Solve the early-layer problem and the saturation rule; assemble the per-layer plan."""
    rho = parse_kernel(settings.kernel, settings.seq_len)
    problem = ExtractProblem(rho, settings.budget, settings.align, settings.model)
    exact, uniform = solve_exact(problem), solve_uniform(problem)
    continuous = solve_continuous(problem)
    chosen = uniform.allocation if settings.uniform or not exact.groups else exact
    heads = _extract_heads(settings, exact, uniform)
    layers, errors = [], []
    for i in range(settings.layers):
        extract = i < settings.extract_layers
        later, later_error = (heads, 0.0) if extract else _later_heads(
            settings, heads, layer_logit_bound(settings, i))
        layers.append(LayerSpec(settings.attention, later, mlp_ratio=settings.mlp_ratio,
                                role="extract" if extract else "process"))
        errors.append({"compression": chosen.compression, "extraction": chosen.extraction,
                       "truncation": chosen.truncation, "total": chosen.objective}
                      if extract else {"attention": later_error, "total": later_error})
    return Plan(settings, problem, exact, continuous, uniform, _arch(settings, layers),
                tuple(errors))


def predicted_error(settings: PlanSettings, layer: LayerSpec) -> float:
    """The early-layer bound of ``layer``'s heads: its width spread as well as possible over the
    kernel's offsets by heads of the layer's dims (exact for one head group: ``count`` heads of
    ``v_dim``). What the allocator predicts for any candidate, not only its own plan."""
    dims = sorted({g.v_dim for g in layer.heads})
    align = math.gcd(*dims, layer.width)
    rho = parse_kernel(settings.kernel, settings.seq_len)
    problem = ExtractProblem(rho, layer.width, align, settings.model_for(layer.mlp_ratio))
    return solve_with_dims(problem, dims).objective


def saturation_error(settings: PlanSettings, index: int, group: HeadGroup) -> float:
    """The saturation rule's attention-error bound of a later layer's head group: a teacher head
    of ``v_dim`` (the settings' spectrum) cut to the group's ``qk_dim`` at layer ``index``'s R."""
    logit_bound = layer_logit_bound(settings, index)
    sigma = teacher_spectrum(parse_spectrum(settings.spectrum), group.v_dim, logit_bound)
    return attention_error(sigma, group.qk_dim, settings.seq_len, logit_bound)


def layer_bound(settings: PlanSettings, index: int, layer: LayerSpec) -> float:
    """What the allocator minimises for layer ``index`` of any candidate, as a log-scale cost:
    the log of the early-layer bound for an extraction layer (``index < extract_layers`` or role
    ``extract``); for a later layer, ``sum max(0, log(error / tolerance))`` over its head
    groups: nothing while the saturation rule's error is within the tolerance (every
    ``qk_dim`` the rule would accept), growing with the log of the excess below it."""
    if index < settings.extract_layers or layer.role == "extract":
        return math.log(max(predicted_error(settings, layer), 1e-300))
    if layer.attention in SINGLE_WIDTH_KINDS:
        return 0.0
    errors = (saturation_error(settings, index, g) for g in layer.heads)
    return sum(math.log(e / settings.tolerance) for e in errors if e > settings.tolerance)


def baseline_head(width: int) -> HeadGroup:
    """The usual layer's heads: ``width/64`` heads of 64 (one head of ``width`` below 64)."""
    if width < BASELINE_HEAD_DIM:
        return HeadGroup(1, width)
    return HeadGroup(width // BASELINE_HEAD_DIM, BASELINE_HEAD_DIM)


def baseline_arch(plan: Plan) -> ArchConfig:
    """The usual layer everywhere: ``D/64`` heads of 64 (one head of ``D`` when ``D < 64``),
    reading the plan's ``kv_heads`` when they divide its heads (so that a saving compares the
    allocations, not the sharing of keys and values)."""
    head = baseline_head(plan.settings.budget)
    kv = plan.settings.kv_heads
    if kv is not None and head.count % kv == 0 and plan.settings.attention not in \
            SINGLE_WIDTH_KINDS:
        head = HeadGroup(head.count, head.qk_dim, head.v_dim, kv)
    layers = tuple(LayerSpec(layer.attention, (head,), layer.mlp_ratio, layer.role)
                   for layer in plan.arch.layers)
    return ArchConfig(**{**_arch_kwargs(plan.arch), "layers": layers})


def _arch_kwargs(arch: ArchConfig) -> dict[str, Any]:
    data = arch.to_dict()
    data.pop("layers")
    return data


def saturation_curve(settings: PlanSettings, teacher_dim: int) -> list[dict[str, float]]:
    """Chosen ``qk_dim`` for a head of dim ``teacher_dim`` at N/4 .. 4N: the saturation effect."""
    spectrum = parse_spectrum(settings.spectrum)
    sigma = teacher_spectrum(spectrum, teacher_dim, settings.logit_bound)
    rows = []
    for factor in (0.25, 0.5, 1.0, 2.0, 4.0):
        n = max(1, int(settings.seq_len * factor))
        r = reduced_qk_dim(sigma, n, settings.logit_bound, settings.tolerance, settings.align)
        rows.append({"seq_len": n, "jacobian_bound": jacobian_bound(n, settings.logit_bound),
                     "qk_dim": r, "error": attention_error(sigma, r, n, settings.logit_bound)})
    return rows


def report(plan: Plan) -> dict[str, Any]:
    """The allocator's JSON contract (extra keys may be added, these are never removed)."""
    arch, d = plan.arch, plan.settings.budget
    rows = []
    for i, layer in enumerate(arch.layers):
        params = attention_params(layer, d)
        rows.append({
            "index": i, "role": layer.role, "attention": layer.attention,
            "heads": [g.to_dict() for g in layer.heads], "width": layer.width,
            "kv_heads": layer.kv_heads,
            "attention_params": params.total, "attention_params_trainable": params.trainable,
            "predicted_error": plan.layer_errors[i]["total"],
            "error_terms": plan.layer_errors[i],
        })
    ours = sum(attention_params(layer, d).total for layer in arch.layers)
    base_arch = baseline_arch(plan)
    base = sum(attention_params(layer, d).total for layer in base_arch.layers)
    teacher = max(g.qk_dim for g in arch.layers[0].heads)
    return {
        "budget": d,
        "inputs": {**asdict(plan.settings), "norm_bound": plan.problem.model.bound},
        "layers": rows,
        "totals": {
            "attention_params": ours, "baseline_attention_params": base,
            "baseline_heads": str(base_arch.layers[0].heads[0]),
            "saving": 1.0 - ours / base if base else 0.0,
            "model_params": param_count(arch).total,
            "baseline_model_params": param_count(base_arch).total,
            "kv_width": arch.kv_width,  # key + value units a decoder caches per token
        },
        "extract": _extract_report(plan),
        "saturation": {"teacher_qk_dim": teacher,
                       "curve": saturation_curve(plan.settings, teacher)},
        "arch": arch.to_dict(),
        "arch_id": arch.arch_id,
    }


def _allocation_report(alloc: Allocation) -> dict[str, Any]:
    return {"objective": alloc.objective, "compression": alloc.compression,
            "extraction": alloc.extraction, "truncation": alloc.truncation,
            "heads": alloc.heads, "width": alloc.width,
            "groups": [{"offset": g.offset, "count": g.count, "dim": g.dim} for g in alloc.groups]}


def _extract_report(plan: Plan) -> dict[str, Any]:
    exact, cont, uni = plan.exact, plan.continuous, plan.uniform
    return {
        "chosen": "uniform" if plan.settings.uniform or not exact.groups else "exact",
        "exact": _allocation_report(exact),
        "continuous": {
            "objective": cont.objective, "multiplier": cont.multiplier, "width": cont.width,
            "rounding_gap": exact.objective - cont.objective,
            "groups": [{"offset": g.offset, "count": g.count, "dim": g.dim, "share": g.share}
                       for g in cont.groups],
        },
        "uniform": {**_allocation_report(uni.allocation), "count": uni.count, "dim": uni.dim},
    }

