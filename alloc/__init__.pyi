"""The public names of ``alloc`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from . import calibrate as calibrate
from . import compression as compression
from .calibrate import (
    ConstantsFit as ConstantsFit,
)
from .calibrate import (
    Observation as Observation,
)
from .calibrate import (
    WidthDesign as WidthDesign,
)
from .calibrate import (
    fit as fit,
)
from .calibrate import (
    with_constants as with_constants,
)
from .constants import Constants as Constants
from .constants import read_constants as read_constants
from .errors import PilotError as PilotError
from .extract import (
    ErrorModel as ErrorModel,
)
from .extract import (
    ExtractProblem as ExtractProblem,
)
from .extract import (
    GroupChoice as GroupChoice,
)
from .extract import (
    solve_brute_force as solve_brute_force,
)
from .extract import (
    solve_exact as solve_exact,
)
from .heuristics import HEURISTICS as HEURISTICS
from .heuristics import heuristic_arch as heuristic_arch
from .plan import (
    Plan as Plan,
)
from .plan import (
    baseline_arch as baseline_arch,
)
from .plan import (
    baseline_head as baseline_head,
)
from .plan import (
    make_plan as make_plan,
)
from .plan import (
    predicted_error as predicted_error,
)
from .plan import (
    uniform_plan as uniform_plan,
)
from .prior.bound import (
    DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE,
)
from .prior.bound import (
    MAX_CANDIDATES as MAX_CANDIDATES,
)
from .prior.bound import (
    Candidates as Candidates,
)
from .prior.bound import (
    allocator_prior as allocator_prior,
)
from .prior.bound import (
    candidates as candidates,
)
from .prior.bound import (
    centred_prior as centred_prior,
)
from .prior.bound import (
    point_key as point_key,
)
from .prior.sampler import (
    CALIBRATION_ATTR as CALIBRATION_ATTR,
)
from .prior.sampler import (
    Calibration as Calibration,
)
from .prior.sampler import (
    PriorSampler as PriorSampler,
)
from .profiling.datastats import Profile as Profile
from .profiling.datastats import data_statistics as data_statistics
from .profiling.files import (
    read_allocator_inputs as read_allocator_inputs,
)
from .profiling.files import (
    section_inputs as section_inputs,
)
from .profiling.files import (
    write_profile as write_profile,
)
from .profiling.flags import (
    PILOT_FLAGS as PILOT_FLAGS,
)
from .profiling.flags import (
    add_output_args as add_output_args,
)
from .profiling.flags import (
    add_profile_args as add_profile_args,
)
from .profiling.flags import (
    check_outputs as check_outputs,
)
from .profiling.flags import (
    flags_given as flags_given,
)
from .profiling.flags import (
    required_data as required_data,
)
from .profiling.flags import (
    show_profile as show_profile,
)
from .profiling.patterns import distinct_patterns as distinct_patterns
from .profiling.pilot import (
    MAX_PILOT_MLP_RATIO as MAX_PILOT_MLP_RATIO,
)
from .profiling.pilot import (
    MAX_PILOT_WIDTH as MAX_PILOT_WIDTH,
)
from .profiling.pilot import (
    PilotMeasurement as PilotMeasurement,
)
from .profiling.pilot import (
    PilotRequest as PilotRequest,
)
from .saturation import jacobian_bound as jacobian_bound
from .settings import (
    AllocatorInputs as AllocatorInputs,
)
from .settings import (
    PlanSettings as PlanSettings,
)
from .settings import (
    fitting_align as fitting_align,
)
