"""python -m workers.profile --data PATH [--out profile.yaml] | --checkpoint PATH --task lm

Profile your data or your trained model, running a model with torch. ``--data``: the allocator's
inputs measured from a bounded sample (docs/theory.md §9, as ``python -m alloc.profile`` measures
them) and, for token data, by default a short pilot training of the uniform baseline at your
width that measures them as a model sees them (§9.2, ``workers.pilot``; ``--no-pilot``: the
statistics alone); ``--out`` writes the profile ``alloc.solve --profile`` reads. ``--checkpoint``:
a trained model's compression plan (§10): per head the spectrum of its query-key map and, on a
sample of ``--data`` or of ``--task`` (the trainer's task flags), its logit bound and attention
entropy (``workers.compression.measure``), and the per-layer plan of reduced ``qk_dim``
(``alloc.compression``) that ``python -m workers.compress`` builds. Torch is imported once the
flags are read.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc import (
    MAX_PILOT_MLP_RATIO,
    PILOT_FLAGS,
    PilotRequest,
    Profile,
    add_output_args,
    add_profile_args,
    check_outputs,
    data_statistics,
    flags_given,
    required_data,
    show_profile,
)
from alloc.compression import (
    RULES,
    CompressionError,
    CompressionPlan,
    MeasureRequest,
    Rule,
    check_kv_cache,
    form_of,
    plan_compression,
    plan_for_kv_cache,
    plot_plan,
    render_plan,
    student_form,
)
from arch import kinds_text
from common.cli import Parser, dump, fail, flag_names, int_in, number, wrote
from common.errors import Problem, TransformerAllocError, UsageError
from common.files import write_atomic
from common.progress import say
from userdata import DataSpec
from workers.taskargs import TASK_FLAGS, task_spec

PROG = "workers.profile"
DEFAULT_TOLERANCE = 0.05  # --checkpoint: the allowed error per head group
# only with --checkpoint (--align, --logit-bound: defaults)
CHECKPOINT_FLAGS = ("--task", "--task-param", "--smoke-test", "--rule", "--tolerance",
                    "--kv-cache", "--latent", "--estimate", "--rope-dim")
ESTIMATES = ("curvature", "forwards")  # how a latent plan's loss increases are found


# --- data: the statistics and the pilot -------------------------------------------------------


def profile_data(spec: DataSpec, seq_len: int | None = None, sample: int | None = None,
                 seed: int = 0, pilot: PilotRequest | None = None,
                 on_pilot: Callable[[PilotRequest], None] | None = None) -> Profile:
    """The data's statistics (``alloc.profiling.datastats.data_statistics``) and, with ``pilot``
    (token data only), the pilot trained and measured (``workers.pilot``) in windows of the
    profile's ``seq_len``, calling ``on_pilot`` once the statistics are measured.

    Raises:
        DataError: the data cannot be used; PilotError: the pilot cannot run.
    """
    start = time.perf_counter()
    profile = data_statistics(spec, seq_len, sample, seed)
    if pilot is not None and profile.format != "npy":
        from workers.pilot import run_pilot  # torch: once the statistics are measured

        request = dataclasses.replace(pilot, data=spec.resolved(), seq_len=profile.seq_len,
                                      seed=seed)
        if on_pilot is not None:
            on_pilot(request)
        profile = dataclasses.replace(profile, pilot=run_pilot(request))
    return dataclasses.replace(profile, wall_s=time.perf_counter() - start)


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


def announce(pilot: PilotRequest) -> None:
    """The pilot takes seconds to minutes: say what is running (stderr; its own progress
    follows), unless ``--quiet``: with later layers, two trainings of as many steps, the
    baseline's and the pattern pilot's (``workers.pilot``: narrower heads in the later layers,
    a model of its own)."""
    second = (", then the pattern pilot (narrow heads in the later layers) for as many, "
              "which takes longer" if pilot.layers > 1 else "")
    say(f"{PROG}: pilot: training the baseline at D = {pilot.budget}, {pilot.layers} "
        f"layer(s), {pilot.steps} steps{second} (--no-pilot skips "
        f"{'both' if second else 'it'})", quiet=pilot.quiet)


# --- a checkpoint: its compression plan ----------------------------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    """What ``--checkpoint`` asks for: the model measured (``measure``), then planned within
    ``tolerance`` under ``rule`` (default: measured with a sample, else bound), or to a KV cache
    of ``kv_cache`` of the teacher's; ``logit_bound``: the logits assumed without a sample."""

    measure: MeasureRequest
    tolerance: float = DEFAULT_TOLERANCE
    rule: Rule | None = None
    logit_bound: float | None = None
    kv_cache: float | None = None


@dataclass(frozen=True)
class PlannedCheckpoint:
    """A checkpoint's plan and, for a latent plan fitted to second order, its latent maps at
    the planned widths (layer -> ``(up, down)``; written beside the plan,
    ``workers.compress`` reads them)."""

    plan: CompressionPlan
    fits: Mapping[int, tuple[Any, Any]] = dataclasses.field(default_factory=dict)


def plan_checkpoint(request: PlanRequest) -> PlannedCheckpoint:
    """Measure the checkpoint (``workers.compression.measure``) and plan its compression.

    Raises:
        CheckpointError, TaskError, DataError, CompressionError: one line each.
    """
    from workers.checkpoints import read_arch  # torch: once the flags are read
    from workers.compression import measure_for_plan

    form = student_form(request.measure.form)
    if form.latent or request.kv_cache is not None:  # from the sizes alone: before measuring
        teacher = read_arch(request.measure.checkpoint)
        if form.latent and not any(layer.kind.to_latent for layer in teacher.layers):
            raise CompressionError.of([Problem("latent", "", "the model has no "
                                               f"{kinds_text(lambda t: t.to_latent)} layer to "
                                               "make latent")])
        if form.rope_part:
            check_rope_dim(teacher, request.measure.rope_dim)
        if request.kv_cache is not None:
            check_kv_cache(teacher, request.measure.align, request.kv_cache,
                           values=request.rule == "loss", form=form,
                           rope_dim=request.measure.rope_dim)
    measured, fits = measure_for_plan(request.measure)
    plan = plan_compression(measured, request.tolerance, request.rule, request.logit_bound)
    if request.kv_cache is not None:
        plan = plan_for_kv_cache(plan, request.kv_cache)
    widths = {layer.index: layer.latent_dim for layer in plan.layers if layer.latent_dim}
    return PlannedCheckpoint(plan, {i: (up[:, :widths[i]], down[:widths[i]])
                                    for i, (up, down) in fits.items() if i in widths})


def check_rope_dim(teacher: Any, rope_dim: int) -> None:
    """Refuse a decoupled RoPE part the model's heads cannot hold (a problem of ``rope_dim``)."""
    if teacher.positional != "rope":
        raise UsageError.of([Problem("rope_dim", rope_dim, "the model has no RoPE to keep "
                                     f"(positional {teacher.positional!r})")])
    widest = min(g.qk_dim for layer in teacher.layers for g in layer.heads)
    if rope_dim % 2 or rope_dim > widest:
        raise UsageError.of([Problem("rope_dim", rope_dim, "must be even and at most the "
                                     f"smallest head's qk_dim ({widest})")])


def checkpoint_request(args: argparse.Namespace) -> PlanRequest:
    """The checkpoint profile the flags ask for (``UsageError`` for flags that cannot work)."""
    if args.data is not None and args.task is not None:
        raise UsageError("--data and --task: give one sample source")
    form = form_of(args.latent, args.rope_dim or 0)
    rule = args.rule or (form.rules[0] if form.latent else None)
    if rule is not None and rule not in form.rules:
        raise UsageError(f"--latent: its widths are chosen by the loss rule; use --rule loss "
                         f"or leave --rule out (got --rule {rule})")
    if rule in ("measured", "loss") and args.data is None and args.task is None:
        raise UsageError(f"--rule {rule}: measures on a sample; give --data or --task")
    for flag, value in (("--estimate", args.estimate), ("--rope-dim", args.rope_dim)):
        if value is not None and not args.latent:
            raise UsageError(f"{flag} {value}: only with --latent (a latent student's plan)")
    if args.estimate is not None and args.estimate not in form.estimates:
        raise UsageError(f"--rope-dim {args.rope_dim}: a decoupled RoPE part is planned with "
                         f"--estimate {' or '.join(form.estimates)}")
    if args.kv_cache is not None and args.tolerance is not None:
        raise UsageError(f"--kv-cache {args.kv_cache:g} and --tolerance {args.tolerance:g}: the "
                         "plan meets one of them; give one")
    given = flags_given(args, ("--no-pilot", *PILOT_FLAGS))
    if given:
        raise UsageError(f"{given[0]}: the pilot profiles data (--data without --checkpoint); "
                         "a --checkpoint profile measures the trained model itself")
    measure = MeasureRequest(args.checkpoint, args.align, task_spec(args), seq_len=args.seq_len,
                             sample_tokens=args.sample_tokens,
                             loss_sensitivity=rule == "loss", form=form.name,
                             estimate=args.estimate or "curvature", rope_dim=args.rope_dim or 0,
                             quiet=args.quiet)
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    return PlanRequest(measure, tolerance, rule, args.logit_bound, args.kv_cache)


def show_plan(planned: PlannedCheckpoint, args: argparse.Namespace) -> None:
    """Say when nothing could be planned, write the plan (``--out``; a fitted latent plan's
    maps beside it) and its plot (``--plot``), and print it."""
    plan = planned.plan
    if not plan.measured and not plan.reduces:
        print(f"{PROG}: no reduction can be planned without data: the bound alone allows none "
              "at these norms; give --task or --data to measure the logits (or --logit-bound "
              "R to assume them)", file=sys.stderr)
    if args.out is not None:
        if planned.fits:
            from workers.compression import write_fits

            factors = fits_path(args.out)
            write_fits(factors, planned.fits)
            plan = dataclasses.replace(plan, factors=factors.name)
            wrote(PROG, factors)
        write_atomic(args.out, plan.to_yaml())
        wrote(PROG, args.out)
    if args.plot is not None:
        plot_plan(plan, args.plot)
        wrote(PROG, args.plot)
    print(render_plan(plan) if args.format == "table" else dump(plan.to_dict(), args.format))


def fits_path(plan: Path) -> Path:
    """Where a plan's fitted latent maps are written: beside it, ``<stem>.factors.safetensors``."""
    return plan.with_name(f"{plan.stem}.factors.safetensors")


# --- command line --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    add_profile_args(p, torch_side=True)
    _add_checkpoint_args(p)
    add_output_args(p, progress="the pilot's or the checkpoint's measurement")
    return p


def _add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("checkpoint (a trained model; docs/theory.md §10)")
    c.add_argument("--checkpoint", type=Path,
                   help="profile a trained model instead (a workers.train .pt, or a GPT-2 "
                        "layout folder: config.json + model.safetensors; docs/theory.md §10)")
    c.add_argument("--task", help="--checkpoint: measure on a sample of this generated task "
                                  "(as workers.train --task), in windows of the model's length")
    c.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="--checkpoint: override a task parameter (repeatable)")
    c.add_argument("--smoke-test", action="store_true", help="--checkpoint: --task at its "
                                                             "smoke size")
    c.add_argument("--tolerance", type=number(0, strict=True),
                   help=f"--checkpoint: allowed error per head group under --rule (default "
                        f"{DEFAULT_TOLERANCE}; with --rule loss, nats per token)")
    c.add_argument("--align", type=int_in(1), default=MeasureRequest.align,
                   help="--checkpoint: reduced qk_dim are multiples of this")
    c.add_argument("--rule", choices=RULES,
                   help="--checkpoint: what decides each reduced qk_dim: the saturation rule's "
                        "bound (docs/theory.md §4), the attention error measured on the sample, "
                        "or the sample's loss increase with each head group alone cut (loss: "
                        "one forward per group and candidate; token models) (default: measured "
                        "with a sample, else bound)")
    c.add_argument("--kv-cache", type=number(0, strict=True), metavar="FRACTION",
                   help="--checkpoint: instead of --tolerance, the student's KV cache per token "
                        "as a fraction of the teacher's (e.g. 0.75), spent where the rule's "
                        "error is largest (docs/theory.md §10.3)")
    c.add_argument("--latent", action="store_true",
                   help="--checkpoint: plan a latent student instead (every mhsa layer caches "
                        "one latent per token from which its keys and values are rebuilt; "
                        "docs/theory.md §10.5): each layer's width where the sample's loss "
                        "rises least (the loss rule, implied)")
    c.add_argument("--estimate", choices=ESTIMATES,
                   help="--latent: how each layer's loss increase at each width is found: "
                        "curvature (default: to second order from one forward and one backward "
                        "pass, with the maps fitted to it; docs/theory.md §10.6) or forwards "
                        "(measured, one forward per layer and width; §10.5)")
    c.add_argument("--rope-dim", type=int_in(0),
                   help="--latent: keep this many dims of every key head turned by RoPE as a "
                        "decoupled part beside the latent, the pairs that cost most to leave "
                        "unturned; the rest of the keys come from the latent unturned, so "
                        "decoding reads the cached latents as they are (default 0: every key "
                        "from the latent, turned after it is rebuilt)")
    c.add_argument("--logit-bound", type=number(0, strict=True),
                   help="--checkpoint without --data: assume |logits| <= R (default: none, "
                        "||J|| <= 1/2)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_outputs(args)
        if args.checkpoint is not None:
            show_plan(plan_checkpoint(checkpoint_request(args)), args)
            return 0
        checkpoint_only = flags_given(args, CHECKPOINT_FLAGS)
        if checkpoint_only:
            raise UsageError(f"{checkpoint_only[0]}: only with --checkpoint (a data profile "
                             "measures --data)")
        spec = required_data(args, "--checkpoint")
        profile = profile_data(spec, args.seq_len, args.sample_tokens, args.seed,
                               pilot_request(args, spec), announce)
    except TransformerAllocError as err:
        return fail(PROG, err.text(flag_names(parser, **TASK_FLAGS,
                                              loss_sensitivity="--rule loss")))
    show_profile(PROG, profile, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
