"""python -m alloc.profile --data PATH [--out profile.yaml] [--no-pilot]

Measure, from a bounded sample of your data, what the allocator takes as inputs, from the data's
statistics alone (docs/theory.md §9; ``alloc.profiling.datastats``): the memory kernel rho(s) for
offsets s = 1..N, its best parametric fit (ngram:K, exp:LAMBDA, poly:P) with its goodness of fit,
the input dimension d_in and the teacher spectrum with its rank at 90% energy. Tokens:
bias-corrected mutual information and the offset-1 PMI matrix; vector sequences (.npy): a ridge
regression on the lagged inputs. ``--out`` writes the profile as YAML, with the kernel and the
spectrum as files beside it that ``alloc.solve --kernel file:`` and ``--spectrum file:`` accept;
``alloc.solve --profile profile.yaml`` takes all of it at once. This module imports no torch:
token data gets a pilot training by default (the allocator's inputs as a model sees them, and
later layers' measurements), which this command hands, with the same flags, to
``python -m workers.profile`` in a child process; ``--no-pilot`` and vector data are measured
here. A trained model's profile (``--checkpoint``) is ``workers.profile``'s alone.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from alloc.profiling.datastats import data_statistics
from alloc.profiling.flags import (
    PILOT_FLAGS,
    add_output_args,
    add_profile_args,
    check_outputs,
    flags_given,
    required_data,
    show_profile,
)
from common.cli import Parser, fail, flag_names
from common.errors import TransformerAllocError, UsageError
from userdata import DataSpec, data_flags

PROG = "alloc.profile"
TORCH_SIDE = "python -m workers.profile"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    add_profile_args(p, torch_side=False)
    p.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)  # refused: torch side
    add_output_args(p, progress="the pilot's, run by workers.profile")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_outputs(args)
        spec = statistics_data(args)
        if needs_pilot(args, spec):
            return run_torch_side(argv, args.quiet)
        profile = data_statistics(spec, args.seq_len, args.sample_tokens, args.seed)
    except TransformerAllocError as err:
        return fail(PROG, err.text(flag_names(parser, **data_flags(parser))))
    show_profile(PROG, profile, args)
    return 0


def statistics_data(args: argparse.Namespace) -> DataSpec:
    """The data to measure, once ``--checkpoint`` (a trained model: torch) is refused by name.

    Raises:
        UsageError: ``--checkpoint``, in one line pointing to ``workers.profile``.
        DataError: the data cannot be read.
    """
    if args.checkpoint is not None:
        raise UsageError(f"--checkpoint: profiling a trained model runs it with torch: "
                         f"{TORCH_SIDE} --checkpoint {args.checkpoint} (with the task's flags)")
    return required_data(args)


def needs_pilot(args: argparse.Namespace, spec: DataSpec) -> bool:
    """Token data without ``--no-pilot``, or a pilot's flag: the pilot trains a model."""
    return bool(flags_given(args, PILOT_FLAGS)) or (
        not args.no_pilot and spec.resolved().format != "npy")


def run_torch_side(argv: list[str], quiet: bool) -> int:
    """``python -m workers.profile`` with the same flags, in a child process: the pilot trains
    a model with torch, which this package does not import (its commands stay fast and its
    modules torch-free; docs/architecture.md). The child's output is the command's, and so is
    its exit code; Ctrl-C reaches both processes, and the child's interrupted exit is returned."""
    command = [sys.executable, "-m", "workers.profile", *argv]
    if not quiet:
        print(f"{PROG}: the pilot trains a model with torch: running {TORCH_SIDE} (same flags)",
              file=sys.stderr, flush=True)
    with subprocess.Popen(command) as child:
        try:
            return child.wait()
        except KeyboardInterrupt:  # the child got the same SIGINT and stops on its own
            return child.wait()


if __name__ == "__main__":
    sys.exit(main())
