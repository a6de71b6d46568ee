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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alloc.calibrate import ConstantsFit, Observation, WidthDesign, fit, with_constants
    from alloc.constants import Constants, read_constants
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
    "read_constants",
    "required_data",
    "section_inputs",
    "show_profile",
    "solve_brute_force",
    "solve_exact",
    "uniform_plan",
    "with_constants",
    "write_profile",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562); the public modules
    ``calibrate`` and ``compression`` are imported by Python itself (``from alloc import
    compression``)."""
    if name in ("ConstantsFit", "Observation", "WidthDesign", "fit", "with_constants"):
        from alloc import calibrate as module
    elif name in ("Constants", "read_constants"):
        from alloc import constants as module  # type: ignore[no-redef]
    elif name == "PilotError":
        from alloc import errors as module  # type: ignore[no-redef]
    elif name in (
        "ErrorModel",
        "ExtractProblem",
        "GroupChoice",
        "solve_brute_force",
        "solve_exact",
    ):
        from alloc import extract as module  # type: ignore[no-redef]
    elif name in ("HEURISTICS", "heuristic_arch"):
        from alloc import heuristics as module  # type: ignore[no-redef]
    elif name in (
        "Plan",
        "baseline_arch",
        "baseline_head",
        "make_plan",
        "predicted_error",
        "uniform_plan",
    ):
        from alloc import plan as module  # type: ignore[no-redef]
    elif name in (
        "Candidates",
        "DEFAULT_TEMPERATURE",
        "MAX_CANDIDATES",
        "allocator_prior",
        "candidates",
        "centred_prior",
        "point_key",
    ):
        from alloc.prior import bound as module  # type: ignore[no-redef]
    elif name in ("CALIBRATION_ATTR", "Calibration", "PriorSampler"):
        from alloc.prior import sampler as module  # type: ignore[no-redef]
    elif name in ("Profile", "data_statistics"):
        from alloc.profiling import datastats as module  # type: ignore[no-redef]
    elif name in ("read_allocator_inputs", "section_inputs", "write_profile"):
        from alloc.profiling import files as module  # type: ignore[no-redef]
    elif name in (
        "PILOT_FLAGS",
        "add_output_args",
        "add_profile_args",
        "check_outputs",
        "flags_given",
        "required_data",
        "show_profile",
    ):
        from alloc.profiling import flags as module  # type: ignore[no-redef]
    elif name == "distinct_patterns":
        from alloc.profiling import patterns as module  # type: ignore[no-redef]
    elif name in ("MAX_PILOT_MLP_RATIO", "MAX_PILOT_WIDTH", "PilotMeasurement", "PilotRequest"):
        from alloc.profiling import pilot as module  # type: ignore[no-redef]
    elif name == "jacobian_bound":
        from alloc import saturation as module  # type: ignore[no-redef]
    elif name in ("AllocatorInputs", "PlanSettings", "fitting_align"):
        from alloc import settings as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
