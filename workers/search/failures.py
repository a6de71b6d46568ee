"""How a search names what failed a trial in Ray, without Ray: ``RayFailure`` (read from the
error Tune recorded, ``ray_failure``; a full disk from an exception, ``disk_full``) and
``Death``, what the searcher did about it (the line the search prints)."""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class RayFailure:
    """Why Ray ended a trial that did not report a failure of its own, from the error Tune
    recorded for it (its ``error.txt``): ``kind`` is ``died`` (the worker process died),
    ``memory`` (Ray's memory monitor killed the worker: the node ran low on memory), ``start``
    (the worker raised before the trial began: its creation task failed), ``reuse`` (Ray could
    not hand the trial a reused worker), ``disk`` (the results folder is full) or ``ray`` (any
    other error of Ray's). ``detail`` is what Ray said of it, in one clause (empty: nothing
    more). All are faults of the infrastructure, not of the trial's point: the study retries
    it."""

    kind: str
    detail: str = ""

    def describe(self) -> str:
        """What happened, as a clause: ``its worker died (SYSTEM_ERROR: ...)``."""
        said = f" ({self.detail})" if self.detail else ""
        return {"died": f"its worker died{said}",
                "memory": "Ray's memory monitor killed its worker (the node ran low on memory"
                          f"{': ' + self.detail if self.detail else ''})",
                "start": f"its worker raised before the trial began{said}",
                "reuse": "Ray could not reuse a worker for it (the worker's last trial had "
                         "not ended)",
                "disk": f"the results folder is full{said}",
                }.get(self.kind, f"Ray failed it{said}")


_DIED = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "actor died",
         "worker died", "died unexpectedly", "killed")
# Tune appends each failure of a trial to its error.txt under this header: the last one counts.
_HEADER = re.compile(r"^Failure # \d+ \(occurred at [^\n]*\)$", re.M)
# A worker process that died: "... Worker exit type: SYSTEM_ERROR Worker exit detail: Worker
# unexpectedly exits with a connection error code 2. End of file. Some common causes ..."
_EXIT = re.compile(r"Worker exit type: (\w+) Worker exit detail: (.*?)(?:\.(?:\s|$)|$)", re.S)
# Ray's memory monitor: "... Memory on the node (IP: ..., ID: ...) was 1.09GB used / 23.54GB
# limit (0.046479)"
_MEMORY = re.compile(r"was ([\d.]+\s?[KMGT]?i?B used / [\d.]+\s?[KMGT]?i?B limit)")
_CREATION = "error raised in its creation task"


def ray_failure(error: str | None) -> RayFailure:
    """The failure Tune's error text (None: none recorded) says, in ``RayFailure``'s kinds;
    of a trial that failed more than once, its last failure."""
    error = _HEADER.split(error or "")[-1]
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return RayFailure("died")
    if "No space left on device" in error or "[Errno 28]" in error:
        return RayFailure("disk", "No space left on device")
    if "reset_config" in error:
        return RayFailure("reuse")
    if "running low on memory" in error:
        memory = _MEMORY.search(error)
        return RayFailure("memory", memory.group(1) if memory else "")
    if _CREATION in error:  # its traceback's last line is the exception
        return RayFailure("start", lines[-1][:200])
    if any(sign in error for sign in _DIED):  # Ray's exit type and words, else its last line
        said = _EXIT.search(error)
        detail = (lines[-1].rstrip(".") if said is None else
                  f"{said.group(1)}: {' '.join(said.group(2).split())}")
        return RayFailure("died", detail[:200])
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
        return failure_line(self.number, self.attempt, self.failure, then)


def failure_line(number: int, attempt: int, failure: RayFailure, then: str) -> str:
    """The search's one line of a failed run of a trial: which run, what Ray said, what next."""
    return f"trial {number}, attempt {attempt}: {failure.describe()}; {then}"


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
