"""python -m bench.omp_wait [--steps 40] [--smoke-test]

What OpenMP's wait policy costs torch's training steps (``workers`` sets
``OMP_WAIT_POLICY=PASSIVE`` unless the user set one, before torch loads): tokens/s of a block
stack's forward, backward and AdamW step (``bench.throughput``'s runner) at a pilot's size
(D = 64, 2 layers, windows of 32) and at the throughput bench's (D = 512, 4 layers, windows of
256), each in a fresh process under ``ACTIVE`` and ``PASSIVE``, with this machine's cores free
and with as many busy processes beside it as it has cores (what a search's trials or a second
command do to a pilot). The policy is read when torch loads, so every measurement is its own
process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from common.cli import Parser, add_format, dump, int_in, render_table

SHAPES = {"pilot": "Shape(d_model=64, heads=2, layers=2, seq_len=32, batch=16, mlp_ratio=2.0)",
          "throughput": "Shape()"}
CHILD = """
import json, sys
from bench.throughput import Runner, Shape, our_stack
shape = {shape}
runner = Runner("mhsa", our_stack(shape, "mhsa", causal=True), shape, "cpu")
runner.timed(3)  # warm-up: allocator, kernels, optimizer state
runner.rates.clear()
runner.timed({steps})
print(json.dumps(runner.rates[-1]))
"""


def rate(shape: str, policy: str, steps: int) -> float:
    """Tokens/s of ``steps`` steps of ``shape`` in a fresh process under ``policy``."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    out = subprocess.run([sys.executable, "-c", CHILD.format(shape=SHAPES[shape], steps=steps)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out))


@contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes spinning in pure Python (no OpenMP) while the context lasts."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(count)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def run(steps: int, shapes: list[str], busy: int) -> list[dict[str, Any]]:
    """Both policies on each shape, with the cores free and with ``busy`` spinning processes."""
    rows = []
    for load in ("cores free", f"{busy} busy process{'es' if busy > 1 else ''} beside it"):
        with busy_cores(busy if load != "cores free" else 0):
            for shape in shapes:
                rates = {policy: rate(shape, policy, steps) for policy in ("ACTIVE", "PASSIVE")}
                rows.append({"machine": load, "shape": shape, "active": rates["ACTIVE"],
                             "passive": rates["PASSIVE"],
                             "passive_over_active": rates["PASSIVE"] / rates["ACTIVE"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.omp_wait", description=__doc__.split("\n\n")[1])
    p.add_argument("--steps", type=int_in(1, 10_000), default=40, help="timed steps per run")
    p.add_argument("--smoke-test", action="store_true",
                   help="the pilot's shape, 2 steps, one busy process")
    add_format(p)
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    rows = run(2, ["pilot"], 1) if args.smoke_test else run(args.steps, list(SHAPES), cores)
    if args.format != "table":
        print(dump(rows, args.format))
        return 0
    print(render_table(["machine", "shape", "ACTIVE tokens/s", "PASSIVE tokens/s",
                        "PASSIVE / ACTIVE"],
                       [[r["machine"], r["shape"], f"{r['active']:,.0f}", f"{r['passive']:,.0f}",
                         f"{r['passive_over_active']:.2f}"] for r in rows],
                       right=[False, False, True, True, True]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
