"""python -m bench.data_loader [--gigabytes 1] [--smoke-test] [--dir /tmp/bench-data]

The user's-data path at scale: (1) ``alloc.profile`` on a generated nanoGPT-style ``train.bin``
of the given size (uint16 tokens), run as its own process: wall time and peak resident memory;
(2) training tokens/s of one model on windows read from that ``.bin`` file against the same model
on the built-in ``lm`` task (the same vocabulary and window length, batches built in memory),
interleaved rounds, and the time to build one batch for each.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.cli import Parser, add_format, dump, int_in, number, render_table

CHUNK = 1 << 26  # tokens written at a time (128 MB)


def generate_bin(folder: Path, tokens: int, seed: int = 0) -> Path:
    """``train.bin`` (``tokens`` uint16 byte-valued tokens, a noisy copy process so neighbouring
    tokens depend) and a small ``val.bin``, written chunk by chunk."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with (folder / "train.bin").open("wb") as handle:
        for start in range(0, tokens, CHUNK):
            n = min(CHUNK, tokens - start)
            chunk = rng.integers(0, 256, n, dtype=np.uint16)
            copy = rng.random(n) < 0.5
            chunk[1:][copy[1:]] = chunk[:-1][copy[1:]]  # x_t = x_{t-1} half the time
            chunk.tofile(handle)
    rng.integers(0, 256, 1 << 20, dtype=np.uint16).tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 256}))
    return folder


def profile_run(folder: Path) -> dict[str, Any]:
    """``python -m alloc.profile --no-pilot`` (the data's statistics: the reader at scale) on
    ``folder`` in a child process: wall and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "alloc.profile", "--data", str(folder),
                           "--no-pilot", "--format", "json"], capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"alloc.profile failed: {proc.stderr[-2000:]}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    report = json.loads(proc.stdout)
    return {"file_gb": (folder / "train.bin").stat().st_size / 1e9, "wall_s": wall,
            "profile_s": report["wall_s"], "peak_rss_gb": max(peak_kb, before) / 1e6,
            "sampled_tokens": report["sample"], "kernel": report["kernel"]["best"],
            "input_dim": report["input_dim"]}


def throughput(folder: Path, steps: int, rounds: int, smoke: bool) -> dict[str, Any]:
    """Median training tokens/s and batch-building time: ``.bin`` windows vs the ``lm`` task."""
    import torch

    from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig
    from userdata import DataSpec
    from workers.tasks import make_data_task, make_task
    from workers.training import Trainer

    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    length = 64 if smoke else 256
    width = 64 if smoke else 256
    tasks = {"bin file": make_data_task(DataSpec(str(folder)), length=length),
             "lm (in memory)": make_task("lm", "paper", length=length)}
    layer = LayerSpec("mhsa", (HeadGroup(4, width // 4),), mlp_ratio=4.0)
    arch = ArchConfig(d_model=width, layers=(layer,) * 2, max_seq_len=1, vocab_size=1)
    config = TrainConfig(steps=steps, batch_size=16, eval_every=steps, eval_batches=1,
                         device="cpu")
    rates: dict[str, list[float]] = {name: [] for name in tasks}
    batch_us: dict[str, float] = {}
    for _ in range(rounds):  # interleaved, so drift on a shared machine hits both
        for name, task in tasks.items():
            rates[name].append(Trainer(arch, task, config).run().tokens_per_s)
    for name, task in tasks.items():
        start = time.perf_counter()
        for i in range(50):
            task.batch("train", i, 16)
        batch_us[name] = (time.perf_counter() - start) / 50 * 1e6
    median = {name: statistics.median(r) for name, r in rates.items()}
    rows = [{"data": name, "tokens_per_s": median[name], "batch_us": batch_us[name]}
            for name in tasks]
    return {"rows": rows, "ratio": median["bin file"] / median["lm (in memory)"],
            "steps": steps, "rounds": rounds, "length": length, "d_model": width}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.data_loader", description=__doc__.split("\n\n")[1])
    p.add_argument("--gigabytes", type=number(0, strict=True), default=1.0,
                   help="size of the generated train.bin")
    p.add_argument("--dir", type=Path, default=Path("/tmp/bench-data"),
                   help="where the generated files go (reused when the size matches)")
    p.add_argument("--steps", type=int_in(1), default=60, help="training steps per round")
    p.add_argument("--rounds", type=int_in(1), default=5)
    p.add_argument("--smoke-test", action="store_true", help="10 MB, a small model, 2 rounds")
    add_format(p)
    args = p.parse_args(argv)
    gigabytes = 0.01 if args.smoke_test else args.gigabytes
    tokens = int(gigabytes * 1e9) // 2
    train = args.dir / "train.bin"
    if not train.exists() or train.stat().st_size != 2 * tokens:
        generate_bin(args.dir, tokens)
    result = {"profile": profile_run(args.dir),
              "throughput": throughput(args.dir, 10 if args.smoke_test else args.steps,
                                       2 if args.smoke_test else args.rounds,
                                       args.smoke_test)}
    if args.format != "table":
        print(dump(result, args.format))
        return 0
    prof, thr = result["profile"], result["throughput"]
    print(f"alloc.profile on a {prof['file_gb']:.2f} GB train.bin: {prof['wall_s']:.1f} s wall "
          f"(profiling {prof['profile_s']:.1f} s), peak RSS {prof['peak_rss_gb']:.2f} GB, "
          f"{prof['sampled_tokens']:,} tokens sampled; kernel {prof['kernel']}, d_in "
          f"{prof['input_dim']}")
    print(render_table(["data", "tokens/s (median)", "batch build us"],
                       [[r["data"], f"{r['tokens_per_s']:,.0f}", f"{r['batch_us']:.0f}"]
                        for r in thr["rows"]], right=[False, True, True]))
    print(f"bin / in-memory throughput: {thr['ratio']:.3f} ({thr['rounds']} interleaved rounds "
          f"of {thr['steps']} steps, d_model {thr['d_model']}, window {thr['length']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
