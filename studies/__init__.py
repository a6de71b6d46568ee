"""Optuna study storage, records and queries (no torch): the single record of every trial."""

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
