"""Optuna study storage, records and queries (no torch): the single record of every trial."""

from studies.records import add_record, read_arch, set_study_attrs, trial_attrs
from studies.storage import (
    StorageError,
    StorageSettings,
    open_storage,
    reap_stale,
    redact,
    resolve_url,
)

__all__ = [
    "StorageError",
    "StorageSettings",
    "add_record",
    "open_storage",
    "read_arch",
    "reap_stale",
    "redact",
    "resolve_url",
    "set_study_attrs",
    "trial_attrs",
]
