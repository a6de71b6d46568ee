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

from common.lazy import public_names

__getattr__, __dir__, __all__ = public_names(__name__, __file__)
