"""The allocator's answer as a search's starting points: the inputs it takes from a task, its
plan as the space's params (or the whole grid of a grid space), and its predicted error of any
sampled architecture (recorded on every trial)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc.plan import baseline_arch, make_plan, predicted_error
from alloc.settings import PlanSettings, fitting_align
from arch import ArchConfig, ConfigError, HeadGroup, LayerSpec
from common.progress import duration, say
from search_spaces import SearchSpace, SpaceError
from workers.search.searcher import Start
from workers.tasks import ArrayTask, Task, TextTask

log = logging.getLogger(__name__)



def plan_settings(budget: int, depth: int, task: Task,
                  measured: Mapping[str, Any] | None = None,
                  mlp_ratio: float = PlanSettings.mlp_ratio) -> PlanSettings:
    """Allocator inputs for a space of this budget, depth and MLP on ``task``: ``measured``
    ones (a profile of the task's data: kernel, input dimension, spectrum, later layers' logit
    bounds), else what the task declares (the ngram/kernel tasks give their kernel and input
    dimension)."""
    kernel = getattr(task, "kernel", PlanSettings.kernel)
    input_dim, spectrum = task.input_dim or budget, PlanSettings.spectrum
    bounds, variance, patterns = None, None, None
    if measured is not None:
        kernel, input_dim, spectrum = (measured["kernel"], measured["input_dim"],
                                       measured["spectrum"])
        variance = measured.get("input_spectrum")
        # A deeper pilot's extra later layers are never read (``layer_logit_bound``).
        bounds = tuple(measured["logit_bounds"]) if measured.get("logit_bounds") else None
        patterns = tuple(measured.get("patterns") or ())[:depth - 1] or None
    return PlanSettings(budget=budget, layers=depth, seq_len=task.seq_len, input_dim=input_dim,
                        kernel=kernel, spectrum=spectrum, align=fitting_align(budget, input_dim),
                        logit_bounds=bounds, mlp_ratio=mlp_ratio, input_spectrum=variance,
                        patterns=patterns)


def space_mlp_ratio(space: SearchSpace) -> float:
    """The MLP ratio the plan is made for: the largest layer 0's rule allows."""
    return float(max(space.rule(0).mlp_ratio))


def planner(task: Task, measured: Mapping[str, Any] | None = None,
            mlp_ratio: float = PlanSettings.mlp_ratio) -> Callable[[int, int], ArchConfig]:
    """The allocator's plan for (budget, depth) on ``task``: resolves ``allocator`` in spaces."""
    return lambda budget, depth: make_plan(plan_settings(budget, depth, task, measured,
                                                         mlp_ratio)).arch


def profile_for(task: Task, profile: Path | None, out_dir: Path,
                shape: tuple[int, int, float] | None = None,
                pilot_steps: int | None = None, quiet: bool = False) -> Path | None:
    """The profile of allocator inputs to plan with: ``profile`` if given; for a task on the
    user's data without one, the data profiled now (``workers.profile``; token data with a pilot
    of the search's ``shape``, ``(budget, depth, MLP ratio)``, the profile's defaults without
    one, for ``pilot_steps``), written to ``out_dir``; else None (the task's own inputs).
    Its progress goes to stderr unless ``quiet``."""
    if profile is not None or not isinstance(task, TextTask | ArrayTask):
        return profile
    from alloc.pilot import MAX_PILOT_WIDTH, PilotRequest
    from alloc.profilefile import write_profile
    from workers.profile import profile_data

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"profile-{Path(task.path).name}.yaml"
    spec = task.data_spec()
    pilot = None
    if isinstance(task, TextTask) and (shape is None or shape[0] <= MAX_PILOT_WIDTH):
        budget, depth, mlp = shape or (PilotRequest.budget, PilotRequest.layers,
                                       PilotRequest.mlp_ratio)
        pilot = PilotRequest(spec, budget=budget, layers=depth, mlp_ratio=mlp,
                             steps=pilot_steps or PilotRequest.steps, quiet=quiet)
        say(f"profiling {task.path}: pilot training of the baseline at D = {budget}, "
            f"{depth} layer(s), {pilot.steps} steps", quiet=quiet)
    # DataError if unusable
    measured = profile_data(spec, seq_len=task.seq_len, pilot=pilot)
    inputs = write_profile(measured, path)[0]["allocator"]
    say(f"profiled {task.path}: kernel {inputs['kernel']}, input dim {inputs['input_dim']} "
        f"in {duration(measured.wall_s)} ({path})", quiet=quiet)
    return path


def measured_inputs(profile: Path | None) -> dict[str, Any] | None:
    """The ``allocator`` section of a profile (``ProfileError`` if unreadable), or None."""
    if profile is None:
        return None
    from alloc.profilefile import read_allocator_inputs

    return read_allocator_inputs(profile)


def fit_layer(space: SearchSpace, i: int, layer: LayerSpec) -> LayerSpec:
    """``layer`` moved into the space's rule for layer ``i`` where a field is not allowed."""
    rule = space.rule(i)
    kind = layer.attention if layer.attention in rule.attention else rule.attention[0]
    mlp = layer.mlp_ratio if layer.mlp_ratio in rule.mlp_ratio else rule.mlp_ratio[-1]
    # A qk_dim the rule does not allow becomes the largest it does.
    heads = tuple(HeadGroup(g.count, g.qk_dim if rule.qk.allows(kind, g.v_dim, g.qk_dim)
                            else rule.qk.range(kind, g.v_dim)[1], g.v_dim,
                            _fit_kv_heads(rule.kv_heads, g)) for g in layer.heads)
    return LayerSpec(kind, heads, mlp, **rule.fixed_fields(mlp))


def _fit_kv_heads(choices: tuple[int, ...] | None, group: HeadGroup) -> int:
    """The group's key/value heads, kept unless the rule samples others: then its choice
    nearest to them that divides the count. Kept without choices (a shared seed the space
    cannot express is skipped with a warning, never silently made ungrouped)."""
    fitting = [c for c in choices or () if group.count % c == 0]
    if not fitting or group.kv_heads in fitting:
        return group.kv_heads
    return min(fitting, key=lambda c: (abs(c - group.kv_heads), c))


def seeds(space: SearchSpace, settings: PlanSettings) -> list[Start]:
    """The allocator's plan, its uniform plan and the 64-dim baseline, as the space's params.

    A seed the space cannot express (e.g. two head groups in a layer) is skipped with a warning.
    """
    plan = make_plan(settings)
    uniform = make_plan(dataclasses.replace(settings, uniform=True))
    candidates = [("allocator", plan.arch), ("allocator-uniform", uniform.arch),
                  ("baseline-64", baseline_arch(plan))]
    out: list[Start] = []
    for label, arch in candidates:
        layers = tuple(fit_layer(space, i, layer) for i, layer in enumerate(arch.layers))
        try:
            fitted = ArchConfig.from_dict({**arch.to_dict(), **space.model,
                                           "layers": [x.to_dict() for x in layers]})
            out.append(Start(label, space.encode(fitted)))
        except (SpaceError, ConfigError) as err:
            log.warning("seed %s is not in space %s, skipped: %s", label, space.name, err)
    return out


def plan_anchor(starts: Sequence[Start]) -> Mapping[str, Any] | None:
    """What breaks the prior's ties (``alloc.prior.allocator_prior``'s ``plan``): the
    allocator's plan as params of the space, else its uniform plan (a space of one head group
    per layer cannot hold a plan of mixed groups, but holds its MLP, kinds and training choices
    the bound is silent on), else None."""
    by_label = {s.label: s.params for s in starts}
    return by_label.get("allocator", by_label.get("allocator-uniform"))


def starting_points(space: SearchSpace, settings: PlanSettings, sampler: str,
                    points: Sequence[Mapping[str, Any]] = ()) -> list[Start]:
    """``points`` when given (``SearchOptions.points``); else every point for the grid (the
    seeds it can express are among them); none for the prior sampler (its first proposal is the
    allocator's own answer); else the allocator's seeds."""
    if points:
        return [Start("point", dict(p)) for p in points]
    if sampler == "grid":
        return [Start("grid", params) for params in space.grid()]
    return [] if sampler == "prior" else seeds(space, settings)


@dataclass(frozen=True)
class BoundPredictor:
    """The allocator's predicted error of a sampled architecture (its first layer's bound)."""

    settings: PlanSettings

    def __call__(self, arch: ArchConfig) -> float:
        return predicted_error(self.settings, arch.layers[0])
