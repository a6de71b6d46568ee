"""A trained checkpoint measured and compressed: what its attention uses, what a
cut costs the loss, and the students built from a plan
(``python -m workers.compress``).

The public names are those of ``__all__``, listed once in ``__init__.pyi`` and imported from
here: each loads its module on first use (``common.lazy``), so that ``python -m workers.compress
--help`` loads no torch. Every module is private to the package: outside it, import its names
from ``workers.compression`` (tests/test_layering checks). How many windows a batch runs at once
is ``workers.chunks``, below both this package and the trainer it fine-tunes with."""

from common.lazy import public_names

__getattr__, __dir__, __all__ = public_names(__name__, __file__)
