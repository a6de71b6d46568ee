"""How long a search will take, said before Ray starts and revised as trials finish.

Before: a handful of training steps of the first starting point's architecture (the
allocator's plan, or the grid's first point; a random point of the space without one), timed
here at the trials' batch size, threads and device, times the trial's steps, plus its
evaluations. During (``remaining``): the mean time of the finished trials, the ages of the
running ones and how many run at once. No Ray here (``workers.search.tune`` calls it).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from common.progress import duration
from search_spaces import FixedSuggester, RandomSuggester, SearchSpace
from workers.search.protocol import TrialJob, TrialSpec
from workers.search.searcher import Start
from workers.tasks import Task

PROBE_SECONDS = 1.5  # the timed steps stop after this long (after one untimed warm-up step)
PROBE_STEPS = 8  # ... or after this many
BASES = {"allocator": "the allocator's plan", "grid": "the grid's first point"}


@dataclass(frozen=True)
class TrialEstimate:
    """One trial's time, from a few timed steps: ``step_s`` per training step, ``eval_s`` per
    evaluation batch, for ``steps`` steps with ``evaluations`` evaluations of ``eval_batches``."""

    step_s: float
    eval_s: float
    steps: int
    evaluations: int
    eval_batches: int
    timed: int  # steps timed
    basis: str  # which architecture was timed

    @property
    def trial_s(self) -> float:
        return self.steps * self.step_s + self.evaluations * self.eval_batches * self.eval_s


def probe(space: SearchSpace, task: Task, job: TrialJob, starts: Sequence[Start]
          ) -> TrialEstimate:
    """Time a few training steps of the first starting point (see the module docstring)."""
    import torch

    from workers.trainer import Trainer, evaluate

    if starts:
        arch, train = space.sample(FixedSuggester(starts[0].params, job.seed), task.io)
        basis = BASES.get(starts[0].label, f"the {starts[0].label} starting point")
    else:
        arch, train = space.sample(RandomSuggester(job.seed), task.io)
        basis = "a random point of the space"
    config = TrialSpec(arch, train).train_config(job)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, job.threads))  # as a trial's worker
    try:
        trainer = Trainer(arch, task, config)
        trainer.train_step()  # warm-up: first-call allocations, kernels picked
        timed, start = 0, time.perf_counter()
        while timed < min(PROBE_STEPS, config.steps) and (
                time.perf_counter() - start < PROBE_SECONDS or timed == 0):
            trainer.train_step()
            timed += 1
        step_s = (time.perf_counter() - start) / timed
        start = time.perf_counter()
        evaluate(trainer.model, task, dataclasses.replace(config, eval_batches=1),
                 trainer.device)
        eval_s = time.perf_counter() - start
        del trainer
    finally:
        torch.set_num_threads(threads)
        if torch.cuda.is_initialized():  # the trials need the GPU memory, not the driver
            torch.cuda.empty_cache()
    return TrialEstimate(step_s, eval_s, config.steps, math.ceil(config.steps / config.eval_every),
                         config.eval_batches, timed, basis)


def at_once(cpus_per_trial: float, gpus_per_trial: float, max_concurrent: int | None,
            trials: int) -> int:
    """Trials that run at once on this machine (what Ray can place: CPUs, and GPUs when trials
    take a share of one), at most ``max_concurrent`` and ``trials``."""
    count = max(1, int((os.cpu_count() or 1) // cpus_per_trial))
    if gpus_per_trial > 0:
        import torch

        count = min(count, max(1, int(torch.cuda.device_count() // gpus_per_trial)))
    return max(1, min(count, max_concurrent or count, trials))


def describe(estimate: TrialEstimate, trials: int, concurrent: int, scheduler: str) -> str:
    """``~3 min per trial (...), ~30 min for 20 trials at 2 at once (...)``."""
    total = math.ceil(trials / concurrent) * estimate.trial_s
    early = "; ASHA stops weaker trials early, so usually less" if scheduler == "asha" else ""
    # Ray adds seconds per trial (a worker, reports, checkpoints): felt only by tiny trials.
    return (f"~{duration(estimate.trial_s)} per trial ({estimate.steps:,} steps at "
            f"{estimate.step_s * 1000:,.0f} ms/step and {estimate.evaluations:,} evaluations, "
            f"timed over {estimate.timed} steps of {estimate.basis} here, plus Ray's few "
            f"seconds), at most "
            f"~{duration(total)} for {trials} trial(s) at {concurrent} at once{early}")


def remaining(done: Sequence[float], ages: Sequence[float], pending: int, concurrent: int
              ) -> float | None:
    """Seconds left in a search: ``done``, the durations of the finished trials (their mean
    stands for every trial to come); ``ages`` of the running ones; ``pending`` not started;
    ``concurrent`` at once. None before a trial has finished."""
    if not done:
        return None
    mean = sum(done) / len(done)
    running = [max(0.0, mean - age) for age in ages]
    work = sum(running) + pending * mean
    return max(max(running, default=0.0), work / max(1, concurrent))
