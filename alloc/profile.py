"""python -m alloc.profile --data PATH [--out profile.yaml] | --checkpoint PATH --task lm

Measure, from a bounded sample of your data, what the allocator takes as inputs
(docs/theory.md §9): the memory kernel rho(s) for offsets s = 1..N, the best-fitting parametric
kernel (ngram:K, exp:LAMBDA, poly:P) with its goodness of fit, the input dimension d_in and the
teacher spectrum with its rank at 90% energy. Tokens (a text corpus or nanoGPT .bin files):
bias-corrected mutual information between x_t and x_{t-s} over the most frequent symbols, and
the singular values of the offset-1 PMI matrix. Vector sequences (.npy): a ridge regression of
the target on the lagged inputs, the per-lag share of its coefficients, and the covariance's
participation ratio. ``--out`` writes the profile as YAML, with the per-offset kernel and the
spectrum as one-value-per-line files beside it that ``alloc.solve --kernel file:`` and
``--spectrum file:`` accept; ``alloc.solve --profile profile.yaml`` takes all of it at once.
With ``--checkpoint`` it profiles a trained model instead (docs/theory.md §10): per head the
spectrum of its query-key map and, on a sample of ``--data`` or of ``--task`` (the trainer's
task flags), its logit bound and attention entropy, and the per-layer plan of reduced ``qk_dim``
(``alloc.compression``) that ``python -m workers.compress`` builds. The model runs on the torch
side (``workers.measure``), reached through its entry point: this module imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

from alloc.compression import (
    RULES,
    MeasureRequest,
    load_measurer,
    plan_compression,
    plan_for_kv_cache,
    plot_plan,
    render_plan,
)
from alloc.datastats import VECTOR_SAMPLE, Profile, data_statistics
from alloc.pilot import (
    MAX_PILOT_MLP_RATIO,
    MAX_PILOT_STEPS,
    MAX_PILOT_WIDTH,
    PilotRequest,
    load_pilot,
)
from alloc.profilefile import plot, render, to_dict, write_profile
from arch.config import MAX_DEPTH
from common.cli import (
    Parser,
    add_format,
    check_writable,
    dump,
    fail,
    int_in,
    number,
    parse_task_params,
    wrote,
)
from common.errors import TransformerAllocError, UsageError
from common.files import write_atomic
from common.progress import say
from userdata import DataSpec, add_data_args, data_spec
from userdata.cli import DATA_HELP

DEFAULT_TOLERANCE = 0.05  # --checkpoint: the allowed error per head group
PROG = "alloc.profile"


# --- profiling ----------------------------------------------------------------------------------


def profile_data(spec: DataSpec, seq_len: int | None = None, sample: int | None = None,
                 seed: int = 0, pilot: PilotRequest | None = None,
                 on_pilot: Callable[[PilotRequest], None] | None = None) -> Profile:
    """Measure the allocator's inputs on ``spec`` (see the module docstring); with ``pilot``
    (token data only) also train and measure the pilot (``alloc.pilot``), in windows of the
    profile's ``seq_len``, calling ``on_pilot`` once the data's statistics are measured.

    Raises:
        DataError: the data cannot be used; PilotError: the pilot cannot run.
    """
    start = time.perf_counter()
    profile = data_statistics(spec, seq_len, sample, seed)
    if pilot is not None and profile.format != "npy":
        request = dataclasses.replace(pilot, data=spec.resolved(), seq_len=profile.seq_len,
                                      seed=seed)
        run = load_pilot()
        if on_pilot is not None:
            on_pilot(request)
        profile = dataclasses.replace(profile, pilot=run(request))
    return dataclasses.replace(profile, wall_s=time.perf_counter() - start)


# --- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    add_data_args(p, data_help=f"{DATA_HELP} (with --checkpoint: the sample the model is "
                                "measured on)")
    p.add_argument("--checkpoint", type=Path,
                   help="profile a trained model instead (a workers.train .pt, or a GPT-2 "
                        "layout folder: config.json + model.safetensors; docs/theory.md §10)")
    p.add_argument("--task", help="--checkpoint: measure on a sample of this generated task "
                                  "(as workers.train --task), in windows of the model's length")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="--checkpoint: override a task parameter (repeatable)")
    p.add_argument("--smoke-test", action="store_true", help="--checkpoint: --task at its "
                                                             "smoke size")
    p.add_argument("--tolerance", type=number(0, strict=True),
                   help=f"--checkpoint: allowed error per head group under --rule (default "
                        f"{DEFAULT_TOLERANCE}; with --rule loss, nats per token)")
    p.add_argument("--align", type=int_in(1), default=8,
                   help="--checkpoint: reduced qk_dim are multiples of this")
    p.add_argument("--rule", choices=RULES,
                   help="--checkpoint: what decides each reduced qk_dim: the saturation rule's "
                        "bound (docs/theory.md §4), the attention error measured on the sample, "
                        "or the sample's loss increase with each head group alone cut (loss: "
                        "one forward per group and candidate; token models) (default: measured "
                        "with a sample, else bound)")
    p.add_argument("--kv-cache", type=number(0, strict=True), metavar="FRACTION",
                   help="--checkpoint: instead of --tolerance, the student's KV cache per token "
                        "as a fraction of the teacher's (e.g. 0.75), spent where the rule's "
                        "error is largest (docs/theory.md §10.3)")
    p.add_argument("--logit-bound", type=number(0, strict=True),
                   help="--checkpoint without --data: assume |logits| <= R (default: none, "
                        "||J|| <= 1/2)")
    p.add_argument("--seq-len", type=int_in(1), help="offsets measured (default: 256 for "
                                                     "tokens, the sequences' length for npy)")
    p.add_argument("--sample-tokens", type=int_in(1000),
                   help=f"tokens (or vector positions) sampled (default: 1,000,000 tokens, "
                        f"{VECTOR_SAMPLE:,} vector positions; with --checkpoint, 32,768 tokens "
                        "in windows of the model's length)")
    p.add_argument("--seed", type=int_in(0), default=0,
                   help="where the sample is drawn (and the pilot's seed)")
    pilot = p.add_argument_group("pilot (token data; docs/theory.md §9.2)")
    pilot.add_argument("--pilot-steps", type=int_in(1, MAX_PILOT_STEPS),
                       help=f"train the uniform baseline this many steps and measure the "
                            f"allocator's inputs as it sees them (default: "
                            f"{PilotRequest.steps} for token data)")
    pilot.add_argument("--no-pilot", action="store_true",
                       help="only the data statistics (mutual information, PMI rank)")
    pilot.add_argument("--budget", type=int_in(1, MAX_PILOT_WIDTH),
                       help=f"the pilot's width D (use your search's; default "
                            f"{PilotRequest.budget})")
    pilot.add_argument("--layers", type=int_in(1, MAX_DEPTH),
                       help=f"the pilot's depth (use your search's; default "
                            f"{PilotRequest.layers})")
    pilot.add_argument("--mlp-ratio", type=number(0),
                       help=f"the pilot's MLP ratio (default {PilotRequest.mlp_ratio:g})")
    p.add_argument("--out", type=Path, help="write the profile YAML (and its kernel and "
                                            "spectrum files beside it)")
    p.add_argument("--plot", type=Path, help="write the kernel and spectrum plot (PNG)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (the pilot's or the checkpoint's measurement: a "
                        "bar on a terminal, else a line per milestone); errors, warnings and "
                        "the result still print")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for flag, path in (("--out", args.out), ("--plot", args.plot)):
            if path is not None:
                check_writable(flag, path)
        if args.checkpoint is not None:
            return _main_checkpoint(args)
        _check_data_flags(args)
        spec = data_spec(args)
        assert spec is not None  # _check_data_flags
        profile = profile_data(spec, args.seq_len, args.sample_tokens, args.seed,
                               pilot_request(args, spec), announce)
    except TransformerAllocError as err:
        return fail(PROG, str(err))
    data, written = write_profile(profile, args.out) if args.out else (to_dict(profile), [])
    if args.plot is not None:
        plot(profile, args.plot)
        written.append(args.plot)
    wrote(PROG, *written)
    print(render(data, PROG) if args.format == "table" else dump(data, args.format))
    return 0


def announce(pilot: PilotRequest) -> None:
    """The pilot takes seconds to minutes: say what is running (stderr; its own progress
    follows), unless ``--quiet``."""
    say(f"{PROG}: pilot: training the baseline at D = {pilot.budget}, {pilot.layers} "
        f"layer(s), {pilot.steps} steps (--no-pilot skips it)", quiet=pilot.quiet)


def pilot_request(args: argparse.Namespace, spec: DataSpec) -> PilotRequest | None:
    """The pilot the flags ask for: on by default for token data, refused for vectors."""
    if args.no_pilot:
        if args.pilot_steps is not None:
            raise UsageError("--pilot-steps and --no-pilot: give one")
        return None
    if spec.resolved().format == "npy":
        if args.pilot_steps is not None:
            raise UsageError(f"--pilot-steps {args.pilot_steps}: the pilot trains a language "
                             "model on token data; vector sequences (.npy) are profiled by "
                             "regression")
        return None
    d = PilotRequest
    mlp_ratio = d.mlp_ratio if args.mlp_ratio is None else args.mlp_ratio
    if mlp_ratio > MAX_PILOT_MLP_RATIO:
        raise UsageError(f"--mlp-ratio {mlp_ratio:g}: must be <= {MAX_PILOT_MLP_RATIO} for "
                         "the pilot")
    return PilotRequest(spec, budget=args.budget or d.budget, layers=args.layers or d.layers,
                        mlp_ratio=mlp_ratio, steps=args.pilot_steps or d.steps,
                        quiet=args.quiet)


PILOT_FLAGS = ("--pilot-steps", "--no-pilot", "--budget", "--layers", "--mlp-ratio")


def _pilot_flags_given(args: argparse.Namespace) -> list[str]:
    values = (args.pilot_steps, args.no_pilot or None, args.budget, args.layers, args.mlp_ratio)
    return [flag for flag, value in zip(PILOT_FLAGS, values) if value is not None]


def _check_data_flags(args: argparse.Namespace) -> None:
    checkpoint_only = [flag for flag, given in (("--task", args.task),
                                                ("--task-param", args.task_param),
                                                ("--smoke-test", args.smoke_test),
                                                ("--rule", args.rule),
                                                ("--tolerance", args.tolerance is not None),
                                                ("--kv-cache", args.kv_cache)) if given]
    if checkpoint_only:
        raise UsageError(f"{checkpoint_only[0]}: only with --checkpoint (a data profile "
                         "measures --data)")
    if args.data is None:
        raise UsageError("--data or --checkpoint: one is required")


def _main_checkpoint(args: argparse.Namespace) -> int:
    """``--checkpoint``: measure the model (torch side), plan, write and show the plan."""
    if args.data is not None and args.task is not None:
        raise UsageError("--data and --task: give one sample source")
    if args.rule in ("measured", "loss") and args.data is None and args.task is None:
        raise UsageError(f"--rule {args.rule}: measures on a sample; give --data or --task")
    if args.kv_cache is not None and args.tolerance is not None:
        raise UsageError(f"--kv-cache {args.kv_cache:g} and --tolerance {args.tolerance:g}: the "
                         "plan meets one of them; give one")
    given = _pilot_flags_given(args)
    if given:
        raise UsageError(f"{given[0]}: the pilot profiles data (--data without --checkpoint); "
                         "a --checkpoint profile measures the trained model itself")
    request = MeasureRequest(args.checkpoint, args.align, data=data_spec(args), task=args.task,
                             task_params=parse_task_params(args.task_param),
                             smoke_test=args.smoke_test, seq_len=args.seq_len,
                             sample_tokens=args.sample_tokens, seed=args.seed,
                             loss_sensitivity=args.rule == "loss", quiet=args.quiet)
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    plan = plan_compression(load_measurer()(request), tolerance, args.rule, args.logit_bound)
    if args.kv_cache is not None:
        plan = plan_for_kv_cache(plan, args.kv_cache)
    if not plan.measured and not plan.reduces:
        print(f"{PROG}: no reduction can be planned without data: the bound alone allows none "
              "at these norms; give --task or --data to measure the logits (or --logit-bound "
              "R to assume them)", file=sys.stderr)
    if args.out is not None:
        write_atomic(args.out, plan.to_yaml())
        wrote(PROG, args.out)
    if args.plot is not None:
        plot_plan(plan, args.plot)
        wrote(PROG, args.plot)
    print(render_plan(plan) if args.format == "table" else dump(plan.to_dict(), args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
