"""The per-layer plan (docs/theory.md §5): extraction layers first, reduced ``qk_dim`` after them.

Layers ``0..k-1`` get the early-layer solution (exact grouped optimum, or the uniform layer),
layers ``k..L-1`` get as many equal heads as the distinct attention patterns a pilot measured
there (§4.1; without a measurement, layer 0's heads) and the smallest ``qk_dim`` the
saturation rule allows. Every layer's row says why (``reason``). With ``kv_heads`` every layer
reads that many key/value heads (grouped-query attention), shared by its groups in proportion to
their query heads; later layers keep them while their ``qk_dim`` shrinks. ``make_plan`` returns
the ``ArchConfig`` and a report whose keys are a contract other tools parse (``budget``,
``layers``, ``extract``, ``arch``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from alloc.continuous import ContinuousAllocation, solve_continuous
from alloc.errors import PlanError
from alloc.extract import (
    Allocation,
    ExtractProblem,
    UniformAllocation,
    solve_exact,
    solve_uniform,
    solve_with_dims,
)
from alloc.profiling.patterns import later_head_count
from alloc.saturation import (
    attention_error,
    jacobian_bound,
    parse_spectrum,
    reduced_qk_dim,
    teacher_spectrum,
)
from alloc.settings import GROUPED_KV_PLANNED, PlanSettings
from arch import (
    ArchConfig,
    HeadGroup,
    LayerSpec,
    attention_params,
    kind_traits,
    merge_groups,
    param_count,
    parse_kernel,
)
from common.errors import Problem

BASELINE_HEAD_DIM = 64
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
        raise PlanError.of([Problem(
            "kv_heads", kv_heads, f"the plan's layer has heads {shown} ({total} query heads); "
            f"{kv_heads} key/value heads must divide {total} and the query heads per key/value "
            "head must divide every group's count")])
    return tuple(HeadGroup(g.count, g.qk_dim, g.v_dim, g.count // per) for g in heads)


@dataclass(frozen=True)
class Plan:
    settings: PlanSettings
    problem: ExtractProblem
    exact: Allocation
    continuous: ContinuousAllocation
    uniform: UniformAllocation
    arch: ArchConfig
    layer_errors: tuple[dict[str, float], ...]
    reasons: tuple[str, ...]  # per layer: why it has these heads
    one_offset: Allocation  # the exact optimum without blocks: what the relaxation bounds


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
    if kind_traits(settings.attention).single_width:  # qk_dim == v_dim: nothing to reduce
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
    if not kind_traits(settings.attention).grouped_kv:
        raise PlanError.of([Problem("kv_heads", settings.kv_heads, "grouped key/value heads "
                                    f"are for {GROUPED_KV_PLANNED} layers, not {{attention}} "
                                    f"{settings.attention}")])
    return merge_groups(share_kv_heads(heads, settings.kv_heads))


def _arch(settings: PlanSettings, layers: list[LayerSpec]) -> ArchConfig:
    io: dict[str, Any] = ({"vocab_size": settings.vocab_size} if settings.vocab_size
                          else {"input_dim": settings.input_dim})
    return ArchConfig(d_model=settings.budget, layers=tuple(layers),
                      max_seq_len=settings.seq_len, positional=settings.positional, **io)


def pattern_heads(settings: PlanSettings, index: int, heads: tuple[HeadGroup, ...]
                  ) -> tuple[tuple[HeadGroup, ...], str]:
    """Later layer ``index``'s heads before the saturation rule, and why: as many equal heads
    of the full width as the distinct patterns measured there (§4.1), else layer 0's."""
    measured = measured_patterns(settings, index)
    if measured is None:
        return heads, "layer 0's heads (no pattern count measured)"
    count = later_head_count(measured, settings.budget, settings.align, settings.kv_heads or 1)
    group = HeadGroup(count, settings.budget // count)
    chosen = (group,) if settings.kv_heads is None else share_kv_heads((group,), settings.kv_heads)
    return chosen, (f"{measured:.1f} distinct attention patterns measured: {count} "
                    f"head{'s' if count > 1 else ''}")


def extract_reason(chosen: Allocation, uniform: bool) -> str:
    """What the bound did with the offsets: blocks averaged, offsets extracted, truncated."""
    blocks = [f"s{g.offset}-{g.last}" for g in chosen.groups if g.span > 1]
    singles = sum(1 for g in chosen.groups if g.span == 1)
    parts = [f"averages {', '.join(blocks)}"] if blocks else []
    parts += [f"extracts {singles} offset(s)"] if singles else []
    kind = "uniform layer" if uniform else "bound"
    return f"{kind}: " + ("; ".join(parts) if parts else "every offset truncated")


def make_plan(settings: PlanSettings) -> Plan:
    """Solve the early-layer problem, the later layers' head counts and the saturation rule;
    assemble the per-layer plan."""
    rho = parse_kernel(settings.kernel, settings.seq_len)
    problem = ExtractProblem(rho, settings.budget, settings.align, settings.model,
                             settings.max_block)
    exact, uniform = solve_exact(problem), solve_uniform(problem)
    one_offset = exact if settings.max_block == 1 else solve_exact(
        dataclasses.replace(problem, max_block=1))
    continuous = solve_continuous(problem)  # relaxes the one-offset problem (§3.2)
    return _assemble(settings, problem, exact, continuous, uniform, one_offset)


def uniform_plan(plan: Plan) -> Plan:
    """``plan`` with ``uniform`` set: its extraction layers the best uniform layer. What
    ``make_plan`` gives for those settings, from ``plan``'s solved problem (``uniform`` only
    picks among its solutions) instead of solving it again."""
    if plan.settings.uniform:
        return plan
    return _assemble(dataclasses.replace(plan.settings, uniform=True), plan.problem,
                     plan.exact, plan.continuous, plan.uniform, plan.one_offset)


def _assemble(settings: PlanSettings, problem: ExtractProblem, exact: Allocation,
              continuous: ContinuousAllocation, uniform: UniformAllocation,
              one_offset: Allocation) -> Plan:
    """The per-layer plan from the solved early-layer problem: the extraction layers' heads
    (the exact optimum, or the uniform layer), the later layers' counts and ``qk_dim``."""
    chosen = uniform.allocation if settings.uniform or not exact.groups else exact
    heads = _extract_heads(settings, exact, uniform)
    layers, errors, reasons = [], [], []
    for i in range(settings.layers):
        if i < settings.extract_layers:
            later, error = heads, {"compression": chosen.compression,
                                   "extraction": chosen.extraction,
                                   "averaging": chosen.averaging,
                                   "truncation": chosen.truncation, "total": chosen.objective}
            reasons.append(extract_reason(chosen, chosen is uniform.allocation))
        else:
            own, why = pattern_heads(settings, i, heads)
            bound = layer_logit_bound(settings, i)
            later, worst = _later_heads(settings, own, bound)
            error = {"attention": worst, "total": worst}
            qk = "/".join(str(g.qk_dim) for g in later)
            reasons.append(f"{why}; qk_dim {qk} at R={bound:.3g} (saturation)")
        layers.append(LayerSpec(settings.attention, later, mlp_ratio=settings.mlp_ratio,
                                role="extract" if i < settings.extract_layers else "process"))
        errors.append(error)
    return Plan(settings, problem, exact, continuous, uniform, _arch(settings, layers),
                tuple(errors), tuple(reasons), one_offset)


def predicted_error(settings: PlanSettings, layer: LayerSpec) -> float:
    """The early-layer bound of ``layer``'s heads: its width spread as well as possible over the
    kernel's offsets by heads of the layer's dims (exact for one head group: ``count`` heads of
    ``v_dim``). What the allocator predicts for any candidate, not only its own plan; the
    compression order is the plan's (``PlanSettings.compression_order``), whatever the
    candidate layer's own MLP."""
    dims = sorted({g.v_dim for g in layer.heads})
    align = math.gcd(*dims, layer.width)
    rho = parse_kernel(settings.kernel, settings.seq_len)
    problem = ExtractProblem(rho, layer.width, align, settings.model, settings.max_block)
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
    ``qk_dim`` the rule would accept), growing with the log of the excess below it, plus
    ``pattern_cost``: the log distance of its head count from the patterns measured there."""
    if index < settings.extract_layers or layer.role == "extract":
        return math.log(max(predicted_error(settings, layer), 1e-300))
    cost = pattern_cost(settings, index, layer)
    if layer.kind.single_width:
        return cost
    errors = (saturation_error(settings, index, g) for g in layer.heads)
    return cost + sum(math.log(e / settings.tolerance) for e in errors if e > settings.tolerance)


def pattern_cost(settings: PlanSettings, index: int, layer: LayerSpec) -> float:
    """``|log(H / P)|`` of a later layer with ``H`` heads where ``P`` distinct patterns were
    measured (§4.1; 0 without a measurement): least at the count the rule picks."""
    measured = measured_patterns(settings, index)
    return 0.0 if measured is None else abs(math.log(layer.n_heads / max(measured, 1.0)))


def measured_patterns(settings: PlanSettings, index: int) -> float | None:
    """The distinct patterns measured in later layer ``index`` (None: not measured)."""
    later = index - settings.extract_layers
    if settings.patterns is None or not 0 <= later < len(settings.patterns):
        return None
    return settings.patterns[later]


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
    if kv is not None and head.count % kv == 0 and \
            kind_traits(plan.settings.attention).grouped_kv:
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
            "reason": plan.reasons[i],
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
            "extraction": alloc.extraction, "averaging": alloc.averaging,
            "truncation": alloc.truncation, "heads": alloc.heads, "width": alloc.width,
            "groups": [{"offset": g.offset, "span": g.span, "count": g.count, "dim": g.dim}
                       for g in alloc.groups]}


def _extract_report(plan: Plan) -> dict[str, Any]:
    exact, cont, uni = plan.exact, plan.continuous, plan.uniform
    return {
        "chosen": "uniform" if plan.settings.uniform or not exact.groups else "exact",
        "exact": _allocation_report(exact),
        "continuous": {
            "objective": cont.objective, "multiplier": cont.multiplier, "width": cont.width,
            # Against the one-offset optimum: the relaxation knows no blocks (§3.2).
            "rounding_gap": plan.one_offset.objective - cont.objective,
            "one_offset_objective": plan.one_offset.objective,
            "groups": [{"offset": g.offset, "count": g.count, "dim": g.dim, "share": g.share}
                       for g in cont.groups],
        },
        "uniform": {**_allocation_report(uni.allocation), "count": uni.count, "dim": uni.dim},
    }

