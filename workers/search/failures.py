"""How a search names what failed a trial in Ray, without Ray: ``RayFailure`` (read from the
error Tune recorded, ``ray_failure``; a full disk from an exception, ``disk_full``) and
``Death``, what the searcher did about it (the line the search prints)."""

from __future__ import annotations

import errno
from dataclasses import dataclass


@dataclass(frozen=True)
class RayFailure:
    """Why Ray ended a trial that did not report a failure of its own, from the error Tune
    recorded for it (its ``error.txt``): ``kind`` is ``died`` (the worker process died),
    ``reuse`` (Ray could not hand the trial a reused worker), ``disk`` (the results folder is
    full) or ``ray`` (any other error of Ray's, named by its last line). All are faults of the
    infrastructure, not of the trial's point: the study retries it."""

    kind: str
    detail: str = ""

    def describe(self) -> str:
        """What happened, as a clause: ``its worker died``."""
        return {"died": "its worker died",
                "reuse": "Ray could not reuse a worker for it (the worker's last trial had "
                         "not ended)",
                "disk": f"the results folder is full ({self.detail})",
                }.get(self.kind, f"Ray failed it ({self.detail})")


_DIED = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "actor died",
         "worker died", "died unexpectedly", "killed")


def ray_failure(error: str | None) -> RayFailure:
    """The failure Tune's error text (None: none recorded) says, in ``RayFailure``'s kinds."""
    if not error or not error.strip():
        return RayFailure("died")
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if "No space left on device" in error or "[Errno 28]" in error:
        return RayFailure("disk", "No space left on device")
    if "reset_config" in error:
        return RayFailure("reuse")
    if any(sign in error for sign in _DIED):
        return RayFailure("died")
    return RayFailure("ray", lines[-1][:200])


@dataclass(frozen=True)
class Death:
    """A trial Ray failed (its worker died, or another ``RayFailure``), and what the searcher
    did about it."""

    number: int
    attempt: int  # runs of this point so far: Ray's restarts in place and the study's retries
    retry: int | None  # the number of the retry; None: not retried
    step: int | None  # the step the retry continues from; None: from scratch
    failure: RayFailure = RayFailure("died")

    def describe(self) -> str:
        if self.failure.kind == "disk":
            then = "the search stops; --resume runs it again"
        elif self.retry is None:
            then = "failed: its retries are spent"
        else:
            then = (f"retried as trial {self.retry} from "
                    f"{'scratch' if self.step is None else f'step {self.step}'}")
        return f"trial {self.number}: {self.failure.describe()} (attempt {self.attempt}); {then}"


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) is a full disk."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (isinstance(current, OSError) and current.errno == errno.ENOSPC) or \
                "No space left on device" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False
