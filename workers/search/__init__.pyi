"""The public names of ``workers.search`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from .asking import ask_new as ask_new
from .cli import SMOKE_PILOT_STEPS as SMOKE_PILOT_STEPS
from .driver import SearchSummary as SearchSummary
from .driver import run_search as run_search
from .options import SearchOptions as SearchOptions
from .options import training_budget as training_budget
from .protocol import TrialJob as TrialJob
from .protocol import TrialSpec as TrialSpec
from .seeding import (
    SearchPlan as SearchPlan,
)
from .seeding import (
    plan_anchor as plan_anchor,
)
from .seeding import (
    plan_settings as plan_settings,
)
from .seeding import (
    profile_for as profile_for,
)
from .seeding import (
    seeds as seeds,
)
from .seeding import (
    space_mlp_ratio as space_mlp_ratio,
)
from .trial import train_trial as train_trial
from .tune import ray_session as ray_session
from .tune import start_ray as start_ray
