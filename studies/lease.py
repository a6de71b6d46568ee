"""One driver per study: a lease row in the study's own database.

A search's driver holds its study's lease while it runs: a row of the table
``transformer_alloc_leases`` (beside Optuna's tables, which it leaves untouched) naming the
driver (host, pid, when it started) and refreshed with each heartbeat. A second driver of the
same study sees the row before it runs anything and is refused in one line naming the running
driver; a lease whose heartbeat is older than its ``ttl``, or whose holder is a process of
this host that no longer exists, belongs to a dead driver and is taken over by ``--resume``.
Taking it is one atomic statement on SQLite and PostgreSQL alike: an
``INSERT`` that the primary key lets only one driver make, or an ``UPDATE`` conditional on the
stale row being unchanged (compare-and-set), so two drivers racing for it cannot both win.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from common.errors import Problem, excerpt
from studies.errors import LeaseError

TABLE = "transformer_alloc_leases"
_METADATA = sa.MetaData()
LEASES = sa.Table(
    TABLE, _METADATA,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False),  # host:pid:random, unique per driver
    sa.Column("host", sa.String(256), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("since", sa.Float, nullable=False),  # epoch seconds
    sa.Column("heartbeat", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its row says."""

    owner: str
    host: str
    pid: int
    since: float
    heartbeat: float

    def describe(self, now: float) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return (f"driver pid {self.pid} on {self.host}, since {started} (last heartbeat "
                f"{max(0.0, now - self.heartbeat):.0f} s ago)")


class Lease:
    """This driver's hold on one study's lease: ``acquire``, ``renew`` with each heartbeat,
    ``release`` at the end (also as a context manager)."""

    def __init__(self, engine: sa.Engine, study: str, ttl: float) -> None:
        self.engine, self.study, self.ttl = engine, study, ttl
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:12]}"
        self.held = False

    def acquire(self, take_stale: bool) -> Holder | None:
        """Take the lease; a stale one (a dead driver's) only with ``take_stale``.

        Returns:
            The dead driver whose lease was taken over, or None.

        Raises:
            LeaseError: a live driver holds it, or a stale one and ``take_stale`` is False.
        """
        _create_table(self.engine)
        now = time.time()
        row = {"study_name": self.study, "owner": self.owner, "host": self.host[:256],
               "pid": self.pid, "since": now, "heartbeat": now}
        try:
            with self.engine.begin() as conn:
                conn.execute(LEASES.insert().values(**row))
            self.held = True
            return None
        except IntegrityError:
            pass  # held, or left by a dead driver
        holder = self.holder()
        if holder is None:  # released between the two statements: try once more
            return self.acquire(take_stale)
        if now - holder.heartbeat <= self.ttl and not self._dead(holder):
            raise LeaseError.of([Problem("study", excerpt(self.study), "another driver is "
                                         f"running it ({holder.describe(now)}); wait for it to "
                                         "finish, or stop it first")])
        if not take_stale:
            raise LeaseError.of([Problem("study", excerpt(self.study), "its last driver "
                                         f"stopped without releasing it ({holder.describe(now)})"
                                         "; pass {resume} to take it over")])
        with self.engine.begin() as conn:  # compare-and-set: only if the stale row is unchanged
            taken = conn.execute(
                LEASES.update()
                .where(LEASES.c.study_name == self.study, LEASES.c.owner == holder.owner,
                       LEASES.c.heartbeat == holder.heartbeat)
                .values(**{k: v for k, v in row.items() if k != "study_name"})).rowcount
        if taken != 1:
            raise LeaseError(f"study {excerpt(self.study)}: another driver took over its stale "
                             "lease at the same moment; it is running the study now")
        self.held = True
        return holder

    def _dead(self, holder: Holder) -> bool:
        """The holder is a process of this host that no longer exists: its lease is stale at
        once, without waiting ``ttl`` (a killed driver resumed right away). Another host's
        driver is judged by its heartbeat alone."""
        if holder.host != self.host[:256] or holder.pid == self.pid:
            return False
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False

    def holder(self) -> Holder | None:
        """The lease's current holder, as its row says (None: nobody)."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(LEASES).where(LEASES.c.study_name == self.study)
                               ).first()
        if row is None:
            return None
        return Holder(row.owner, row.host, row.pid, row.since, row.heartbeat)

    def renew(self) -> bool:
        """Refresh the heartbeat; False if the lease is no longer this driver's."""
        if not self.held:
            return False
        with self.engine.begin() as conn:
            renewed = conn.execute(
                LEASES.update()
                .where(LEASES.c.study_name == self.study, LEASES.c.owner == self.owner)
                .values(heartbeat=time.time())).rowcount
        self.held = renewed == 1
        return self.held

    def release(self) -> None:
        """Give the lease up (nothing if it is not held)."""
        if not self.held:
            return
        with self.engine.begin() as conn:
            conn.execute(LEASES.delete().where(LEASES.c.study_name == self.study,
                                               LEASES.c.owner == self.owner))
        self.held = False

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _create_table(engine: sa.Engine) -> None:
    """Create the lease table if it is missing; another driver creating it at the same moment
    is not an error."""
    try:
        _METADATA.create_all(engine, checkfirst=True)
    except (OperationalError, ProgrammingError, IntegrityError):
        if not sa.inspect(engine).has_table(TABLE):
            raise
