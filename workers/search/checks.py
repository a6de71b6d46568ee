"""What a search checks before anything starts: a study name that is also a safe directory name,
a writable result directory, a GPU where trials take a share of one, trials that fit in the
memory a trial has; and the device trials train on. Each check raises ``SearchError``, one
line naming the flag, the value and the rule."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arch import gib, training_bytes
from common.errors import Problem, excerpt
from workers.errors import SearchError
from workers.search.options import SearchOptions

if TYPE_CHECKING:
    from search_spaces import SearchSpace
    from workers.tasks import Task


def check_points(space: SearchSpace, points: Sequence[Mapping[str, Any]]) -> None:
    """Every one of ``points`` (``SearchOptions.points``) is a point of ``space``'s grid: a
    point outside it would be sampled as another."""
    if not points:
        return
    from alloc import point_key
    from search_spaces import SpaceError

    try:
        grid = {point_key(p) for p in space.grid(limit=100_000)}
    except SpaceError as err:
        raise SearchError(f"points: need a finite space: {err}") from None
    outside = [dict(p) for p in points if point_key(p) not in grid]
    if outside:
        raise SearchError(f"points: {excerpt(outside[0])} is not a point of space "
                          f"{space.name!r}; give points of its grid")


def trial_device(opts: SearchOptions) -> str:
    """The device every trial trains on: CUDA when trials get a GPU share, else the CPU."""
    return "cuda" if opts.gpus_per_trial > 0 else "cpu"


# A study name is also a directory name (Ray's results): letters, digits, ".", "_", "-".
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_study_name(name: str, field: str = "study", why: str = "") -> None:
    """Raise ``SearchError`` unless ``name`` is 1-100 safe characters (no path separators): a
    problem of ``field`` (``study``, ``warm_start``), ``why`` said after the rule."""
    if not STUDY_NAME.fullmatch(name):
        raise SearchError.of([Problem(field, excerpt(name), "must be 1 to 100 letters, digits, "
                                      f"'.', '_' or '-', starting with a letter or digit{why}")])


def check_trial_memory(space: SearchSpace, task: Task, opts: SearchOptions) -> None:
    """Raise ``SearchError`` when the space's largest trial cannot fit in the memory a trial
    has here (a GPU's share, or the machine's memory over the trials that run at once); on a
    cluster (``--address``) the workers' memory is not known here and nothing is checked."""
    if opts.address is not None:
        return
    largest = space.largest(task.io)
    batch = int(space.largest_train("batch_size"))
    need = training_bytes(largest, batch)  # AdamW: the optimizer with the most state
    if opts.gpus_per_trial > 0:
        import torch

        have = int(torch.cuda.get_device_properties(0).total_memory * opts.gpus_per_trial)
        where = f"{opts.gpus_per_trial:g} of a GPU"
    else:
        at_once = max(1, int((os.cpu_count() or 1) // opts.cpus_per_trial))
        at_once = min(at_once, opts.max_concurrent or at_once)
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // at_once
        where = f"a share of this machine's memory ({at_once} trial(s) at once)"
    if need > have:
        raise SearchError(
            f"space {excerpt(space.name)}: its largest trial (d_model {largest.d_model}, "
            f"{largest.n_layers} layers, length {largest.max_seq_len}, batch {batch}) needs "
            f"about {gib(need)} to train, more than the {gib(have)} of {where}; lower the "
            "budget, depth or batch_size")


def check_gpus(opts: SearchOptions) -> None:
    """Raise ``SearchError`` when trials take a GPU share but this machine has no CUDA device
    (on a cluster, ``--address``, the workers' devices are not known here)."""
    if opts.gpus_per_trial > 0 and not opts.address:
        import torch

        if not torch.cuda.is_available():
            raise SearchError.of([Problem("gpus_per_trial", f"{opts.gpus_per_trial:g}",
                                          "no CUDA device here")])


def check_writable_dir(field: str, path: Path) -> None:
    """Raise ``SearchError`` unless ``path`` is, or can be made, a writable directory (a problem
    of ``field``: ``storage_path``)."""
    existing = next(p for p in (path.resolve(), *path.resolve().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "not a directory" if not existing.is_dir() else "not writable"
        raise SearchError.of([Problem(field, excerpt(str(path)), f"{str(existing)!r} is {why}")])


def check_warm_start(source: str, study: str) -> None:
    """Raise ``SearchError`` unless ``source`` is a safe name of another study than ``study``."""
    check_study_name(source, "warm_start")
    if source == study:
        raise SearchError.of([Problem("warm_start", repr(source), "is the study this search "
                                      "writes; give another study of the same {storage}")])
