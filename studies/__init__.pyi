"""The public names of ``studies`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from . import cli as cli
from . import query as query
from . import records as records
from . import trials as trials
from .errors import (
    CorruptStudyError as CorruptStudyError,
)
from .errors import (
    LeaseError as LeaseError,
)
from .errors import (
    LeaseLostError as LeaseLostError,
)
from .errors import (
    QueryError as QueryError,
)
from .errors import (
    StorageError as StorageError,
)
from .errors import (
    StorageFaultError as StorageFaultError,
)
from .errors import (
    StorageUnavailableError as StorageUnavailableError,
)
from .faults import PATIENCE_S as PATIENCE_S
from .faults import STORAGE_ERRORS as STORAGE_ERRORS
from .faults import guarded as guarded
from .integrity import check_sqlite_file as check_sqlite_file
from .lease import Lease as Lease
from .records import (
    add_record as add_record,
)
from .records import (
    read_arch as read_arch,
)
from .records import (
    set_study_attrs as set_study_attrs,
)
from .records import (
    trial_attrs as trial_attrs,
)
from .storage import (
    StorageSettings as StorageSettings,
)
from .storage import (
    engine as engine,
)
from .storage import (
    fail_marked as fail_marked,
)
from .storage import (
    fail_stale_trials as fail_stale_trials,
)
from .storage import (
    open_storage as open_storage,
)
from .storage import (
    reap_trials as reap_trials,
)
from .storage import (
    retry_failed as retry_failed,
)
from .tables import allocation_table as allocation_table
from .urls import (
    SECRET_HINT as SECRET_HINT,
)
from .urls import (
    command_note as command_note,
)
from .urls import (
    has_secret as has_secret,
)
from .urls import (
    redact as redact,
)
from .urls import (
    resolve_url as resolve_url,
)
from .urls import (
    secure_url as secure_url,
)
