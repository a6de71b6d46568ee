"""python -m workers.calibrate --data corpus/ --budget D --layers L --out plan.yaml [--smoke-test]

The calibrated plan in one command: your data profiled (with its pilot), the allocator's
default plan and every fixed head-count rule (heads of 64, one head per 32 dims, 1, 2, 4 and 8
heads) trained at the calibration seeds through the search (Ray Tune, FIFO, recorded in the
study --study; the seed is each trial's train.seed, so they pair by seed), the bound's
constants fitted to their mean losses and the plan made again, then the later layers' rule
checked: the calibrated plan against its twin (its first layer in every layer) at the same
seeds (study STUDY-check where it trains); where the twin is not beaten the later layers copy
the first. --resume continues both studies (a finished trial is never trained again). At the
end, once: the plan --out (an ArchConfig python -m workers.train --arch reads) and its
constants beside it (OUT-constants.yaml, for alloc.solve --constants); on stdout what it rests
on (losses per rule, the fit's R², the later layers' verdict). Torch, Ray and Optuna are
imported once the flags are read.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arch import MAX_DEPTH, MAX_WIDTH, SMOKE_TRIAL
from common.cli import (
    Parser,
    add_format,
    dump,
    fail,
    fault,
    flag_names,
    int_in,
    number,
    render_table,
)
from common.errors import TransformerAllocError, UsageError
from userdata import TaskSpec, add_data_args, data_spec
from workers.calibration import CALIBRATION_SEED, SEEDS, STEPS
from workers.search import SMOKE_PILOT_STEPS
from workers.taskargs import TASK_FLAGS

if TYPE_CHECKING:
    from workers.calibration import Calibration, CalibrationRequest

PROG = "workers.calibrate"
SMOKE_SEEDS = 2


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    add_data_args(p, data_help="your corpus (a UTF-8 text file or folder of *.txt, or nanoGPT's "
                               "train.bin/val.bin): profiled, then every model trains on it")
    p.add_argument("--budget", type=int_in(1, MAX_WIDTH), required=True, metavar="D",
                   help="the width D of every model, a multiple of 8")
    p.add_argument("--layers", type=int_in(1, MAX_DEPTH), required=True, metavar="L")
    p.add_argument("--out", type=Path, required=True,
                   help="the plan's ArchConfig YAML (its constants: OUT-constants.yaml)")
    p.add_argument("--seq-len", type=int_in(2), default=64, metavar="N",
                   help="training window in tokens (default: %(default)s)")
    p.add_argument("--mlp-ratio", type=number(0), default=4.0)
    p.add_argument("--study", default="calibrate",
                   help="the calibration's study (the later layers': STUDY-check; default: "
                        "%(default)s)")
    p.add_argument("--storage", help="SQLAlchemy URL (default: $OPTUNA_STORAGE, then "
                                     "sqlite:///studies.db)")
    p.add_argument("--seeds", type=int, default=None, metavar="K",
                   help=f"calibration seeds per model, {CALIBRATION_SEED} and up (default: "
                        f"{SEEDS}, {SMOKE_SEEDS} with --smoke-test)")
    p.add_argument("--steps", type=int_in(1), help="training steps of every model (default: "
                   f"{STEPS}; {SMOKE_TRIAL['steps']} with --smoke-test)")
    p.add_argument("--batch-size", type=int_in(1), default=16)
    p.add_argument("--profile", type=Path,
                   help="the data's profile (python -m workers.profile --out); default: made "
                        "now with its pilot")
    p.add_argument("--pilot-steps", type=int_in(1), help="the profile's pilot steps")
    p.add_argument("--resume", action="store_true",
                   help="continue the studies: only the trainings they lack run")
    p.add_argument("--max-concurrent", type=int_in(1), help="trainings at once")
    p.add_argument("--storage-path", type=Path, default=Path("ray_results"),
                   help="Ray's results and the profile made now")
    p.add_argument("--smoke-test", action="store_true",
                   help=f"{SMOKE_TRIAL['steps']} steps a training, {SMOKE_SEEDS} seeds, a "
                        f"{SMOKE_PILOT_STEPS}-step pilot: checks that it runs")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (the search's estimate and its trials)")
    add_format(p)
    return p


def request_of(args: argparse.Namespace) -> CalibrationRequest:
    from workers.calibration import CalibrationRequest

    spec = data_spec(args)
    if spec is None:
        raise UsageError("--data: required (the corpus to calibrate on)")
    return CalibrationRequest(
        task=TaskSpec(data=spec, params={"length": args.seq_len}), budget=args.budget,
        layers=args.layers, out=args.out, study=args.study, storage=args.storage,
        seeds=(SMOKE_SEEDS if args.smoke_test else SEEDS) if args.seeds is None else args.seeds,
        steps=args.steps, batch_size=args.batch_size, mlp_ratio=args.mlp_ratio,
        profile=args.profile,
        pilot_steps=args.pilot_steps or (SMOKE_PILOT_STEPS if args.smoke_test else None),
        resume=args.resume, smoke_test=args.smoke_test, quiet=args.quiet,
        storage_path=args.storage_path, max_concurrent=args.max_concurrent)


def render(result: dict[str, Any]) -> str:
    fit, later = result["fit"], result["later_layers"]
    rows = [[label, f"{loss:.4f}"] for label, loss in result["losses"].items()]
    rows.append(["calibrated plan", f"{result['calibrated_plan_loss']:.4f}"])
    verdict = ("its later layers are its first: nothing to check" if later is None else
               f"{later['verdict']} (plan {later['plan_loss']:.4f}, twin {later['twin']} "
               f"{later['twin_loss']:.4f})")
    return "\n".join([
        f"{PROG}: plan {result['plan']}",
        f"  written to {result['out']} (constants {result['constants']})",
        f"default plan {result['default_plan']}; calibrated {result['calibrated_plan']}",
        f"mean loss over seeds {result['seeds'][0]}-{result['seeds'][-1]} "
        f"(studies {', '.join(result['studies'])}):",
        render_table(["model", "loss"], rows, right=[False, True]),
        f"fit: c_proj {fit['c_proj']:.4g}, c_head {fit['c_head']:.4g}, n {fit['order']:.3g}, "
        f"m {fit['width_order']:.3g}; R² {fit['r2']:.3f}"
        + ("" if fit["informative"] else " (explains nothing: the default plan kept)"),
        f"later layers: {verdict}"])


FLAGS = {**TASK_FLAGS, "study": "--study", "resume": "--resume", "out": "--out"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = flag_names(parser, **FLAGS)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    import optuna

    from studies import StorageFaultError
    from workers.errors import CalibrationStopped, SearchFaultError
    from workers.search import stdout_aside

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        from workers.calibration import calibrate_plan

        with stdout_aside():
            result: Calibration = calibrate_plan(request_of(args))
    except (StorageFaultError, SearchFaultError, CalibrationStopped) as err:  # --resume goes on
        return fault(PROG, err.text(names))
    except TransformerAllocError as err:
        return fail(PROG, err.text(names))
    data = result.to_dict()
    print(render(data) if args.format == "table" else dump(data, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
