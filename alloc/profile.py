"""python -m alloc.profile --data PATH --no-pilot [--out profile.yaml]

Measure, from a bounded sample of your data, what the allocator takes as inputs, from the data's
statistics alone (docs/theory.md §9; ``alloc.datastats``): the memory kernel rho(s) for offsets
s = 1..N, its best parametric fit (ngram:K, exp:LAMBDA, poly:P) with its goodness of fit, the
input dimension d_in and the teacher spectrum with its rank at 90% energy. Tokens: bias-corrected
mutual information and the offset-1 PMI matrix; vector sequences (.npy): a ridge regression on
the lagged inputs. ``--out`` writes the profile as YAML, with the kernel and the spectrum as
files beside it that ``alloc.solve --kernel file:`` and ``--spectrum file:`` accept;
``alloc.solve --profile profile.yaml`` takes all of it at once. This command imports no torch:
token data is profiled here with ``--no-pilot``, vector data always; the pilot training token
data gets by default, and the profile of a trained model (``--checkpoint``), run a model:
``python -m workers.profile``, with the same flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alloc.datastats import data_statistics
from alloc.profilecli import (
    PILOT_FLAGS,
    add_output_args,
    add_profile_args,
    check_outputs,
    flags_given,
    required_data,
    show_profile,
)
from common.cli import Parser, fail
from common.errors import TransformerAllocError, UsageError
from userdata import DataSpec

PROG = "alloc.profile"
TORCH_SIDE = "python -m workers.profile"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    add_profile_args(p, torch_side=False)
    p.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)  # refused: torch side
    add_output_args(p, progress=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_outputs(args)
        spec = statistics_data(args)
        profile = data_statistics(spec, args.seq_len, args.sample_tokens, args.seed)
    except TransformerAllocError as err:
        return fail(PROG, str(err))
    show_profile(PROG, profile, args)
    return 0


def statistics_data(args: argparse.Namespace) -> DataSpec:
    """The data to measure, once every flag that asks for a model (torch) is refused by name,
    and token data without ``--no-pilot`` (it gets a pilot by default there).

    Raises:
        UsageError: one line naming the flag and pointing to ``workers.profile``.
        DataError: ``--data`` cannot be read.
    """
    if args.checkpoint is not None:
        raise UsageError(f"--checkpoint: profiling a trained model runs it with torch: "
                         f"{TORCH_SIDE} --checkpoint {args.checkpoint} (same flags)")
    given = flags_given(args, PILOT_FLAGS)
    if given:
        raise UsageError(f"{given[0]}: the pilot trains a model with torch: {TORCH_SIDE} (same "
                         f"flags); {PROG} measures the data's statistics alone")
    spec = required_data(args)
    if not args.no_pilot and spec.resolved().format != "npy":
        raise UsageError(f"--data {args.data}: token data gets a pilot training by default, "
                         f"which runs a model with torch: {TORCH_SIDE} --data {args.data}; or "
                         f"pass --no-pilot for the data's statistics alone")
    return spec


if __name__ == "__main__":
    sys.exit(main())
