"""The public names of ``alloc`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from . import calibrate as calibrate, compression as compression
from .calibrate import (
    ConstantsFit as ConstantsFit,
    Observation as Observation,
    Recalibrated as Recalibrated,
    WidthDesign as WidthDesign,
    fit as fit,
    mean_observations as mean_observations,
    recalibrate as recalibrate,
    with_constants as with_constants,
)
from .constants import Constants as Constants, read_constants as read_constants
from .errors import CalibrationError as CalibrationError, PilotError as PilotError
from .extract import (
    ErrorModel as ErrorModel,
    ExtractProblem as ExtractProblem,
    GroupChoice as GroupChoice,
    solve_brute_force as solve_brute_force,
    solve_exact as solve_exact,
)
from .heuristics import (
    HEURISTICS as HEURISTICS,
    PLAN as PLAN,
    heuristic_arch as heuristic_arch,
    rule_archs as rule_archs,
    twin_arch as twin_arch,
)
from .plan import (
    Plan as Plan,
    baseline_arch as baseline_arch,
    baseline_head as baseline_head,
    make_plan as make_plan,
    predicted_error as predicted_error,
    uniform_plan as uniform_plan,
)
from .prior.bound import (
    DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE,
    MAX_CANDIDATES as MAX_CANDIDATES,
    Candidates as Candidates,
    allocator_prior as allocator_prior,
    candidates as candidates,
    centred_prior as centred_prior,
    point_key as point_key,
)
from .prior.sampler import (
    CALIBRATION_ATTR as CALIBRATION_ATTR,
    Calibration as Calibration,
    PriorSampler as PriorSampler,
)
from .prior.student import ModePrior as ModePrior
from .profiling.datastats import Profile as Profile, data_statistics as data_statistics
from .profiling.files import (
    read_allocator_inputs as read_allocator_inputs,
    section_inputs as section_inputs,
    write_profile as write_profile,
)
from .profiling.flags import (
    PILOT_FLAGS as PILOT_FLAGS,
    add_output_args as add_output_args,
    add_profile_args as add_profile_args,
    check_outputs as check_outputs,
    flags_given as flags_given,
    required_data as required_data,
    show_profile as show_profile,
)
from .profiling.patterns import distinct_patterns as distinct_patterns
from .profiling.pilot import (
    MAX_PILOT_MLP_RATIO as MAX_PILOT_MLP_RATIO,
    MAX_PILOT_WIDTH as MAX_PILOT_WIDTH,
    PilotMeasurement as PilotMeasurement,
    PilotRequest as PilotRequest,
)
from .saturation import jacobian_bound as jacobian_bound
from .settings import (
    AllocatorInputs as AllocatorInputs,
    PlanSettings as PlanSettings,
    fitting_align as fitting_align,
)
