"""The public names of ``studies`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from . import cli as cli, query as query, records as records, trials as trials
from .errors import (
    CorruptStudyError as CorruptStudyError,
    LeaseError as LeaseError,
    LeaseLostError as LeaseLostError,
    QueryError as QueryError,
    StorageError as StorageError,
    StorageFaultError as StorageFaultError,
    StorageUnavailableError as StorageUnavailableError,
)
from .faults import PATIENCE_S as PATIENCE_S, STORAGE_ERRORS as STORAGE_ERRORS, guarded as guarded
from .integrity import check_sqlite_file as check_sqlite_file
from .lease import Lease as Lease
from .records import (
    add_record as add_record,
    read_arch as read_arch,
    set_study_attrs as set_study_attrs,
    trial_attrs as trial_attrs,
)
from .storage import (
    StorageSettings as StorageSettings,
    engine as engine,
    fail_marked as fail_marked,
    fail_stale_trials as fail_stale_trials,
    open_storage as open_storage,
    reap_trials as reap_trials,
    retry_failed as retry_failed,
)
from .tables import allocation_table as allocation_table
from .urls import (
    SECRET_HINT as SECRET_HINT,
    command_note as command_note,
    has_secret as has_secret,
    redact as redact,
    resolve_url as resolve_url,
    secure_url as secure_url,
)
