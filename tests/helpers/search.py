"""What the search's end-to-end tests share: running ``python -m workers.search`` in a
subprocess with its own short Ray temp dir, reading the study back, and the properties every
finished search must have (a consistent study; records that are the trained models)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import optuna
from optuna.trial import TrialState

from workers.search.searcher import finished_count, retried_numbers

SMOKE = ["--space", "aot_vs_standard.yaml", "--task", "modadd", "--smoke-test"]
STEPS = 40  # SMOKE_TRAIN["steps"]


def ray_tmp(tmp: Path) -> Path:
    """A short Ray temp dir per test (socket paths must stay under 108 bytes), linked from tmp."""
    link = tmp / "ray-tmp"
    if not link.exists():
        link.symlink_to(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    return link.resolve()


def launch(tmp: Path, *args: str, env: dict[str, str] | None = None,
           ray: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """``python -m workers.search ARGS`` in ``tmp``: on a Ray of its own, or joining the node
    ``ray`` names (the ``ray_cluster`` fixture's environment); with Python's fault handler on,
    so that ``finish`` can have a hung driver print its threads' stacks."""
    env = {**(env or os.environ), "RAY_TMPDIR": str(ray_tmp(tmp)), "PYTHONFAULTHANDLER": "1",
           **(ray or {})}
    results = [] if "--storage-path" in args else ["--storage-path", str(tmp / "results")]
    return subprocess.Popen([sys.executable, "-m", "workers.search", *args, *results],
                            cwd=tmp, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[str, str]:
    """``proc``'s stdout and stderr once it exits. Past ``timeout`` it is a hang: SIGABRT makes
    Python's fault handler print every thread's stack (``launch`` turns it on), the process
    group goes (the driver and any Ray of its own: a hung driver left running holds the
    node's CPUs and starves the tests after it), and the test fails with the stacks and the
    driver's last lines, so that a hang says where it waited."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):  # the stacks written, it exits
            proc.wait(timeout=15)  # (its pipes stay open while its own Ray, if any, lives)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"no exit within {timeout:g} s; its stacks and last lines:\n"
                             f"{err[-8000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def run(tmp: Path, *args: str, env: dict[str, str] | None = None,
        ray: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = launch(tmp, *args, env=env, ray=ray)
    out, err = finish(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def load(url: str, name: str) -> optuna.Study:
    """The study, through ``studies.storage``: a test polling a new database while the search
    creates its tables waits for them as a second driver would (Optuna alone fails one of the
    two creators with "UNIQUE constraint failed: alembic_version")."""
    from studies.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(url))


def check_consistent(study: optuna.Study, total: int) -> None:
    """Nothing RUNNING or WAITING, ``total`` trials counted, states match steps reached."""
    trials = study.get_trials()
    unfinished = [(t.number, t.state.name, dict(t.user_attrs), sorted(t.intermediate_values))
                  for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert not unfinished, unfinished
    assert finished_count(study) == total
    retried = retried_numbers(trials)
    for t in trials:
        if t.state == TrialState.COMPLETE:
            assert t.user_attrs["steps_reached"] == STEPS and t.user_attrs["status"] == "completed"
            assert max(t.intermediate_values) == STEPS and t.value == t.intermediate_values[STEPS]
            assert t.user_attrs["predicted_error"] > 0 and t.user_attrs["arch_id"]
        elif t.state == TrialState.PRUNED:  # stopped by ASHA: never COMPLETE with a partial value
            assert t.user_attrs["steps_reached"] < STEPS and t.user_attrs["status"] == "stopped"
        else:
            assert t.state == TrialState.FAIL
    assert retried <= {t.number for t in trials if t.state == TrialState.FAIL}
    # No architecture evaluated twice unless it was a retry of a failed run.
    done = [t.user_attrs["arch_id"] for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) == len(set(done))


def assert_records_are_the_trained_models(study: optuna.Study, task: str, tmp: Path) -> None:
    """Every COMPLETE trial's recorded architecture is the task's model and its recorded counts
    are what ``python -m workers.train`` reports for it (the acceptance check of the records)."""
    from arch import ArchConfig
    from workers.tasks import make_task
    from workers.train import main as train_main

    io = make_task(task, "smoke").io
    assert study.metric_names == [study.user_attrs["metric"]]
    assert study.user_attrs["record_schema"] == 2
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert complete
    for t in complete:
        arch = ArchConfig.from_json(t.user_attrs["arch"])
        assert (arch.max_seq_len, arch.vocab_size, arch.input_dim) == (
            io.max_seq_len, io.vocab_size, io.input_dim)
        path = tmp / f"trial{t.number}.yaml"
        path.write_text(arch.to_yaml())
        argv = ["--arch", str(path), "--task", task, "--smoke-test", "--format", "json",
                "--quiet"]
        out = io_capture(lambda argv=argv: train_main(argv))
        reported = json.loads(out)
        assert t.user_attrs["params_trainable"] == reported["trainable_params"]
        assert t.user_attrs["params_total"] == reported["total_params"]


def io_capture(run: object) -> str:
    """stdout of ``run()`` (which must return exit code 0)."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert run() == 0  # type: ignore[operator]
    return buffer.getvalue()


def wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError("timed out")
