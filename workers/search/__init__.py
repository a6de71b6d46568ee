"""The search driver: ``python -m workers.search``. ``cli`` reads the flags; ``request`` checks a
search once into a ``SearchRequest`` (with ``checks``); ``driver`` executes it: ``study`` opens
(or resumes) the Optuna study, ``seeding`` gives the allocator's starting points, and ``tune``
runs the trials through Ray Tune with Optuna's sampler inside a Tune searcher (``searcher``,
which classifies and records every finished trial once). ``options`` is how a search runs,
``protocol`` what the driver and a trial (``trial``) tell each other, ``estimate`` how long it
will take, ``warmstart`` what another study carries over. Ray is imported only by ``tune``, once
the input is checked.

The public names are those of ``__all__``, imported from here (``from workers.search import
run_search, SearchOptions``; ``SearchSummary`` is what it returns): each loads its module on
first use (PEP 562), so that a trial importing ``protocol`` does not load the driver and
``--help`` loads neither torch nor Optuna. Every module is private to the package: outside it,
import its names from ``workers.search`` (tests/test_layering checks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.search.asking import ask_new
    from workers.search.cli import SMOKE_PILOT_STEPS
    from workers.search.driver import SearchSummary, run_search
    from workers.search.options import SearchOptions, training_budget
    from workers.search.protocol import TrialJob, TrialSpec
    from workers.search.seeding import (
        SearchPlan,
        plan_anchor,
        plan_settings,
        profile_for,
        seeds,
        space_mlp_ratio,
    )
    from workers.search.trial import train_trial
    from workers.search.tune import session as ray_session
    from workers.search.tune import start as start_ray

__all__ = [
    "SMOKE_PILOT_STEPS",
    "SearchOptions",
    "SearchPlan",
    "SearchSummary",
    "TrialJob",
    "TrialSpec",
    "ask_new",
    "plan_anchor",
    "plan_settings",
    "profile_for",
    "ray_session",
    "run_search",
    "seeds",
    "space_mlp_ratio",
    "start_ray",
    "train_trial",
    "training_budget",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    if name == "ask_new":
        from workers.search import asking as module
    elif name == "SMOKE_PILOT_STEPS":
        from workers.search import cli as module  # type: ignore[no-redef]
    elif name in ("SearchSummary", "run_search"):
        from workers.search import driver as module  # type: ignore[no-redef]
    elif name in ("SearchOptions", "training_budget"):
        from workers.search import options as module  # type: ignore[no-redef]
    elif name in ("TrialJob", "TrialSpec"):
        from workers.search import protocol as module  # type: ignore[no-redef]
    elif name in (
        "SearchPlan",
        "plan_anchor",
        "plan_settings",
        "profile_for",
        "seeds",
        "space_mlp_ratio",
    ):
        from workers.search import seeding as module  # type: ignore[no-redef]
    elif name == "train_trial":
        from workers.search import trial as module  # type: ignore[no-redef]
    elif name in ("ray_session", "start_ray"):  # Ray for a block / for the process
        from workers.search import tune

        return tune.session if name == "ray_session" else tune.start
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
