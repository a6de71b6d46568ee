"""One driver per study: the lease row is taken by one of two drivers racing for it, refuses a
second live driver with the first's host, pid and start, is taken over from a dead driver only
when asked (``--resume``), and goes with its holder; on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import sqlalchemy as sa

from studies.errors import LeaseError
from studies.lease import Lease


def engine(url: str) -> sa.Engine:
    return sa.create_engine(url)


def test_a_second_live_driver_is_refused_by_name(storage_url: str, study_name: str) -> None:
    first, second = Lease(engine(storage_url), study_name, 60), Lease(engine(storage_url),
                                                                     study_name, 60)
    assert first.acquire(take_stale=False) is None
    for take in (False, True):  # --resume does not take a live driver's lease either
        with pytest.raises(LeaseError, match=rf"another driver is running it \(driver pid "
                                             rf"{first.pid} on {first.host}, since .* \(last "
                                             r"heartbeat \d+ s ago\)"):
            second.acquire(take_stale=take)
    assert first.renew()
    first.release()
    assert second.acquire(take_stale=False) is None and not first.renew()
    second.release()
    assert second.holder() is None


def test_a_dead_drivers_lease_is_taken_over_only_on_resume(storage_url: str,
                                                          study_name: str) -> None:
    dead = Lease(engine(storage_url), study_name, ttl=0.5)
    dead.acquire(take_stale=False)
    time.sleep(1.0)  # its heartbeat lapses: the driver died without releasing
    new = Lease(engine(storage_url), study_name, ttl=0.5)
    with pytest.raises(LeaseError, match=r"stopped without releasing it .* pass resume to take"):
        new.acquire(take_stale=False)
    taken = new.acquire(take_stale=True)
    assert taken is not None and taken.owner == dead.owner
    assert not dead.renew()  # the dead driver, were it alive after all, has lost it
    holder = new.holder()
    assert holder is not None and holder.owner == new.owner


def _race(url: str, study: str, start: float, results: multiprocessing.Queue) -> None:
    lease = Lease(sa.create_engine(url), study, ttl=60)
    time.sleep(max(0.0, start - time.time()))
    try:
        lease.acquire(take_stale=True)
        results.put("won")
        time.sleep(1.0)
    except LeaseError:
        results.put("refused")


def test_drivers_racing_for_a_new_lease_one_wins(storage_url: str, study_name: str) -> None:
    """Four processes ask at the same instant, on a database without the lease table yet:
    exactly one holds it, the others are refused (none fails otherwise)."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    start = time.time() + 2.0
    racers = [context.Process(target=_race, args=(storage_url, study_name, start, results))
              for _ in range(4)]
    for p in racers:
        p.start()
    for p in racers:
        p.join(30)
    assert all(p.exitcode == 0 for p in racers)
    assert sorted(results.get(timeout=5) for _ in racers) == ["refused"] * 3 + ["won"]


def _hold_and_die(url: str, study: str) -> None:
    Lease(sa.create_engine(url), study, ttl=60).acquire(take_stale=False)
    # the process ends without releasing: a driver killed with kill -9


def test_a_killed_driver_of_this_host_is_stale_at_once(storage_url: str,
                                                       study_name: str) -> None:
    """No waiting for the ttl when the holder is a process of this host that is gone."""
    context = multiprocessing.get_context("spawn")
    killed = context.Process(target=_hold_and_die, args=(storage_url, study_name))
    killed.start()
    killed.join(30)
    new = Lease(engine(storage_url), study_name, ttl=60)
    holder = new.holder()
    assert holder is not None and holder.pid == killed.pid
    with pytest.raises(LeaseError, match=r"stopped without releasing it .* pass resume to take"):
        new.acquire(take_stale=False)
    assert new.acquire(take_stale=True) is not None
    new.release()
