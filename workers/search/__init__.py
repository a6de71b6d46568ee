"""The search driver: ``python -m workers.search``. ``cli`` reads the flags; ``request`` checks a
search once into a ``SearchRequest`` (with ``checks``); ``driver`` executes it: ``study`` opens
(or resumes) the Optuna study, ``seeding`` gives the allocator's starting points, and ``tune``
runs the trials through Ray Tune with Optuna's sampler inside a Tune searcher (``searcher``,
which classifies and records every finished trial once). ``options`` is how a search runs,
``protocol`` what the driver and a trial (``trial``) tell each other, ``estimate`` how long it
will take, ``warmstart`` what another study carries over. Ray is imported only by ``tune``, once
the input is checked.

The Python face: ``from workers.search import run_search, SearchOptions`` (``SearchSummary``
is what it returns). They are loaded on first use, so that a trial importing ``protocol`` does
not load the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.search.driver import SearchSummary, run_search
    from workers.search.options import SearchOptions

__all__ = ["SearchOptions", "SearchSummary", "run_search"]


def __getattr__(name: str) -> Any:
    if name == "SearchOptions":
        from workers.search.options import SearchOptions

        return SearchOptions
    if name in __all__:
        from workers.search import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
