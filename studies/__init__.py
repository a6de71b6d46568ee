"""Optuna study storage, records and queries (no torch): the single record of every trial.

The names below load their module (and with it Optuna and SQLAlchemy) when first read, so that
``studies.trials``, the trial's vocabulary, is importable where Optuna is not: a search's Ray
workers and the GPU image (``bench.gpu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.errors import StorageError
    from studies.records import add_record, read_arch, set_study_attrs, trial_attrs
    from studies.storage import StorageSettings, fail_stale_trials, open_storage
    from studies.urls import redact, resolve_url

__all__ = [
    "StorageError",
    "StorageSettings",
    "add_record",
    "fail_stale_trials",
    "open_storage",
    "read_arch",
    "redact",
    "resolve_url",
    "set_study_attrs",
    "trial_attrs",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    if name == "StorageError":
        from studies import errors as module
    elif name in ("add_record", "read_arch", "set_study_attrs", "trial_attrs"):
        from studies import records as module  # type: ignore[no-redef]
    elif name in ("StorageSettings", "fail_stale_trials", "open_storage"):
        from studies import storage as module  # type: ignore[no-redef]
    elif name in ("redact", "resolve_url"):
        from studies import urls as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module 'studies' has no attribute {name!r}")
    return getattr(module, name)
