"""The public names of ``workers.search`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from .asking import ask_new as ask_new
from .cli import SMOKE_PILOT_STEPS as SMOKE_PILOT_STEPS, stdout_aside as stdout_aside
from .driver import SearchSummary as SearchSummary, run_search as run_search
from .options import SearchOptions as SearchOptions, training_budget as training_budget
from .protocol import TrialJob as TrialJob, TrialSpec as TrialSpec
from .rescore import (
    CONFIRM_TOKENS as CONFIRM_TOKENS,
    CONFIRM_TOP as CONFIRM_TOP,
    Confirmation as Confirmation,
    ConfirmRequest as ConfirmRequest,
    Rescored as Rescored,
    confirm as confirm,
    new_windows as new_windows,
)
from .seeding import (
    SearchPlan as SearchPlan,
    plan_anchor as plan_anchor,
    plan_settings as plan_settings,
    profile_for as profile_for,
    profile_path as profile_path,
    seeds as seeds,
    space_mlp_ratio as space_mlp_ratio,
)
from .student_cache import window_losses as window_losses
from .student_trial import teacher_model as teacher_model
from .students import (
    StudentRequest as StudentRequest,
    execute_student as execute_student,
    prepare_student as prepare_student,
    run_student_search as run_student_search,
)
from .trial import train_trial as train_trial
from .tune import ray_session as ray_session, start_ray as start_ray
