"""Optuna study storage, records and queries (no torch): the single record of every trial.

The public names are those of ``__all__``, imported from here: they load their module (and with
it Optuna and SQLAlchemy) when first read, so that a trial importing ``studies.trials`` (the
trial's vocabulary) loads no storage library: a search's Ray workers and the GPU image
(``bench.gpu``). The public modules are ``cli`` (``python -m studies``), ``query`` (the study
read with SQL), ``records`` (what a study and its trials record) and ``trials`` (a trial's
vocabulary, without Optuna); every other module is private to the package: outside it, import
its names from ``studies`` (tests/test_layering checks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.errors import (
        CorruptStudyError,
        LeaseError,
        LeaseLostError,
        QueryError,
        StorageError,
        StorageFaultError,
        StorageUnavailableError,
    )
    from studies.faults import PATIENCE_S, STORAGE_ERRORS, guarded
    from studies.integrity import check_sqlite_file
    from studies.lease import Lease
    from studies.records import add_record, read_arch, set_study_attrs, trial_attrs
    from studies.storage import (
        StorageSettings,
        engine,
        fail_marked,
        fail_stale_trials,
        open_storage,
        reap_trials,
        retry_failed,
    )
    from studies.tables import allocation_table
    from studies.urls import SECRET_HINT, command_note, has_secret, redact, resolve_url, secure_url

__all__ = [
    "PATIENCE_S",
    "SECRET_HINT",
    "STORAGE_ERRORS",
    "CorruptStudyError",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "QueryError",
    "StorageError",
    "StorageFaultError",
    "StorageSettings",
    "StorageUnavailableError",
    "add_record",
    "allocation_table",
    "check_sqlite_file",
    "cli",
    "command_note",
    "engine",
    "fail_marked",
    "fail_stale_trials",
    "guarded",
    "has_secret",
    "open_storage",
    "query",
    "read_arch",
    "reap_trials",
    "records",
    "redact",
    "resolve_url",
    "retry_failed",
    "secure_url",
    "set_study_attrs",
    "trial_attrs",
    "trials",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562); a public module is
    imported by Python itself (``from studies import query``)."""
    if name in ("CorruptStudyError", "LeaseError", "LeaseLostError", "QueryError", "StorageError",
                "StorageFaultError", "StorageUnavailableError"):
        from studies import errors as module
    elif name in ("PATIENCE_S", "STORAGE_ERRORS", "guarded"):
        from studies import faults as module  # type: ignore[no-redef]
    elif name == "check_sqlite_file":
        from studies import integrity as module  # type: ignore[no-redef]
    elif name == "Lease":
        from studies import lease as module  # type: ignore[no-redef]
    elif name in ("add_record", "read_arch", "set_study_attrs", "trial_attrs"):
        from studies import records as module  # type: ignore[no-redef]
    elif name in ("StorageSettings", "engine", "fail_marked", "fail_stale_trials", "open_storage",
                  "reap_trials", "retry_failed"):
        from studies import storage as module  # type: ignore[no-redef]
    elif name == "allocation_table":
        from studies import tables as module  # type: ignore[no-redef]
    elif name in ("SECRET_HINT", "command_note", "has_secret", "redact", "resolve_url",
                  "secure_url"):
        from studies import urls as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module 'studies' has no attribute {name!r}")
    return getattr(module, name)
