"""Planning a trained model's compression (docs/theory.md §10): from what its attention was
measured to use, the smallest aligned ``qk_dim`` of every head group whose attention error stays
within a tolerance (or a KV cache budget), as a typed ``CompressionPlan`` that
``workers.compress`` builds.

One job per module, the public names imported from here:

- ``measurement``: what the torch side measures (``CheckpointMeasurement``) and how it is asked
  for (``MeasureRequest``);
- ``planner``: the rule (``effective_rank``, ``truncation_error_bound``, ``candidate_dims``,
  ``latent_widths``, ``latent_spec``) and
  ``plan_compression``;
- ``budget``: ``plan_for_kv_cache``, the plan under a KV cache budget, and its floor;
- ``schema``: ``CompressionPlan`` and its parts, written and read as YAML;
- ``render``: ``render_plan`` and ``plot_plan``;
- ``errors``: ``CompressionError``.

The measurement itself runs the model, so it lives with torch (``workers.compression.measure``,
asked for with a ``MeasureRequest``); it reaches this package as a ``CheckpointMeasurement``, which
``workers.profile`` hands to ``plan_compression``. Planning is pure: numpy and the saturation
bound of ``alloc.saturation``.
"""

from alloc.compression.budget import check_kv_cache, kv_cache_floor, plan_for_kv_cache
from alloc.compression.measurement import (
    CheckpointMeasurement,
    HeadMeasurement,
    HeadStats,
    LayerMeasurement,
    MeasureRequest,
)
from alloc.compression.planner import (
    RANK_TAIL,
    candidate_dims,
    effective_rank,
    group_plan,
    latent_spec,
    latent_widths,
    plan_compression,
    student_arch,
    truncation_error_bound,
)
from alloc.compression.render import RULE_AXES, plot_plan, render_plan
from alloc.compression.schema import (
    RULES,
    CompressionPlan,
    GroupPlan,
    HeadSpectrum,
    LayerPlan,
    Rule,
)
from alloc.errors import CompressionError

__all__ = [
    "RANK_TAIL",
    "RULES",
    "RULE_AXES",
    "CheckpointMeasurement",
    "CompressionError",
    "CompressionPlan",
    "GroupPlan",
    "HeadMeasurement",
    "HeadSpectrum",
    "HeadStats",
    "LayerMeasurement",
    "LayerPlan",
    "MeasureRequest",
    "Rule",
    "candidate_dims",
    "check_kv_cache",
    "effective_rank",
    "group_plan",
    "kv_cache_floor",
    "latent_spec",
    "latent_widths",
    "plan_compression",
    "plan_for_kv_cache",
    "plot_plan",
    "render_plan",
    "student_arch",
    "truncation_error_bound",
]
