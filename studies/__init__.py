"""Optuna study storage, records and queries (no torch): the single record of every trial.

The public names are those of ``__all__``, imported from here: they load their module (and with
it Optuna and SQLAlchemy) when first read, so that a trial importing ``studies.trials`` (the
trial's vocabulary) loads no storage library: a search's Ray workers and the GPU image
(``bench.gpu``). The public modules are ``cli`` (``python -m studies``), ``query`` (the study
read with SQL), ``records`` (what a study and its trials record) and ``trials`` (a trial's
vocabulary, without Optuna); every other module is private to the package: outside it, import
its names from ``studies`` (tests/test_layering checks)."""

from common.lazy import public_names

__getattr__, __dir__, __all__ = public_names(__name__, __file__)
