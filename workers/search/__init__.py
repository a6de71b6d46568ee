"""The search driver: ``python -m workers.search`` (``cli`` reads the flags, ``driver`` runs the
search) opens the Optuna study, seeds it from the allocator (``seeding``), and runs trials
through Ray Tune (``tune``) with Optuna's sampler inside a Tune searcher (``searcher``);
``options`` is how a search runs, ``protocol`` what the driver and a trial (``trial``)
tell each other. Ray is imported only by ``tune``, once the input is checked.

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
