"""The allocator (no torch): from a data profile and a budget, the plan of heads, widths and
ranks per layer (``plan``, ``settings``, ``extract``), the profile it reads (``profiling``),
the calibration of its constants (``calibrate``), its prior over a search space (``prior``) and
a trained checkpoint's compression (``compression``, a public subpackage).

The public names are those of ``__all__``, imported from here: each loads its module on first
use (PEP 562), so that importing ``alloc`` stays light (no SciPy, no plotting) and a command's
``--help`` loads only what it names. The commands are ``python -m alloc.solve``,
``alloc.profile`` and ``alloc.calibrate``; every other module is private to the package:
outside it, import its names from ``alloc`` (tests/test_layering checks)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alloc.calibrate import ConstantsFit, Observation, WidthDesign, fit, with_constants
    from alloc.constants import Constants
    from alloc.errors import PilotError
    from alloc.extract import (
        ErrorModel,
        ExtractProblem,
        GroupChoice,
        solve_brute_force,
        solve_exact,
    )
    from alloc.heuristics import HEURISTICS, heuristic_arch
    from alloc.plan import (
        Plan,
        baseline_arch,
        baseline_head,
        make_plan,
        predicted_error,
        uniform_plan,
    )
    from alloc.prior.bound import (
        DEFAULT_TEMPERATURE,
        MAX_CANDIDATES,
        Candidates,
        allocator_prior,
        candidates,
        centred_prior,
        point_key,
    )
    from alloc.prior.sampler import CALIBRATION_ATTR, Calibration, PriorSampler
    from alloc.profiling.datastats import Profile, data_statistics
    from alloc.profiling.files import read_allocator_inputs, section_inputs, write_profile
    from alloc.profiling.flags import (
        PILOT_FLAGS,
        add_output_args,
        add_profile_args,
        check_outputs,
        flags_given,
        required_data,
        show_profile,
    )
    from alloc.profiling.patterns import distinct_patterns
    from alloc.profiling.pilot import (
        MAX_PILOT_MLP_RATIO,
        MAX_PILOT_WIDTH,
        PilotMeasurement,
        PilotRequest,
    )
    from alloc.saturation import jacobian_bound
    from alloc.settings import AllocatorInputs, PlanSettings, fitting_align

__all__ = [
    "CALIBRATION_ATTR",
    "DEFAULT_TEMPERATURE",
    "HEURISTICS",
    "MAX_CANDIDATES",
    "MAX_PILOT_MLP_RATIO",
    "MAX_PILOT_WIDTH",
    "PILOT_FLAGS",
    "AllocatorInputs",
    "Calibration",
    "Candidates",
    "Constants",
    "ConstantsFit",
    "ErrorModel",
    "ExtractProblem",
    "GroupChoice",
    "Observation",
    "PilotError",
    "PilotMeasurement",
    "PilotRequest",
    "Plan",
    "PlanSettings",
    "PriorSampler",
    "Profile",
    "WidthDesign",
    "add_output_args",
    "add_profile_args",
    "allocator_prior",
    "baseline_arch",
    "baseline_head",
    "calibrate",
    "candidates",
    "centred_prior",
    "check_outputs",
    "compression",
    "data_statistics",
    "distinct_patterns",
    "fit",
    "fitting_align",
    "flags_given",
    "heuristic_arch",
    "jacobian_bound",
    "make_plan",
    "point_key",
    "predicted_error",
    "read_allocator_inputs",
    "required_data",
    "section_inputs",
    "show_profile",
    "solve_brute_force",
    "solve_exact",
    "uniform_plan",
    "with_constants",
    "write_profile",
]


# Where each public name lives (its module is imported on first use).
_HOMES: dict[str, tuple[str, ...]] = {
    "alloc.calibrate": ("ConstantsFit", "Observation", "WidthDesign", "fit", "with_constants"),
    "alloc.constants": ("Constants",),
    "alloc.errors": ("PilotError",),
    "alloc.extract": (
        "ErrorModel",
        "ExtractProblem",
        "GroupChoice",
        "solve_brute_force",
        "solve_exact",
    ),
    "alloc.heuristics": ("HEURISTICS", "heuristic_arch"),
    "alloc.plan": (
        "Plan",
        "baseline_arch",
        "baseline_head",
        "make_plan",
        "predicted_error",
        "uniform_plan",
    ),
    "alloc.prior.bound": (
        "Candidates",
        "DEFAULT_TEMPERATURE",
        "MAX_CANDIDATES",
        "allocator_prior",
        "candidates",
        "centred_prior",
        "point_key",
    ),
    "alloc.prior.sampler": ("CALIBRATION_ATTR", "Calibration", "PriorSampler"),
    "alloc.profiling.datastats": ("Profile", "data_statistics"),
    "alloc.profiling.files": ("read_allocator_inputs", "section_inputs", "write_profile"),
    "alloc.profiling.flags": (
        "PILOT_FLAGS",
        "add_output_args",
        "add_profile_args",
        "check_outputs",
        "flags_given",
        "required_data",
        "show_profile",
    ),
    "alloc.profiling.patterns": ("distinct_patterns",),
    "alloc.profiling.pilot": (
        "MAX_PILOT_MLP_RATIO",
        "MAX_PILOT_WIDTH",
        "PilotMeasurement",
        "PilotRequest",
    ),
    "alloc.saturation": ("jacobian_bound",),
    "alloc.settings": ("AllocatorInputs", "PlanSettings", "fitting_align"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562); the public modules
    ``calibrate`` and ``compression`` are imported by Python itself (``from alloc import
    compression``)."""
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
