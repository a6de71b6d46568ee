"""python -m alloc.solve --budget 512 [--format table|json|yaml] [--out arch.yaml] [--plot p.png]

The analytic allocator (docs/theory.md §2-§5): how many heads of which dimension each layer gets for
a width budget, from the error bound of *Allocation of Parameters in Transformers* (early layers)
and softmax saturation (later layers). No torch, no Ray: it answers in milliseconds. ``--out``
writes the ``ArchConfig`` YAML that the trainer and the search accept; ``--plot`` draws the
trade-off curve and the per-layer ``qk_dim``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from dataclasses import fields
from pathlib import Path
from typing import Any

from alloc.constants import read_constants
from alloc.plan import Plan, make_plan, report
from alloc.settings import MAX_BLOCK, PLANNED_KINDS, AllocatorInputs, PlanSettings
from arch import MAX_DEPTH, MAX_WIDTH, POSITIONALS, HeadGroup
from common.cli import (
    Parser,
    add_force,
    add_format,
    check_writable,
    dump,
    fail,
    flag_names,
    given_dests,
    int_in,
    number,
    render_table,
    wrote,
)
from common.errors import TransformerAllocError
from common.files import write_atomic

PROG = "alloc.solve"
MAX_SEQ_LEN = 16384
MAX_PRODUCT_ORDER = 8
# The settings a --profile measures: their flags, when given, win over its values.
MEASURED = frozenset(f.name for f in fields(AllocatorInputs))


def build_parser() -> argparse.ArgumentParser:
    d = PlanSettings()
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    _add_shape_flags(p, d)
    _add_bound_flags(p, d)
    _add_model_flags(p, d)
    add_format(p)
    p.add_argument("--out", type=Path, help="write the ArchConfig as YAML to this file")
    add_force(p)
    p.add_argument("--plot", type=Path, help="write the trade-off plot (PNG) to this file")
    return p


def _add_shape_flags(p: argparse.ArgumentParser, d: PlanSettings) -> None:
    """The model's shape and what its first layer must extract."""
    p.add_argument("--budget", type=int_in(1, MAX_WIDTH), default=d.budget,
                   help="attention width D per layer (sum of count * v_dim)")
    p.add_argument("--layers", type=int_in(1, MAX_DEPTH), default=d.layers, help="number of layers")
    p.add_argument("--extract-layers", type=int_in(0, MAX_DEPTH), default=d.extract_layers,
                   help="leading layers solved as extraction layers; the rest get reduced qk_dim")
    p.add_argument("--seq-len", type=int_in(1, MAX_SEQ_LEN), default=d.seq_len,
                   help="sequence length N: offsets 1..N and the softmax width")
    p.add_argument("--input-dim", type=int_in(1, MAX_WIDTH), default=d.input_dim,
                   help="token dimension d_in (given explicitly, it replaces a --profile's input "
                        "spectrum)")
    p.add_argument("--input-spectrum", default=d.input_spectrum, metavar="file:PATH",
                   help="the tokens' covariance eigenvalues as the first layer sees them (a "
                        "pilot profile's; docs/theory.md §9.2): the compression term keeps the "
                        "top directions' share instead of dim / input-dim")
    p.add_argument("--kernel", default=d.kernel,
                   help="memory kernel: ngram:K, exp:LAMBDA, poly:P or file:PATH "
                        "(docs/theory.md §2)")
    p.add_argument("--align", type=int_in(1), default=d.align,
                   help="head dimensions are multiples of this")
    p.add_argument("--max-block", type=int_in(1, MAX_BLOCK), default=d.max_block,
                   help="longest block of consecutive offsets one head group may average with "
                        "a flat positional score; 1 = one offset per group (docs/theory.md §2.2)")
    p.add_argument("--patterns", type=bounds_list,
                   help="distinct attention patterns measured in each later layer, "
                        "comma-separated (a pilot profile's): each later layer gets the nearest "
                        "head count; missing layers keep layer 0's heads (docs/theory.md §4.1)")


def _add_bound_flags(p: argparse.ArgumentParser, d: PlanSettings) -> None:
    """The bound's constants (docs/theory.md §2, §4) and where they are measured."""
    p.add_argument("--c-proj", type=number(0), default=d.c_proj,
                   help="compression constant c_proj (docs/theory.md §2)")
    p.add_argument("--c-head", type=number(0), default=d.c_head,
                   help="extraction constant c_head (docs/theory.md §2)")
    p.add_argument("--order", type=number(1), default=d.order,
                   help="smoothness order n (docs/theory.md §2)")
    p.add_argument("--width-order", type=number(0), default=d.width_order,
                   help="width order m: H heads of dimension d extract at the rate "
                        "H^-n (d/input-dim)^-m; m > n makes fewer, wider heads win (default 0: "
                        "the paper's bound; docs/theory.md §2.3)")
    p.add_argument("--profile", type=Path,
                   help="kernel, input dimension, sequence length and spectrum measured from "
                        "your data (python -m workers.profile --out; docs/theory.md §9); flags "
                        "given explicitly win")
    p.add_argument("--constants", type=Path,
                   help="c_proj, c_head, order and width order from a YAML file (python -m "
                        "alloc.calibrate --out; docs/theory.md §6); flags given explicitly win")
    p.add_argument("--alpha", type=number(0), default=d.alpha, help="positional decay alpha")
    p.add_argument("--norm-bound", type=number(0, strict=True), default=None,
                   help="token norm bound B (default: sqrt(input-dim))")
    p.add_argument("--tolerance", type=number(0, strict=True), default=d.tolerance,
                   help="allowed attention error per later-layer head (docs/theory.md §4)")
    p.add_argument("--logit-bounds", type=bounds_list,
                   help="measured R of each later layer, comma-separated (e.g. from python -m "
                        "workers.profile --checkpoint); missing layers use --logit-bound "
                        "(docs/theory.md §4)")
    p.add_argument("--logit-bound", type=number(0, strict=True), default=d.logit_bound,
                   help="logit bound R of the saturation rule (docs/theory.md §4)")
    p.add_argument("--spectrum", default=d.spectrum,
                   help="teacher singular values: power:BETA or file:PATH (docs/theory.md §4)")


def _add_model_flags(p: argparse.ArgumentParser, d: PlanSettings) -> None:
    """What the written architecture is, besides its head groups."""
    p.add_argument("--attention", choices=PLANNED_KINDS, default=d.attention,
                   help="attention kind of every layer")
    p.add_argument("--mlp-ratio", type=number(0), default=d.mlp_ratio,
                   help="MLP hidden / d_model (0 = attention-only layers); with an MLP the "
                        "bound's compression term is of order 2 (docs/theory.md §2.1)")
    p.add_argument("--product-order", type=int_in(1, MAX_PRODUCT_ORDER),
                   help="order k of the compression term: 1 = the attention-only rule, 2 = an "
                        "MLP forms products of the extracted tokens (default: 2 with an MLP, "
                        "else 1; docs/theory.md §2.1)")
    p.add_argument("--kv-heads", type=int_in(1, MAX_WIDTH), default=d.kv_heads,
                   help="key/value heads of every layer (grouped-query attention), shared by "
                        "its head groups in proportion to their query heads (default: one per "
                        "query head)")
    p.add_argument("--uniform", action="store_true",
                   help="extraction layers use the best uniform layer instead of groups")
    p.add_argument("--vocab-size", type=int_in(1), default=None,
                   help="write a token model (embedding + LM head) instead of vector in/out")
    p.add_argument("--positional", choices=POSITIONALS, default=d.positional,
                   help="positional encoding of the written architecture")


def bounds_list(text: str) -> tuple[float, ...]:
    """argparse type: positive numbers separated by commas."""
    parse = number(0, strict=True)
    try:
        return tuple(parse(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive numbers separated by "
                                         "commas, one per later layer") from None


def settings_from_args(args: argparse.Namespace, measured: AllocatorInputs | None = None,
                       given: Collection[str] = ()) -> PlanSettings:
    """The settings the flags give, over ``measured`` inputs (a ``--profile``'s) where a flag
    of theirs is not in ``given`` (``PlanSettings`` checks the rules that tie them together).

    Raises:
        PlanError: a rule broken, its problems naming the settings' fields.
    """
    values = {f.name: getattr(args, f.name) for f in fields(PlanSettings)}
    if measured is None:
        return PlanSettings(**values)
    return measured.settings(**{k: v for k, v in values.items()
                                if k in given or k not in MEASURED})


def _num(x: float) -> str:
    return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"


def _groups(groups: list[dict[str, Any]], real: bool = False) -> str:
    parts = []
    for g in groups:
        count = f"{g['count']:.2f}" if real else str(g["count"])
        share = f" ({g['share']:.0%})" if real and g.get("share", 1.0) < 1 else ""
        span = g.get("span", 1)
        where = f"s{g['offset']}" + (f"-{g['offset'] + span - 1}" if span > 1 else "")
        parts.append(f"{where}:{count}x{g['dim']:g}{share}")
    return "  ".join(parts) if parts else "(every offset truncated)"


def render(rep: dict[str, Any]) -> str:
    """Human-readable report: per-layer table, totals, extraction detail, saturation effect."""
    inp = rep["inputs"]
    head = (f"{PROG}: D={rep['budget']} layers={inp['layers']} kernel={inp['kernel']} "
            f"seq_len={inp['seq_len']} input_dim={inp['input_dim']} align={inp['align']}")
    rows = []
    for r in rep["layers"]:
        terms = r["error_terms"]
        if "attention" in terms:
            detail = "attention (per head)"
        else:
            detail = (f"comp {_num(terms['compression'])} + extr {_num(terms['extraction'])} "
                      f"+ avg {_num(terms['averaging'])} + trunc {_num(terms['truncation'])}")
        heads = "+".join(_head(g) for g in r["heads"])
        rows.append([r["index"], r["role"], r["attention"], heads, r["width"],
                     f"{r['attention_params']:,}", f"{r['predicted_error']:.4g}", detail,
                     r["reason"]])
    table = render_table(["layer", "role", "attention", "heads", "width", "attn params",
                          "pred. error", "terms", "why"], rows,
                         right=[True, False, False, False, True, True, True, False, False])
    t, ex = rep["totals"], rep["extract"]
    cont = ex["continuous"]
    lines = [
        head, "", table, "",
        f"attention params {t['attention_params']:,} vs {t['baseline_attention_params']:,} for "
        f"{t['baseline_heads']} in every layer: saving {t['saving']:.1%} "
        f"(whole model {t['model_params']:,} vs {t['baseline_model_params']:,})",
        "",
        f"extraction layer (offset s: heads x dim; chosen: {ex['chosen']})",
        f"  exact       E = {ex['exact']['objective']:.4f}  {_groups(ex['exact']['groups'])}",
        f"  continuous  E = {cont['objective']:.4f}  {_groups(cont['groups'], real=True)}",
        f"              lower bound of the one-offset optimum "
        f"{cont['one_offset_objective']:.4f}; rounding gap {cont['rounding_gap']:.4f}",
        f"  uniform     E = {ex['uniform']['objective']:.4f}  "
        f"{ex['uniform']['count']} heads of {ex['uniform']['dim']}",
        "",
        f"saturation: qk_dim of a {rep['saturation']['teacher_qk_dim']}-dim head vs sequence "
        f"length (tolerance {inp['tolerance']:g}, R={inp['logit_bound']:g})",
    ]
    curve = rep["saturation"]["curve"]
    lines.append(render_table(["N"] + [str(c["seq_len"]) for c in curve],
                              [["qk_dim"] + [c["qk_dim"] for c in curve],
                               ["||J|| bound"] + [f"{c['jacobian_bound']:.3g}" for c in curve]],
                              right=[False] + [True] * len(curve)))
    return "\n".join(lines)


def _head(g: dict[str, int]) -> str:
    """``8x64``, ``8x8/64`` or ``8x64kv2`` (key/value heads shown only when shared)."""
    return str(HeadGroup.from_dict(g))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, PlanSettings]:
    """The flags of ``argv`` and the settings they give: a ``--constants`` file supplies
    defaults and a ``--profile`` file the inputs it measured, which explicit flags override.

    Raises:
        TransformerAllocError: a file unreadable, or a rule of the settings broken.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    measured = None
    if args.profile is not None:
        from alloc.profiling.files import read_allocator_inputs  # SciPy only when asked for

        measured = read_allocator_inputs(args.profile)
    if args.constants is not None:
        parser.set_defaults(**read_constants(args.constants).as_flags())
        args = parser.parse_args(argv)
    return args, settings_from_args(args, measured, given_dests(parser, argv))


def main(argv: list[str] | None = None) -> int:
    flags = flag_names(build_parser())  # the settings' problems shown as these flags
    try:
        args, settings = parse_args(argv)
        if args.out is not None:
            check_writable("--out", args.out, force=args.force)
        if args.plot is not None:
            check_writable("--plot", args.plot)
        plan: Plan = make_plan(settings)  # or key/value heads its head groups cannot share
    except TransformerAllocError as err:
        return fail(PROG, err.text(flags))
    rep = report(plan)
    if args.out is not None:
        write_atomic(args.out, plan.arch.to_yaml())
        wrote(PROG, args.out)
    if args.plot is not None:
        from alloc.plot import plot_plan  # matplotlib only when asked for

        plot_plan(plan, args.plot)
        wrote(PROG, args.plot)
    print(render(rep) if args.format == "table" else dump(rep, args.format), end="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
