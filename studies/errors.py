"""The errors of ``studies`` (study storage and queries), all under the project's one root
(``common.errors.TransformerAllocError``): each message is one line naming the field, the value
and the rule."""

from __future__ import annotations

from common.errors import TransformerAllocError


class StorageError(TransformerAllocError):
    """The storage cannot be opened; the message is one line and never holds a password."""


class QueryError(TransformerAllocError):
    """A query that cannot be answered (unknown study, no eligible trial); one line."""


class LeaseError(TransformerAllocError):
    """The study is being run by another driver (or its lease was lost)."""


class CorruptStudyError(TransformerAllocError):
    """A SQLite study file that fails SQLite's integrity check."""


class StorageFaultError(TransformerAllocError):
    """The storage failed while a command ran (disk full, read-only, connection lost past the
    retries, missing privileges): one line naming the storage, the fault and what to do; the
    study is left as ``--resume`` continues it. Exit code 1: not the user's input."""


class LeaseLostError(StorageFaultError):
    """The study's lease was taken by another driver while this one ran (it looked dead)."""


class StorageUnavailableError(StorageFaultError):
    """The database could not be used for a while (a connection dropped, a server restarting
    or without a free connection): a fault that passes, retried, then exit code 1."""
