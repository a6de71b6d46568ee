"""How long a search will take, said before Ray starts and revised as trials finish.

Before: a handful of training steps of the first starting point's architecture (the
allocator's plan, or the grid's first point; a random point of the space without one), timed
here at the trials' batch size, threads and device, times the trial's steps, plus its
evaluations; and what Ray adds (``SearchEstimate``): its start, the trial workers' start, and
its bookkeeping per trial, which are most of a smoke search's time. During (``remaining``): the
mean time of the finished trials, the ages of the running ones and how many run at once. No Ray
here (``workers.search.tune`` calls it).
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
from workers.search.seeding import Start
from workers.tasks import Task

# What Ray adds on a quiet 2-core machine (docs/benchmarks.md, "Search overhead": ray.init
# 2.4 s, a worker importing torch ~3 s alone, 1.25 s per trial with checkpoints):
RAY_START_S = 2.5  # ray.init and its daemons, once per search
WORKER_START_S = 4.0  # trial workers starting at once, beside the driver
TRIAL_OVERHEAD_S = 1.25  # per trial: Tune's scheduling, reports, checkpoints, the study's writes
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

    from workers.training.trainer import Trainer, evaluate

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


def measured(work: Work, concurrent: int) -> str | None:
    """What the first trials measured, once each of the first ``concurrent`` has two
    evaluations: the time per step between them at this concurrency (the workers' start-up
    left out), per trial, and for the search (``~4 min per trial at 120 ms/step ...``); None
    before."""
    timed = work.step_time()
    if timed is None or timed[1] < min(concurrent, work.trials):
        return None
    per_step, count = timed
    trial = per_step * work.steps
    total = math.ceil(work.trials / concurrent) * trial
    return (f"measured on its first {count} trial(s) at {count} at once: "
            f"{per_step * 1000:,.0f} ms/step, ~{duration(trial)} per trial; at most "
            f"~{duration(total)} for {work.trials} trial(s)")


@dataclass(frozen=True)
class SearchEstimate:
    """A search's time: Ray's start and its trial workers' (one per trial at once when workers
    are reused, else one per trial), then the trials in rounds of ``concurrent``, each its
    training (``trial``) and Ray's bookkeeping. Ray's parts are constants of a quiet machine,
    ``slowdown`` times slower on a loaded one (the probe's steps were timed under the load)."""

    trial: TrialEstimate
    trials: int
    concurrent: int
    reuse_actors: bool = True
    slowdown: float = 1.0

    @property
    def rounds(self) -> int:
        return math.ceil(self.trials / self.concurrent)

    @property
    def start_s(self) -> float:
        """Ray's start and the trial workers' (in parallel, a round's at a time)."""
        workers = 1 if self.reuse_actors else self.rounds
        return (RAY_START_S + workers * WORKER_START_S) * self.slowdown

    @property
    def per_trial_s(self) -> float:
        return self.trial.trial_s + TRIAL_OVERHEAD_S * self.slowdown

    @property
    def total_s(self) -> float:
        return self.start_s + self.rounds * self.per_trial_s


def slowdown() -> float:
    """How much slower than alone this machine runs a process now: its 1-minute load over its
    cores (at least 1; 1 where the system has no load average)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def describe(search: SearchEstimate, scheduler: str) -> str:
    """``~3 min per trial (...) and ~1.3 s of Ray's; with ..., at most ~30 min for 20 trials at
    2 at once``."""
    timed = search.trial
    early = "; ASHA stops weaker trials early, so usually less" if scheduler == "asha" else ""
    load = f" at load {search.slowdown:.1f}x the cores" if search.slowdown > 1 else ""
    return (f"~{duration(timed.trial_s)} per trial ({timed.steps:,} steps at "
            f"{timed.step_s * 1000:,.0f} ms/step and {timed.evaluations:,} evaluations, "
            f"timed over {timed.timed} steps of {timed.basis} here) and "
            f"~{duration(search.per_trial_s - timed.trial_s)} of Ray's; with Ray's start and "
            f"its workers' (~{duration(search.start_s)}{load}), at most "
            f"~{duration(search.total_s)} for {search.trials} trial(s) at {search.concurrent} "
            f"at once{early}")


@dataclass
class Work:
    """A running search's progress in training steps, measured on its trials (``Progress``'s
    time left for a search): steps trained per trial, at the rate all trials together trained
    them since the first started. Counted in steps, not finished trials, so the estimate moves
    as training does, not by a whole trial's time at each end.

    ``steps``: a trial's full training; ``trials``: trials to finish in this run.
    """

    steps: int
    trials: int
    started: float | None = None  # when the first trial started
    at: dict[str, int] = dataclasses.field(default_factory=dict)  # running trial -> step
    base: dict[str, int] = dataclasses.field(default_factory=dict)  # its step when it started
    trained: int = 0  # steps trained by finished trials in this run
    ended: list[int] = dataclasses.field(default_factory=list)  # steps each finished trial had
    # a running trial's first evaluation and its latest (time, step): its time per step, past
    # the worker's start-up
    first: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)
    latest: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)

    def start(self, now: float) -> None:
        """A trial started training (the rate counts from the first)."""
        if self.started is None:
            self.started = now

    def report(self, trial: str, step: int, resumed: int, now: float) -> None:
        """A trial's evaluation at ``step`` (continued from step ``resumed``)."""
        self.start(now)
        self.base.setdefault(trial, resumed)
        self.at[trial] = max(step, self.at.get(trial, 0))
        self.first.setdefault(trial, (now, step))
        self.latest[trial] = (now, step)

    def step_time(self) -> tuple[float, int] | None:
        """(seconds per step of one trial, trials it is measured on): each running trial's
        time between its first and its latest evaluation over the steps between them, averaged;
        None before a trial has two evaluations."""
        times = [(t1 - t0) / (s1 - s0) for trial, (t0, s0) in self.first.items()
                 if trial in self.latest and (t1 := self.latest[trial][0]) > t0
                 and (s1 := self.latest[trial][1]) > s0]
        return (sum(times) / len(times), len(times)) if times else None

    def finish(self, trial: str, counted: bool = True) -> None:
        """A trial ended (``counted``: it counts as one of ``trials``; a failed one that is
        retried does not)."""
        step = self.at.pop(trial, 0)
        self.trained += max(0, step - self.base.pop(trial, step))
        self.first.pop(trial, None)
        self.latest.pop(trial, None)
        if counted:
            self.ended.append(step)

    def rate(self, now: float) -> float | None:
        """Steps per second, all trials together, since the first trial started."""
        done = self.trained + sum(max(0, s - self.base.get(t, s)) for t, s in self.at.items())
        if self.started is None or done <= 0 or now <= self.started:
            return None
        return done / (now - self.started)

    def left(self, now: float) -> float | None:
        """Seconds left: the running trials' steps to go and the trials not started, at the
        steps the finished trials reached (a pruned trial's fewer; the full training before
        any finished), over the rate."""
        rate = self.rate(now)
        if rate is None:
            return None
        typical = sum(self.ended) / len(self.ended) if self.ended else self.steps
        pending = max(0, self.trials - len(self.ended) - len(self.at))
        to_go = sum(self.steps - s for s in self.at.values()) + pending * typical
        return max(0.0, to_go) / rate

    def running(self) -> str:
        """The running trials' steps: ``700/2,000, 300/2,000``."""
        return ", ".join(f"{s:,}/{self.steps:,}" for s in self.at.values())
