"""The command line the two profile commands share: ``python -m workers.profile`` (the data's
statistics and the pilot, or a trained model's compression plan: torch) and ``python -m
alloc.profile`` (the data's statistics alone: no torch). One builder of their common flags, so a
profile is asked for the same way in both; ``alloc.profile`` keeps the pilot's flags hidden, to
refuse them by name.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from alloc.profiling.datastats import TOKEN_SAMPLE, TOKEN_SEQ_LEN, VECTOR_SAMPLE, Profile
from alloc.profiling.files import plot, render, to_dict, write_profile
from alloc.profiling.pilot import MAX_PILOT_STEPS, MAX_PILOT_WIDTH, PilotRequest
from arch import MAX_DEPTH
from common.cli import add_format, check_writable, dump, int_in, number, wrote
from common.errors import UsageError
from userdata import DATA_HELP, DataSpec, add_data_args, data_spec

# The pilot's shape and length: token data, on the torch side only (``workers.profile``).
PILOT_FLAGS = ("--pilot-steps", "--budget", "--layers", "--mlp-ratio")


def add_profile_args(p: argparse.ArgumentParser, torch_side: bool) -> None:
    """The data flags, the sample's, and the pilot's (``torch_side``: the command runs the
    pilot itself, and profiles checkpoints)."""
    with_checkpoint = " (with --checkpoint: the sample the model is measured on)"
    add_data_args(p, data_help=DATA_HELP + (with_checkpoint if torch_side else ""))
    p.add_argument("--seq-len", type=int_in(1),
                   help=f"offsets measured (default: {TOKEN_SEQ_LEN} for tokens, the sequences' "
                        "length for npy)")
    p.add_argument("--sample-tokens", type=int_in(1000),
                   help=f"tokens (or vector positions) sampled (default: {TOKEN_SAMPLE:,} "
                        f"tokens, {VECTOR_SAMPLE:,} vector positions"
                        + ("; with --checkpoint, 32,768 tokens in windows of the model's "
                           "length)" if torch_side else ")"))
    p.add_argument("--seed", type=int_in(0), default=0,
                   help="where the sample is drawn" + (" (and the pilot's seed)" if torch_side
                                                       else ""))
    _add_pilot_args(p, torch_side)


def _add_pilot_args(p: argparse.ArgumentParser, torch_side: bool) -> None:
    d = PilotRequest
    pilot = p.add_argument_group("pilot (token data; docs/theory.md §9.2)")
    pilot.add_argument("--pilot-steps", type=int_in(1, MAX_PILOT_STEPS),
                       help=f"train the uniform baseline this many steps and measure the "
                            f"allocator's inputs as it sees them (default: {d.steps} for "
                            f"token data)" + ("" if torch_side else
                                              "; run by python -m workers.profile"))
    pilot.add_argument("--no-pilot", action="store_true",
                       help="only the data statistics (mutual information, PMI rank)" + (
                           "" if torch_side else ", measured here without torch"))
    pilot.add_argument("--budget", type=int_in(1, MAX_PILOT_WIDTH),
                       help=f"the pilot's width D (use your search's; default {d.budget})")
    pilot.add_argument("--layers", type=int_in(1, MAX_DEPTH),
                       help=f"the pilot's depth (use your search's; default {d.layers})")
    pilot.add_argument("--mlp-ratio", type=number(0),
                       help=f"the pilot's MLP ratio (default {d.mlp_ratio:g})")


def add_output_args(p: argparse.ArgumentParser, progress: str | None) -> None:
    """``--out``, ``--plot``, ``--quiet`` (``progress``: what it silences; None: nothing, the
    flag hidden) and ``--format``."""
    p.add_argument("--out", type=Path, help="write the profile YAML (and its kernel and "
                                            "spectrum files beside it)")
    p.add_argument("--plot", type=Path, help="write the kernel and spectrum plot (PNG)")
    p.add_argument("--quiet", action="store_true",
                   help=argparse.SUPPRESS if progress is None else
                   f"no progress on stderr ({progress}: a bar on a terminal, else a line per "
                   "milestone); errors, warnings and the result still print")
    add_format(p)


def flags_given(args: argparse.Namespace, flags: tuple[str, ...]) -> list[str]:
    """Those of ``flags`` the command line set (to a value other than their default)."""
    return [flag for flag in flags
            if getattr(args, flag[2:].replace("-", "_")) not in (None, False, [])]


def check_outputs(args: argparse.Namespace) -> None:
    """``--out`` and ``--plot`` can be written (``UsageError`` before any work)."""
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None:
            check_writable(flag, path)


def required_data(args: argparse.Namespace, alternative: str = "") -> DataSpec:
    """The data ``--data`` names; ``UsageError`` without it (``alternative``: the other flag
    that would do)."""
    spec = data_spec(args)
    if spec is None:
        raise UsageError(f"--data{' or ' + alternative if alternative else ''}: "
                         f"{'one is ' if alternative else ''}required")
    return spec


def show_profile(prog: str, profile: Profile, args: argparse.Namespace) -> None:
    """Write the profile (``--out``) and its plot (``--plot``), say so, and print it."""
    data, written = write_profile(profile, args.out) if args.out else (to_dict(profile), [])
    if args.plot is not None:
        plot(profile, args.plot)
        written.append(args.plot)
    wrote(prog, *written)
    print(render(data, prog) if args.format == "table" else dump(data, args.format))
