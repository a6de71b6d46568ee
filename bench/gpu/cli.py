"""python -m bench.gpu [--minutes 8] [--out results/gpu] [--docs docs/benchmarks.md]

Everything GPU-specific in one command, from ``PYTHONPATH=.`` with what the GPU image holds
(``bench/gpu/image.yaml``): the suite's CUDA tests and the trainer's device checks (bf16
autocast for every kind, ``torch.compile``, memory between search trials); training throughput
and MFU of every attention kind at GPT-2 small, eager and compiled, beside a plain PyTorch
block; bf16 logits parity of a GQA Llama and its compact and latent students against
``transformers``, and their decode speed at a long context; a short training of a planned (or
``--arch``) architecture beside the uniform baseline. Each part has its own time limit (the
run about ``--minutes``); a part that runs out keeps what it measured and says so. A missing
package stops the command before any work, naming what to carry. Writes ``gpu.json`` and
``gpu.md`` to ``--out``; ``--docs`` fills the "GPU" section of docs/benchmarks.md.
``--device cpu --smoke-test`` runs every part at a tiny size on the CPU in CI.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import logging
import platform
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu import report
from bench.gpu.image import missing_modules, read_image
from bench.gpu.plan import (
    BASE_MODULES,
    DEFAULT_MINUTES,
    FULL,
    MODULES,
    PART_SECONDS,
    SMOKE,
    Context,
    PartResult,
    Sizes,
    TimeLimit,
    TimeUp,
    hard_stop,
)
from common.cli import Parser, add_format, dump, fail, number
from common.errors import TransformerAllocError
from common.files import write_atomic

PROG = "bench.gpu"
SMOKE_MINUTES = 30.0
PARTS = tuple(PART_SECONDS)
GRACE_S = 20.0  # past its limit, a part is stopped wherever it is
DISTRIBUTIONS = {"yaml": "pyyaml"}  # import name -> what to carry, where they differ
log = logging.getLogger(__name__)
Part = Callable[[Context, PartResult, TimeLimit, Callable[[str], None]], None]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--smoke-test", action="store_true",
                   help="every part at a tiny size (seconds on a CPU)")
    p.add_argument("--minutes", type=number(0, strict=True),
                   help=f"the whole run's time, shared by the parts in fixed proportions "
                        f"(default: {DEFAULT_MINUTES:g}; {SMOKE_MINUTES:g} with --smoke-test, "
                        "whose time limits are not what it checks: a busy CI box may be slow)")
    p.add_argument("--parts", type=parts_list, default=PARTS,
                   help=f"comma-separated, from {','.join(PARTS)} (default: all)")
    p.add_argument("--arch", type=Path, help="the training part's architecture (an "
                   "ArchConfig YAML; default: the allocator's plan at the throughput shape)")
    p.add_argument("--out", type=Path, default=Path("results/gpu"),
                   help="folder of the report (gpu.json, gpu.md)")
    p.add_argument("--docs", type=Path, help="fill this file's bench.gpu section (the GPU "
                   "section of docs/benchmarks.md)")
    p.add_argument("--render", type=Path, metavar="GPU_JSON",
                   help="measure nothing: render a report written before (into --docs)")
    p.add_argument("--compile-backend", help="torch.compile backend (default: inductor on "
                   "cuda, aot_eager on the CPU, where inductor's C++ build takes minutes)")
    p.add_argument("--peak-tflops", type=number(0, strict=True),
                   help="the device's bf16 peak for MFU (default: its data sheet's, by name)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_format(p)
    return p


def parts_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: parts are {', '.join(PARTS)}")
    return tuple(n for n in PARTS if n in names)


def preflight(args: argparse.Namespace) -> None:
    """Everything that would stop the run, checked before any work.

    Raises:
        TransformerAllocError: a missing package (with what to carry), no CUDA device, an
            ``--arch`` that is no architecture, a ``--docs`` without the section's markers.
    """
    from common.errors import UsageError

    needed: dict[str, list[str]] = {}
    for name in args.parts:
        for module in (*BASE_MODULES, *MODULES.get(name, ())):
            needed.setdefault(module, []).append(name)
    missing = missing_modules(needed)
    if missing:
        what = ", ".join(f"{DISTRIBUTIONS.get(m, m)} ({', '.join(needed[m])})" for m in missing)
        image = read_image()
        raise UsageError(f"missing packages: {what}; carry their wheels for Python "
                         f"{image.python} (docs/benchmarks.md, GPU) or leave those parts out "
                         "with --parts")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available (the CPU check is "
                         "--device cpu --smoke-test)")
    if args.arch is not None:
        from arch import ArchConfig
        from common.files import read_yaml

        ArchConfig.from_dict(read_yaml(args.arch))
    if args.docs is not None:
        report.fill_docs_check(args.docs)


def part_functions() -> dict[str, Part]:
    from bench.gpu import checks, speed, students, training

    return {"suite": checks.run_suite, "checks": checks.run_checks,
            "throughput": speed.run_eager, "compiled": speed.run_compiled,
            "parity": students.run_parity, "decode": students.run_decode,
            "training": training.run_training}


def run_part(ctx: Context, name: str, fn: Part, seconds: float,
             say: Callable[[str], None], grace: float = GRACE_S) -> PartResult:
    """One part within ``seconds`` (stopped wherever it is ``grace`` seconds later): what it
    measured, however it ended."""
    result = PartResult(name, limit_s=seconds)
    if seconds <= 0:
        result.status = "skipped"
        result.note("the run's time was spent")
        return result
    limit, start = TimeLimit(seconds), time.monotonic()
    say(f"{name}: start (limit {seconds:.0f} s)")
    try:
        with hard_stop(seconds + grace):
            fn(ctx, result, limit, say)
    except TimeUp as err:
        result.status = "time_up"
        result.note(str(err))
    except ModuleNotFoundError as err:
        result.status = "failed"
        result.note(f"missing package {err.name}: carry its wheel (docs/benchmarks.md, GPU)")
    except Exception as err:
        result.status = "failed"
        result.note(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        log.error("%s failed:\n%s", name, traceback.format_exc())
    result.seconds = time.monotonic() - start
    say(f"{name}: {result.status} in {result.seconds:.1f} s")
    free_device(ctx.device)
    return result


def free_device(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def device_facts(device: str) -> dict[str, Any]:
    import torch

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    name = torch.cuda.get_device_name() if device == "cuda" else \
        f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    return {"kind": device, "name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": version("transformers"),
            "python": platform.python_version()}


def sizes_text(sizes: Sizes, device: str) -> dict[str, str]:
    """What each part's table measured, for its heading."""
    s, t = sizes.shape, sizes.teacher
    mixed = "bf16 autocast" if device == "cuda" else "float32"
    return {
        "throughput": f"{s.layers} layers, d_model {s.d_model}, {s.heads} heads of "
                      f"{s.d_model // s.heads}, MLP {s.mlp_ratio:g}x, causal, sequence "
                      f"{s.seq_len}, batch {s.batch}, {mixed}, forward + backward + fused "
                      f"AdamW; median of up to {sizes.rounds} rounds of {sizes.steps} steps",
        "checks": f"byte LM, 2 layers of 4 heads of 16, {sizes.check_steps} steps",
        "parity": f"random Llama, {t.layers} layers, d_model {t.hidden}, {t.heads} heads, "
                  f"{t.kv_heads} key/value heads, vocabulary {t.vocab}; 2 x "
                  f"{sizes.parity_tokens} tokens",
        "decode": f"the same models, batch {sizes.batch}, context {sizes.context}, "
                  f"{sizes.new_tokens} new tokens",
        "training": f"{sizes.train_steps} steps of {sizes.train_batch} x "
                    f"{min(s.seq_len, 1024)} bytes, {mixed}"}


def run_parts(ctx: Context, args: argparse.Namespace, say: Callable[[str], None],
              done: Callable[[list[PartResult]], None]) -> None:
    """The selected parts in order, each within its share of ``--minutes`` plus what the parts
    before it left unused (less what they overran); ``done`` after each, with those so far."""
    functions, results, saved = part_functions(), [], 0.0
    scale, start = args.minutes / DEFAULT_MINUTES, time.monotonic()
    for name in args.parts:
        left = args.minutes * 60 - (time.monotonic() - start)
        seconds = min(PART_SECONDS[name] * scale + saved, left)
        results.append(run_part(ctx, name, functions[name], seconds, say))
        saved = seconds - results[-1].seconds if seconds > 0 else saved
        done(results)


def write_report(out: Path, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "gpu.json", json.dumps(data, indent=2) + "\n")
    write_atomic(out / "gpu.md", report.markdown(data))


def measure(args: argparse.Namespace, argv: list[str], say: Callable[[str], None]
            ) -> dict[str, Any]:
    """Run the parts; the report, written to ``--out`` after each part (a run killed midway
    leaves what it measured)."""
    from bench.gpu import speed, students

    sizes = SMOKE if args.smoke_test else FULL
    start = time.monotonic()
    backend = args.compile_backend or ("inductor" if args.device == "cuda" else "aot_eager")
    peak = args.peak_tflops * 1e12 if args.peak_tflops else speed.peak_flops(args.device)
    data: dict[str, Any] = {
        "command": "python -m bench.gpu " + shlex.join(argv),
        "date": datetime.date.today().isoformat(),
        "device": {**device_facts(args.device), "peak_tflops": None if peak is None
                   else peak / 1e12, "matmul_tflops": None},
        "minutes": args.minutes, "sizes": sizes_text(sizes, args.device)}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        ctx = Context(args.device, sizes, Path(work), args.out, backend, peak, args.smoke_test,
                      arch_file=args.arch)

        def done(results: list[PartResult]) -> None:
            data.update(wall_s=time.monotonic() - start, parts=[asdict(r) for r in results])
            data["device"]["matmul_tflops"] = ctx.matmul_tflops
            data["goals"] = report.goal_rows(data)
            write_report(args.out, data)

        if {"parity", "decode"} & set(args.parts):
            ctx.students = students.StudentsJob(ctx).start()
        try:
            run_parts(ctx, args, say, done)
        finally:
            if ctx.students is not None:
                ctx.students.stop()
    return data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.minutes is None:
        args.minutes = SMOKE_MINUTES if args.smoke_test else DEFAULT_MINUTES
    if not args.quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    say: Callable[[str], None] = (lambda line: None) if args.quiet else log.info
    try:
        if args.render is not None:
            data = json.loads(args.render.read_text())
        else:
            preflight(args)
            data = measure(args, argv, say)
        if args.docs is not None:
            report.fill_docs(args.docs, report.markdown(data))
    except TransformerAllocError as err:
        return fail(PROG, str(err))
    except (OSError, ValueError) as err:
        return fail(PROG, f"{type(err).__name__}: {err}")
    print(report.summary(data) if args.format == "table" else dump(data, args.format))
    return 1 if any(p["status"] == "failed" for p in data["parts"]) else 0
