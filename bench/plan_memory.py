"""python -m bench.plan_memory [--sizes 8192 32768 131072] [--seq-len N] [--format json]

What planning a latent KV cache of a pretrained model costs as its sample grows: ``python -m
workers.profile --checkpoint <SmolLM2-135M bf16 folder> --data <its tokens/docs> --latent
--kv-cache 0.25`` (the curvature estimate: one forward and one backward pass of the sample
through the model streamed a layer at a time) at each ``--sample-tokens`` of ``--sizes``, each
in a process of its own while the parent samples its memory every 20 ms (``VmHWM``: the peak
resident set, what ``/usr/bin/time -v`` calls Maximum resident set size; ``RssAnon``: its own
tensors, not the page cache of the memory-mapped file). Reports per size the windows, wall
seconds, both peaks and the machine's load average when it started and ended. The model and
text are ``bench.fixtures``' (fetched once).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.checkpoint_memory import measured
from bench.fixtures import ensure
from common.cli import Parser, add_format, dump, int_in, render_table

SIZES = (8192, 32768, 131072)


def profile_argv(model: Path, tokens: Path, sample_tokens: int, out: Path,
                 seq_len: int | None) -> list[str]:
    """The profile command measured, as ``python`` arguments."""
    return ["-m", "workers.profile", "--checkpoint", str(model), "--data", str(tokens),
            "--latent", "--kv-cache", "0.25", "--sample-tokens", str(sample_tokens),
            *(["--seq-len", str(seq_len)] if seq_len else []), "--out", str(out), "--quiet"]


def run(sizes: list[int], seq_len: int | None, cache: Path | None = None) -> list[dict[str, Any]]:
    """One row per sample size: its windows, seconds, peaks and load."""
    fixture = ensure(cache)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            load = os.getloadavg()[0]
            argv = profile_argv(fixture.bf16, fixture.tokens("docs"), size,
                                Path(tmp) / f"plan{size}.yaml", seq_len)
            got = measured(argv)
            window = seq_len or 8192  # SmolLM2-135M's max_position_embeddings
            rows.append({"sample_tokens": size, "windows": max(1, size // window),
                         "seq_len": window, "seconds": got["seconds"],
                         "peak_rss_bytes": got["peak_hwm"], "peak_anon_bytes": got["peak_anon"],
                         "load_start": load, "load_end": os.getloadavg()[0]})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    return render_table(
        ["sample tokens", "windows", "wall", "peak RSS", "peak RssAnon", "load (start/end)"],
        [[f"{r['sample_tokens']:,}", f"{r['windows']} x {r['seq_len']:,}",
          f"{r['seconds']:.0f} s", f"{r['peak_rss_bytes'] / 1e9:.2f} GB",
          f"{r['peak_anon_bytes'] / 1e9:.2f} GB",
          f"{r['load_start']:.1f} / {r['load_end']:.1f}"] for r in rows],
        right=[True, True, True, True, True, True])


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.plan_memory", description=__doc__.split("\n\n")[1])
    p.add_argument("--sizes", type=int_in(1), nargs="+", default=list(SIZES),
                   help="--sample-tokens of each run (default: 8192 32768 131072)")
    p.add_argument("--seq-len", type=int_in(1), default=None,
                   help="the sample's window (default: the model's, 8,192)")
    p.add_argument("--cache", type=Path, default=None, help="bench.fixtures' cache")
    add_format(p)
    args = p.parse_args(argv)
    rows = run(args.sizes, args.seq_len, args.cache)
    print(render(rows) if args.format == "table" else dump(rows, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
