"""Planning a trained model's compression (docs/theory.md §10): from what its attention was
measured to use, the smallest aligned ``qk_dim`` of every head group whose attention error stays
within a tolerance (or a fraction of its KV cache), as a typed ``CompressionPlan`` that
``workers.compress`` builds.

One job per module, the public names imported from here:

- ``measurement``: what the torch side measures (``CheckpointMeasurement``) and how it is asked
  for (``MeasureRequest``);
- ``forms``: the student forms' table (``FORMS``, ``StudentForm``: compact, latent, latent
  with a decoupled RoPE part), each form's candidates, floor, layer spec and rendering;
- ``planner``: the rule (``effective_rank``, ``truncation_error_bound``) and
  ``plan_compression``;
- ``kv_cache``: ``plan_for_kv_cache``, the plan under a fraction of the teacher's KV cache,
  and its floor;
- ``refit``: the latent plan's loss estimates rescaled by depth to fit measured students
  (``fit_depth_scales``, ``rescaled``);
- ``schema``: ``CompressionPlan`` and its parts, written and read as YAML;
- ``render``: ``render_plan`` and ``plot_plan``;
- ``errors``: ``CompressionError``.

The measurement itself runs the model, so it lives with torch (``workers.compression.measure``,
asked for with a ``MeasureRequest``); it reaches this package as a ``CheckpointMeasurement``, which
``workers.profile`` hands to ``plan_compression``. Planning is pure: numpy and the saturation
bound of ``alloc.saturation``.
"""

from alloc.compression.forms import (
    FORM_NAMES,
    FORMS,
    RULES,
    FormName,
    Rule,
    StudentForm,
    candidate_dims,
    form_of,
    student_form,
)
from alloc.compression.kv_cache import (
    aligned,
    check_kv_cache,
    kv_cache_floor,
    plan_for_allocation,
    plan_for_kv_cache,
)
from alloc.compression.measurement import (
    CheckpointMeasurement,
    HeadMeasurement,
    HeadStats,
    LayerMeasurement,
    MeasureRequest,
)
from alloc.compression.planner import (
    RANK_TAIL,
    effective_rank,
    group_plan,
    plan_compression,
    student_arch,
    truncation_error_bound,
)
from alloc.compression.refit import (
    DepthFit,
    Observation,
    depth_groups,
    fit_depth_scales,
    rescaled,
)
from alloc.compression.render import RULE_AXES, plot_plan, render_plan
from alloc.compression.schema import CompressionPlan, GroupPlan, HeadSpectrum, LayerPlan
from alloc.errors import CompressionError

__all__ = [
    "FORMS",
    "FORM_NAMES",
    "RANK_TAIL",
    "RULES",
    "RULE_AXES",
    "CheckpointMeasurement",
    "CompressionError",
    "CompressionPlan",
    "DepthFit",
    "FormName",
    "GroupPlan",
    "HeadMeasurement",
    "HeadSpectrum",
    "HeadStats",
    "LayerMeasurement",
    "LayerPlan",
    "MeasureRequest",
    "Observation",
    "Rule",
    "StudentForm",
    "aligned",
    "candidate_dims",
    "check_kv_cache",
    "depth_groups",
    "effective_rank",
    "fit_depth_scales",
    "form_of",
    "group_plan",
    "kv_cache_floor",
    "plan_compression",
    "plan_for_allocation",
    "plan_for_kv_cache",
    "plot_plan",
    "render_plan",
    "rescaled",
    "student_arch",
    "student_form",
    "truncation_error_bound",
]
