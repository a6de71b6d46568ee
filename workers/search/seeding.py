"""The allocator's answer as a search's starting points: the inputs it takes from a task or its
data's profile (``AllocatorInputs``), its plan made once per search (``SearchPlan``), that plan
as the space's params (or the whole grid of a grid space), and its predicted error of any
sampled architecture (recorded on every trial)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc import (
    AllocatorInputs,
    Plan,
    PlanSettings,
    baseline_arch,
    fitting_align,
    make_plan,
    predicted_error,
    uniform_plan,
)
from arch import ArchConfig, ConfigError, HeadGroup, LayerSpec
from common.progress import duration, say
from search_spaces import SAMPLER_KINDS, SearchSpace, SpaceError
from workers.tasks import ArrayTask, Task, TextTask

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """A starting point: the params of an architecture to evaluate before sampling. Defined
    here, with no Optuna import, so that what plans from a profile (``plan_settings``: the
    held-out experiment on a GPU box without Optuna) imports none."""

    label: str  # "allocator", "grid", ...
    params: Mapping[str, Any]


def task_inputs(task: Task, budget: int) -> AllocatorInputs:
    """What ``task`` declares of the allocator's inputs (the ngram/kernel tasks give their
    kernel and input dimension; tokens without one are as wide as the budget)."""
    return AllocatorInputs(kernel=getattr(task, "kernel", PlanSettings.kernel),
                           input_dim=task.input_dim or budget, seq_len=task.seq_len,
                           spectrum=PlanSettings.spectrum)


def plan_settings(budget: int, depth: int, task: Task,
                  measured: AllocatorInputs | None = None,
                  mlp_ratio: float = PlanSettings.mlp_ratio) -> PlanSettings:
    """Allocator inputs for a space of this budget, depth and MLP on ``task``: ``measured``
    ones (a profile of the task's data: kernel, input dimension, spectrum, later layers'
    logit bounds and patterns), else what the task declares; at the task's length, in the
    largest head-dim unit that fits."""
    inputs = measured or task_inputs(task, budget)
    return inputs.settings(budget=budget, layers=depth, seq_len=task.seq_len,
                           align=fitting_align(budget, inputs.input_dim), mlp_ratio=mlp_ratio)


@dataclass(frozen=True)
class SearchPlan:
    """The allocator's answer for a search, made once (``make``) and passed on: its settings,
    its plan and its uniform plan (derived from the plan, not solved again)."""

    settings: PlanSettings
    plan: Plan
    uniform: Plan

    @classmethod
    def make(cls, settings: PlanSettings) -> SearchPlan:
        plan = make_plan(settings)
        return cls(settings, plan, uniform_plan(plan))


def space_mlp_ratio(space: SearchSpace) -> float:
    """The MLP ratio the plan is made for: the largest layer 0's rule allows."""
    return float(max(space.rule(0).mlp_ratio))


@dataclass(frozen=True)
class DataProfile:
    """The profile of the data a search plans with: its file and the allocator inputs in it."""

    path: Path
    inputs: AllocatorInputs


def profile_for(task: Task, profile: Path | None, out_dir: Path,
                shape: tuple[int, int, float] | None = None,
                pilot_steps: int | None = None, quiet: bool = False, pilot: bool = True
                ) -> DataProfile | None:
    """The profile of allocator inputs to plan with: ``profile`` if given (``ProfileError``
    if unreadable); for a task on the user's data without one, the data profiled now
    (``workers.profile``; token data with a pilot of the search's ``shape``, ``(budget,
    depth, MLP ratio)``, the profile's defaults without one, for ``pilot_steps``), written to
    ``out_dir`` for the record; else None (the task's own inputs). ``pilot`` False profiles
    text without the pilot (seconds, no training: for a search whose trials the plan does not
    choose). Its progress goes to stderr unless ``quiet``."""
    if profile is not None:
        from alloc import read_allocator_inputs

        return DataProfile(profile, read_allocator_inputs(profile))
    if not isinstance(task, TextTask | ArrayTask):
        return None
    from alloc import MAX_PILOT_WIDTH, PilotRequest, section_inputs, write_profile
    from workers.profile import profile_data

    out_dir.mkdir(parents=True, exist_ok=True)
    path = profile_path(task, out_dir)
    spec = task.data_spec()
    request = None
    if (pilot and isinstance(task, TextTask)
            and (shape is None or shape[0] <= MAX_PILOT_WIDTH)):
        budget, depth, mlp = shape or (PilotRequest.budget, PilotRequest.layers,
                                       PilotRequest.mlp_ratio)
        request = PilotRequest(spec, budget=budget, layers=depth, mlp_ratio=mlp,
                             steps=pilot_steps or PilotRequest.steps, quiet=quiet)
        say(f"profiling {task.path}: pilot training of the baseline at D = {budget}, "
            f"{depth} layer(s), {request.steps} steps", quiet=quiet)
    elif isinstance(task, TextTask):
        say(f"profiling {task.path} without a pilot: the grid's points are the trials",
            quiet=quiet)
    # DataError if unusable
    measured = profile_data(spec, seq_len=task.seq_len, pilot=request)
    section = write_profile(measured, path)[0]["allocator"]
    say(f"profiled {task.path}: kernel {section['kernel']}, input dim {section['input_dim']} "
        f"in {duration(measured.wall_s)} ({path})", quiet=quiet)
    return DataProfile(path, section_inputs(section, path))


def profile_path(task: TextTask | ArrayTask, out_dir: Path) -> Path:
    """Where ``profile_for`` writes the profile it makes of ``task``'s data in ``out_dir``."""
    return out_dir / f"profile-{Path(task.path).name}.yaml"


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


def seeds(space: SearchSpace, planned: SearchPlan) -> list[Start]:
    """The allocator's plan, its uniform plan and the 64-dim baseline, as the space's params.

    A seed the space cannot express (e.g. two head groups in a layer) is skipped with a warning.
    """
    candidates = [("allocator", planned.plan.arch), ("allocator-uniform", planned.uniform.arch),
                  ("baseline-64", baseline_arch(planned.plan))]
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
    """What breaks the prior's ties (``alloc.prior.bound.allocator_prior``'s ``plan``): the
    allocator's plan as params of the space, else its uniform plan (a space of one head group
    per layer cannot hold a plan of mixed groups, but holds its MLP, kinds and training choices
    the bound is silent on), else None."""
    by_label = {s.label: s.params for s in starts}
    return by_label.get("allocator", by_label.get("allocator-uniform"))


def starting_points(space: SearchSpace, planned: SearchPlan, sampler: str,
                    points: Sequence[Mapping[str, Any]] = ()) -> list[Start]:
    """``points`` when given (``SearchOptions.points``); else every point for the grid (the
    seeds it can express are among them); none for the prior sampler (it proposes the
    allocator's own answer, its prior's mode, as far as its belief in the prior goes); else the
    allocator's seeds."""
    if points:
        return [Start("point", dict(p)) for p in points]
    traits = SAMPLER_KINDS[sampler]
    if traits.enumerates:
        return [Start(sampler, params) for params in space.grid()]
    return seeds(space, planned) if traits.seeded else []


@dataclass(frozen=True)
class BoundPredictor:
    """The allocator's predicted error of a sampled architecture (its first layer's bound)."""

    settings: PlanSettings

    def __call__(self, arch: ArchConfig) -> float:
        return predicted_error(self.settings, arch.layers[0])
