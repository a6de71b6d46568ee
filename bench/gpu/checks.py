"""Does the product work on the device: the suite's CUDA tests, and the trainer's own paths
checked against a reference (each row a check with the numbers it compared and whether it
held).

- ``suite``: ``pytest`` on the suite's CUDA and bf16 tests (``SUITE``), in a child process.
- ``checks``: for every attention kind, ``workers.training.trainer``'s loss curve on the device
  (bf16 autocast on CUDA) against the same run in float32 on the CPU; ``torch.compile`` (the
  trainer's ``compile`` on CUDA, for mhsa) against eager on the device; two search trials in a row
  (``workers.search.trial``, no Ray) returning the device's memory to what it held before.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from arch import ATTENTION_KINDS, ArchConfig, HeadGroup, LayerSpec, TrainConfig
from bench.gpu.plan import Context, PartResult, TimeLimit
from workers.tasks import LMTask, describe_task
from workers.training import Trainer

ROOT = Path(__file__).resolve().parents[2]
SUITE = ("tests/test_model.py",)
SUITE_FILTER = "cuda or bf16"
BF16_TOLERANCE = 0.02  # relative: bf16 keeps 8 bits of mantissa, a loss drifts by ~0.4% a step
FP32_TOLERANCE = 1e-4
MEMORY_SLACK = 32 << 20  # bytes a trial may leave held: a cuBLAS workspace made on first use


def run_suite(ctx: Context, result: PartResult, limit: TimeLimit,
              say: Callable[[str], None]) -> None:
    """``pytest`` on ``SUITE`` (``-k SUITE_FILTER``) in a child process with the part's
    limit as its timeout; one row of counts, each failure's name in the notes."""
    report = ctx.work / "suite.xml"
    # the project's addopts left out: its pytest-xdist workers would each import torch for
    # the dozen tests selected
    argv = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
            "-k", SUITE_FILTER, f"--junitxml={report}", *SUITE]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(limit.left(), 1.0))
    except subprocess.TimeoutExpired:
        result.status = "time_up"
        result.note(f"pytest did not finish in {limit.seconds:.0f} s")
        return
    counts = junit_counts(report) if report.exists() else {}
    result.rows.append({"tests": " ".join(SUITE), "filter": SUITE_FILTER, **counts,
                        "exit_code": done.returncode})
    for name in counts.get("failed_names", []):
        result.note(f"failed: {name}")
    if done.returncode not in (0, 5) or counts.get("failed"):  # 5: nothing selected
        result.status = "failed"
        result.note(done.stdout[-2000:].strip().splitlines()[-1] if done.stdout else
                    done.stderr[-500:])


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed, failed and skipped tests of a JUnit XML report, and the failures' names."""
    cases = ET.parse(path).getroot().iter("testcase")
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "failed_names": []}
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failed_names"].append(f"{case.get('classname')}::{case.get('name')}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def small_arch(kind: str) -> ArchConfig:
    """A two-layer causal byte LM of ``kind`` (a latent layer caches half of mhsa's)."""
    layer = LayerSpec(kind, (HeadGroup(4, 16),), mlp_ratio=2.0,  # type: ignore[arg-type]
                      latent_dim=64 if kind == "latent" else 0)
    return ArchConfig(d_model=64, layers=(layer, layer), max_seq_len=64, vocab_size=256)


def losses(arch: ArchConfig, steps: int, device: str, backend: str | None = None
           ) -> list[float]:
    """``workers.training.trainer``'s training loss at each of ``steps`` steps of the byte LM (the
    same seed and batches wherever it runs); compiled with ``backend`` when given (the trainer's
    own ``compile`` flag for inductor, the default backend)."""
    config = TrainConfig(steps=steps, batch_size=8, eval_every=1, eval_batches=1, lr=3e-3,
                         warmup=0.0, device=device, compile=backend == "inductor")
    trainer = Trainer(arch, LMTask(length=64), config)
    if backend not in (None, "inductor"):  # e.g. aot_eager: the CPU smoke's quick tracing
        trainer.forward = torch.compile(trainer.model, backend=backend)  # type: ignore[assignment]
    result = trainer.run()
    if result.status != "completed":
        raise RuntimeError(f"{arch.describe()} on {device}: {result.status} ({result.error})")
    return [r.train_loss for r in result.history]


def compare(check: str, kind: str, got: list[float], want: list[float], tolerance: float
            ) -> dict[str, Any]:
    """A row: the largest relative difference of two loss curves against ``tolerance``."""
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    return {"check": check, "kind": kind, "final_loss": got[-1], "reference_loss": want[-1],
            "max_rel_diff": worst, "tolerance": tolerance, "passed": worst <= tolerance}


def memory_rows(ctx: Context) -> list[dict[str, Any]]:
    """Two search trials in a row on the device: the memory it holds after each against
    before the first, allocated (live tensors) and reserved (what the caching allocator keeps
    from other processes: a trial empties its cache for the next); not measured on the CPU."""
    from studies.trials import Direction, TrialStatus
    from workers.search import TrialJob, TrialSpec

    job = TrialJob(task=describe_task(LMTask(length=64)), metric="loss",
                   direction=Direction.MINIMIZE,
                   device=ctx.device, checkpoints=False)
    spec = TrialSpec(small_arch("mhsa"), {"steps": 2 * ctx.sizes.check_steps, "batch_size": 8,
                                          "eval_every": ctx.sizes.check_steps})
    before, threads = cuda_memory(ctx.device), torch.get_num_threads()
    rows = []
    for trial in (1, 2):
        reports = one_trial(job, spec)
        after = cuda_memory(ctx.device)
        held = {k: None if before is None or after is None else after[i] - before[i]
                for i, k in enumerate(("held_allocated", "held_reserved"))}
        ok = len(reports) == 2 and all(r.status == TrialStatus.RUNNING for r in reports)
        rows.append({"check": "memory released", "kind": f"trial {trial}", **held,
                     "reports": len(reports),
                     "passed": ok and all(v is None or v <= MEMORY_SLACK for v in held.values())})
    torch.set_num_threads(threads)  # a trial sets its worker's threads
    return rows


def one_trial(job: Any, spec: Any) -> list[Any]:
    """The reports of one search trial (``workers.search.trial.train_trial``, no Ray)."""
    from workers.search import train_trial

    reports: list[Any] = []
    with tempfile.TemporaryDirectory() as work:
        train_trial(job, spec, lambda report, _: reports.append(report), Path(work), "bench")
    return reports


def cuda_memory(device: str) -> tuple[int, int] | None:
    """CUDA's (allocated, reserved) bytes; None on the CPU."""
    if device != "cuda":
        return None
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def run_checks(ctx: Context, result: PartResult, limit: TimeLimit,
               say: Callable[[str], None]) -> None:
    """bf16 autocast for every kind, the trainer's memory between trials, then the trainer's
    compile, each started only while the limit lasts."""
    steps = ctx.sizes.check_steps
    tolerance = BF16_TOLERANCE if ctx.device == "cuda" else FP32_TOLERANCE
    # the trainer uses bf16 autocast on CUDA only: on the CPU both runs are float32
    label = f"{ctx.device} ({'bf16 autocast' if ctx.device == 'cuda' else 'float32'}) vs cpu"
    for kind in ATTENTION_KINDS:
        limit.check(f"the autocast check of {kind}")
        arch = small_arch(kind)
        result.rows.append(compare(label, kind,
                                   losses(arch, steps, ctx.device), losses(arch, steps, "cpu"),
                                   tolerance))
        say(f"checks: {kind} autocast max rel diff {result.rows[-1]['max_rel_diff']:.2e}")
    limit.check("the memory check")
    result.rows.extend(memory_rows(ctx))
    for kind in ("mhsa",):  # the trainer's whole-model compile; every kind's: "compiled"
        limit.check(f"the compile check of {kind}")
        torch._dynamo.reset()
        arch = small_arch(kind)
        result.rows.append(compare(f"compile ({ctx.backend}) vs eager", kind,
                                   losses(arch, steps, ctx.device, ctx.backend),
                                   losses(arch, steps, ctx.device), tolerance))
        say(f"checks: {kind} compiled max rel diff {result.rows[-1]['max_rel_diff']:.2e}")
    if not all(r["passed"] for r in result.rows):
        result.status = "failed"
