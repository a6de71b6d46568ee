"""The held-out experiment's verdicts and text (``experiments.heldout``): per corpus the
plan against the best fixed rule on paired seeds (``judge``), per set of corpora the mean over
them (``over_corpora``: development and held-out apart, ``sets``), and the table (``render``).

A corpus's verdict: ``worse`` when the one-sided paired t-test rejects "the plan's loss is no
higher than the best rule's" at 5%, ``better`` when the 95% interval of the difference lies
below 0, else ``inconclusive`` (the seeds cannot tell). The best rule is the one of lowest mean
on the same seeds: choosing it there favours the rules. A set's verdict reads the same way the
corpora's relative differences (plan - best) / best, with their interval over corpora. "Worse
on no corpus of the set" is one claim about all of them: the set also counts the corpora worse
with Holm's correction over it (``family_worse``), since 13 tests read one by one make a false
"worse" about every other time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alloc import HEURISTICS, Constants
from common.cli import render_table
from common.stats import ALPHA, Paired, holm, interval, mean, noise, paired, sd
from userdata.corpora import DEVELOPMENT, HELD_OUT, ROLES, Role, require_role, split_by_role
from workers.calibration import LaterCheck

PLAN = "plan"
MARGIN = 0.01  # the margin a difference is read against: 1% of the best rule's loss
SET_TITLES = {DEVELOPMENT: "development corpora (the rules were tuned on these)",
              HELD_OUT: "held-out corpora (no rule was tuned on these)"}


@dataclass(frozen=True)
class CorpusVerdict:
    """The plan against the best fixed rule on one corpus, on the seeds where every model
    trained (losses in nats per byte or token; ``difference`` = plan - best)."""

    corpus: str
    role: Role
    kind: str
    megabytes: float
    plan: str  # the plan's architecture
    best: str  # the best rule's name (lowest mean)
    best_arch: str
    seeds: int
    plan_loss: float
    best_loss: float
    difference: float
    low: float  # the difference's 95% interval
    high: float
    relative: float  # difference / best_loss
    p_worse: float | None  # one-sided paired t-test: the plan is worse
    verdict: str  # worse, better or inconclusive
    margin: float  # 1% of the best rule's loss
    seed_sd: float  # the seeds' SD, pooled over the distinct models
    difference_sd: float  # the SD of the plan's paired differences to the best rule
    within_margin: bool  # the interval's upper end below +1%: at most 1% worse, at 95%
    # What the plan's later layers buy: the plan against the rule with its first layer and
    # layer 0's heads in every later layer (``twin``; "" where no rule has that first layer).
    twin: str = ""
    twin_difference: float | None = None  # plan - twin, paired, with its 95% interval
    twin_low: float | None = None
    twin_high: float | None = None
    twin_p_worse: float | None = None
    twin_relative: float | None = None  # twin_difference / the twin's loss


@dataclass(frozen=True)
class SetVerdict:
    """One set of corpora (one role): the mean relative difference over its corpora with its
    95% interval over them, and how many corpora each verdict has."""

    role: Role
    corpora: int
    relative: float
    low: float
    high: float
    p_worse: float | None
    verdict: str
    worse: int
    better: int
    inconclusive: int
    within_margin: int
    worse_holm: int  # worse with Holm's correction over the set's corpora (one family)


def over_zero(relative: Sequence[float]) -> Paired:
    """Relative differences over corpora (one per corpus) against none: their mean, its 95%
    interval over the corpora, and the p that the mean is above 0."""
    return paired(relative, [0.0] * len(relative))


def verdict_of(p: Paired) -> str:
    if p.p_worse is not None and p.p_worse < ALPHA:
        return "worse"
    if p.difference.high < 0:
        return "better"
    return "inconclusive"


def paired_seeds(losses: Mapping[str, Mapping[int, float]]) -> tuple[int, ...]:
    """The seeds every model has a finite loss for (a diverged training drops its seed)."""
    common = set.intersection(*(set(by) for by in losses.values()))
    return tuple(sorted(s for s in common
                        if all(math.isfinite(by[s]) for by in losses.values())))


def judge(corpus: str, role: Role, kind: str, megabytes: float,
          losses: Mapping[str, Mapping[int, float]], archs: Mapping[str, str],
          params: Mapping[str, int], twin: str = "") -> tuple[CorpusVerdict, list[dict[str, Any]]]:
    """The corpus's verdict and its models' rows. ``losses``: per label (``PLAN`` and the
    rules' names), its loss per seed; ``archs``: each label's architecture; ``twin``: the rule
    whose model differs from the plan's in the later layers only ("": none).

    Raises:
        RuntimeError: no seed on which every model trained.
    """
    seeds = paired_seeds(losses)
    if not seeds:
        raise RuntimeError(f"{corpus}: no seed on which every model trained")
    at = {label: [by[s] for s in seeds] for label, by in losses.items()}
    best = min((label for label in at if label != PLAN), key=lambda label: mean(at[label]))
    head = paired(at[PLAN], at[best])
    best_loss = mean(at[best])
    distinct = {archs[label]: values for label, values in at.items()}  # a shared model once
    verdict = CorpusVerdict(
        corpus=corpus, role=role, kind=kind, megabytes=round(megabytes, 3), plan=archs[PLAN],
        best=best, best_arch=archs[best], seeds=len(seeds), plan_loss=mean(at[PLAN]),
        best_loss=best_loss, difference=head.difference.mean, low=head.difference.low,
        high=head.difference.high, relative=head.difference.mean / best_loss,
        p_worse=head.p_worse, verdict=verdict_of(head), margin=MARGIN * best_loss,
        seed_sd=noise(distinct, ()).seed_sd,
        difference_sd=sd([p - b for p, b in zip(at[PLAN], at[best])]),
        within_margin=head.difference.high < MARGIN * best_loss, **twin_fields(at, twin))
    return verdict, [model_row(verdict, label, archs[label], params.get(label), at, seeds)
                     for label in at]


def twin_fields(at: Mapping[str, Sequence[float]], twin: str) -> dict[str, Any]:
    """``CorpusVerdict``'s twin fields: the plan against ``twin`` seed by seed ("": none)."""
    if not twin:
        return {}
    later = paired(at[PLAN], at[twin])
    return {"twin": twin, "twin_difference": later.difference.mean,
            "twin_low": later.difference.low, "twin_high": later.difference.high,
            "twin_p_worse": later.p_worse, "twin_relative": later.difference.mean / mean(at[twin])}


def model_row(v: CorpusVerdict, label: str, arch: str, params: int | None,
              at: Mapping[str, list[float]], seeds: Sequence[int]) -> dict[str, Any]:
    """One model on one corpus: its loss over the seeds and the plan's paired difference to
    it."""
    own = interval(at[label])
    diff = None if label == PLAN else paired(at[PLAN], at[label])
    return {"corpus": v.corpus, "role": v.role, "model": label,
            "rule": "the allocator's plan" if label == PLAN else HEURISTICS[label].rule,
            "arch": arch, "params": params, "loss": own.mean, "low": own.low, "high": own.high,
            "seeds": own.n, **{f"loss_seed{s}": x for s, x in zip(seeds, at[label])},
            "plan_minus_this": diff and diff.difference.mean,
            "plan_minus_low": diff and diff.difference.low,
            "plan_minus_high": diff and diff.difference.high,
            "p_plan_worse": diff and diff.p_worse,
            "best_rule": label == v.best}


def over_corpora(rows: Sequence[CorpusVerdict], role: Role) -> SetVerdict:
    """The corpora of one set (all of ``role``: the protocol, ``userdata.corpora``): the mean
    of their relative differences with its interval over corpora.

    Raises:
        ProtocolError: a corpus of the other role among ``rows``.
    """
    require_role(rows, role, lambda r: r.role, lambda r: r.corpus)
    over = over_zero([r.relative for r in rows])
    counts = {v: sum(r.verdict == v for r in rows) for v in ("worse", "better",
                                                               "inconclusive")}
    return SetVerdict(role=role, corpora=len(rows), relative=over.difference.mean,
                      low=over.difference.low, high=over.difference.high,
                      p_worse=over.p_worse, verdict=verdict_of(over), **counts,
                      within_margin=sum(r.within_margin for r in rows),
                      worse_holm=family_worse([r.p_worse for r in rows]))


def family_worse(ps: Sequence[float | None]) -> int:
    """How many of one set's corpora are worse when their tests are read as one family
    (Holm's correction): "worse on none of N corpora" is a claim about all N at once."""
    return sum(p is not None and p < ALPHA for p in holm(ps))


def holm_by_corpus(rows: Sequence[CorpusVerdict]) -> dict[str, float | None]:
    """Each corpus's p (worse) adjusted by Holm's correction over its own set (its role's
    corpora among ``rows``), the family ``SetVerdict.worse_holm`` counts."""
    adjusted: dict[str, float | None] = {}
    for part in split_by_role(rows, lambda r: r.role).values():
        adjusted.update(zip((r.corpus for r in part), holm([r.p_worse for r in part])))
    return adjusted


BEST_EACH = "best on each corpus"  # ``against_rules``' row of the per-corpus best rules


@dataclass(frozen=True)
class RuleOverSet:
    """One fixed rule used on every corpus of a set, as a practitioner fixes a rule before
    seeing the data, against the plan: the mean of (plan - rule) / rule's loss over the set's
    corpora with its 95% interval over them, and on how many corpora the plan is worse or better
    (the corpus's paired verdict). ``BEST_EACH`` is the rule of lowest loss on each corpus,
    chosen on the verdict's own seeds: the set's headline (``over_corpora``), the hardest and
    selection-biased baseline."""

    role: Role
    rule: str
    arch: str  # the rule's architecture ("" where it differs by corpus: ``BEST_EACH``'s may)
    corpora: int
    relative: float
    low: float
    high: float
    p_worse: float | None
    verdict: str
    worse: int
    better: int
    worse_holm: int  # worse with Holm's correction over the set's corpora


def against_rules(models: Sequence[Mapping[str, Any]], role: Role) -> list[RuleOverSet]:
    """Over one set's corpora (``judge``'s model rows of ``role``, as built or read back from
    the tables' CSV): each fixed rule against the plan, in the rows' order, then ``BEST_EACH``.
    Empty with fewer than two corpora (no interval over one)."""
    rules = [m for m in models if m["role"] == role and m["model"] != PLAN]
    by_rule: dict[str, list[Mapping[str, Any]]] = {}
    for m in rules:
        by_rule.setdefault(m["model"], []).append(m)
    by_rule[BEST_EACH] = [m for m in rules if m["best_rule"] in (True, "True")]
    if len(by_rule[BEST_EACH]) < 2:
        return []
    return [rule_over_set(role, rule, rows) for rule, rows in by_rule.items()]


def rule_over_set(role: Role, rule: str, rows: Sequence[Mapping[str, Any]]) -> RuleOverSet:
    """One rule's rows (one per corpus) summed up over the set."""
    relative = [float(r["plan_minus_this"]) / float(r["loss"]) for r in rows]
    ps = [None if r["p_plan_worse"] in (None, "") else float(r["p_plan_worse"]) for r in rows]
    over = over_zero(relative)
    archs = {r["arch"] for r in rows}
    return RuleOverSet(
        role=role, rule=rule, arch=archs.pop() if len(archs) == 1 else "", corpora=len(rows),
        relative=over.difference.mean, low=over.difference.low, high=over.difference.high,
        p_worse=over.p_worse, verdict=verdict_of(over),
        worse=sum(p is not None and p < ALPHA for p in ps),
        better=sum(float(r["plan_minus_high"]) < 0 for r in rows), worse_holm=family_worse(ps))


def against_picks(rows: Sequence[dict[str, Any]], role: Role) -> str:
    """Over one set's calibrated corpora (``calibration_row``'s rows of ``role``): the mean of
    (plan - pick) / pick's loss with its 95% interval over them. The pick is chosen on the
    calibration's seeds and judged on the verdict's, so unlike the best rule (chosen on the
    verdict's own seeds, which favours the rules) its choice carries no selection bias."""
    picked = [r for r in rows if r["role"] == role]
    if len(picked) < 2:
        return ""
    over = over_zero([float(r["plan_minus_pick_relative"]) for r in picked])
    return (f"over the {len(picked)} {role} corpora: plan - pick = "
            f"{100 * over.difference.mean:+.2f}% [{100 * over.difference.low:+.2f}%, "
            f"{100 * over.difference.high:+.2f}%] (95% over corpora), p (worse) "
            f"{p_text(over.p_worse)}: {verdict_of(over)}")


def later_layers(rows: Sequence[dict[str, Any]]) -> str:
    """Over the corpora whose plan has a twin rule: the mean of (plan - twin) / twin's loss
    with its 95% interval over them (what the later layers' rule buys, on average)."""
    twins = [r for r in rows if r["twin"]]
    if len(twins) < 2:
        return ""
    over = over_zero([r["twin_relative"] for r in twins])
    return (f"over the {len(twins)} corpora with a twin: plan - twin = "
            f"{100 * over.difference.mean:+.2f}% [{100 * over.difference.low:+.2f}%, "
            f"{100 * over.difference.high:+.2f}%], p (worse) {p_text(over.p_worse)}")


def sets(rows: Sequence[CorpusVerdict]) -> dict[Role, SetVerdict | None]:
    """Each role's summary over its own corpora (None: no corpus of it): never pooled."""
    parts = split_by_role(rows, lambda r: r.role)
    return {role: over_corpora(parts[role], role) if parts[role] else None for role in ROLES}


# The later layers' rule (docs/theory.md §4, §4.1) checked on the calibration's own seeds: the
# calibrated plan against its twin (its first layer in every layer), their mean losses; the rule
# is kept only where the plan is lower (the product's check, workers.calibrate's).
LaterLayersCheck = LaterCheck


@dataclass(frozen=True)
class Calibration:
    """The bound's constants fitted on one corpus's own trainings at the calibration seeds
    (never a verdict's): the default plan and each fixed rule, their mean losses, the fit, the
    plan it makes, and the rule those same trainings pick (a practitioner's choice from them)."""

    corpus: str
    seeds: tuple[int, ...]
    losses: Mapping[str, float]  # per label (the default plan and each rule), over ``seeds``
    default_plan: str
    plan: str
    constants: Constants
    r2: float
    spearman: float
    design: str
    informative: bool  # R² > 0: the plan is the fitted constants'; else the default plan
    pick: str  # the rule of lowest calibration loss
    # --check-later-layers: the check (None: not asked, or the plan is its own twin)
    later: LaterLayersCheck | None = None


def calibration_row(c: Calibration, models: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One corpus's calibration with the verdict's paired difference of the plan to the rule
    the calibration's trainings pick (``models``: the corpus's rows)."""
    pick = next(m for m in models if m["model"] == c.pick)
    return {"corpus": c.corpus, "role": pick["role"], "seeds": " ".join(map(str, c.seeds)),
            "default_plan": c.default_plan, "plan": c.plan, **c.constants.as_flags(),
            "r2": c.r2, "spearman": c.spearman, "design": c.design,
            "informative": c.informative,
            **{f"calibration_loss_{label}": loss for label, loss in c.losses.items()},
            "pick": c.pick, "pick_arch": pick["arch"],
            "plan_minus_pick": pick["plan_minus_this"], "plan_minus_pick_low":
            pick["plan_minus_low"], "plan_minus_pick_high": pick["plan_minus_high"],
            "p_plan_worse_than_pick": pick["p_plan_worse"],
            "plan_minus_pick_relative": pick["plan_minus_this"] / pick["loss"],
            **later_row(c.later)}


def later_row(check: LaterLayersCheck | None) -> dict[str, Any]:
    if check is None:
        return {}
    return {"checked_arch": check.plan, "twin_arch": check.twin,
            "calibration_loss_checked": check.plan_loss, "calibration_loss_twin": check.twin_loss,
            "later_layers": "rule" if check.keeps_rule else "first layer's heads"}


# --- the text ------------------------------------------------------------------------------------


def render(result: dict[str, Any]) -> str:
    """Per set (development, then held-out): the corpora's verdicts, the set's, and each
    corpus's models."""
    lines = [f"plan against the best fixed rule (paired seeds; {describe_sizes(result)})"]
    if result.get("later_heads", "patterns") != "patterns":
        lines.append(f"later layers: layer 0's heads, only their qk_dim narrowed by the "
                     f"saturation rule (--later-heads {result['later_heads']})")
    if result.get("constants"):
        c = result["constants"]
        lines.append(f"plans with the constants of {c['file']}: c_proj {c['c_proj']:.4g}, "
                     f"c_head {c['c_head']:.4g}, n {c['order']:.3g}, m {c['width_order']:.3g}")
    if result.get("corpus_constants"):
        lines.append(f"each corpus planned with the constants of its own "
                     f"{result['corpus_constants']}")
    for role in ROLES:
        corpora = [c for c in result["corpora"] if c["role"] == role]
        if not corpora:
            continue
        lines += ["", f"{SET_TITLES[role]}:", corpora_table(corpora),
                  set_line(result["sets"][role])]
        rules = [r for r in result.get("rules", ()) if r["role"] == role]
        if rules:
            lines += ["", RULES_TITLE, rules_table(rules)]
        if any(c["twin"] for c in corpora):
            lines += ["", "what the later layers' rule buys: the plan against the rule with its "
                      "first layer in every layer (its twin):", twins_table(corpora)]
            summary = later_layers(corpora)
            if summary:
                lines.append(summary)
        for c in corpora:
            lines += ["", models_table(c, [m for m in result["models"]
                                         if m["corpus"] == c["corpus"]])]
    if result.get("calibrations"):
        lines += ["", "each corpus's calibration (the bound's constants fitted on its own "
                  "trainings at seeds no verdict reads), and the plan against the rule those "
                  "trainings pick:", calibrations_table(result["calibrations"])]
        lines += [line for role in ROLES
                  if (line := against_picks(result["calibrations"], role))]
    stem = result["stem"]
    extra = "".join(f", {stem}_{part}.csv" for part, key in (("rules", "rules"),
                                                            ("calibration", "calibrations"))
                    if result.get(key))
    lines.append(f"\nwrote {result['out']}/{stem}.csv, {stem}_corpora.csv, {stem}_sets.csv, "
                 f"{stem}_runs.csv{extra}, {stem}.txt")
    return "\n".join(lines)


RULES_TITLE = ("the plan against one fixed rule on every corpus (a rule fixed before seeing "
               "the data), over the set:")


def rules_table(rules: Sequence[Mapping[str, Any]]) -> str:
    """``against_rules``' rows (as dicts) of one set."""
    return render_table(
        ["rule", "architecture", "corpora", "plan - rule [95%]", "p (worse)", "verdict",
         "plan worse on (Holm)", "plan better on"],
        [[r["rule"], r["arch"] or "-", r["corpora"],
          f"{100 * r['relative']:+.2f}% [{100 * r['low']:+.2f}%, {100 * r['high']:+.2f}%]",
          p_text(r["p_worse"]), r["verdict"], f"{r['worse']} ({r['worse_holm']})", r["better"]]
         for r in rules])


def describe_sizes(result: dict[str, Any]) -> str:
    s, r = result["sizes"], result["recipe"]
    return (f"D = {s['budget']}, {s['depth']} layers, MLP {s['mlp_ratio']:g}x, windows of "
            f"{s['length']}, {s['steps']} steps of {s['batch_size']}, lr {r['lr']:g}, "
            f"{s['eval_batches']} validation batches, seeds 0-{s['seeds'] - 1}")


def corpora_table(corpora: Sequence[dict[str, Any]]) -> str:
    return render_table(
        ["corpus", "kind", "MB", "plan", "best rule", "plan loss", "best loss",
         "plan - best [95%]", "%", "p (worse)", "Holm", "verdict", "within 1%", "seed SD / 1%"],
        [[c["corpus"], c["kind"], f"{c['megabytes']:.2f}", c["plan"],
          f"{c['best']} ({c['best_arch']})", f"{c['plan_loss']:.4f}", f"{c['best_loss']:.4f}",
          f"{c['difference']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]",
          f"{100 * c['relative']:+.2f}", p_text(c["p_worse"]), p_text(c.get("p_worse_holm")),
          c["verdict"],
          "yes" if c["within_margin"] else "no",
          f"{c['seed_sd']:.4f} / {c['margin']:.4f} ({c['seed_sd'] / c['margin']:.2f}x)"]
         for c in corpora])


def twins_table(corpora: Sequence[dict[str, Any]]) -> str:
    return render_table(
        ["corpus", "plan", "twin", "plan - twin [95%]", "%", "p (worse)"],
        [[c["corpus"], c["plan"], c["twin"] or "-",
          "-" if not c["twin"] else f"{c['twin_difference']:+.4f} [{c['twin_low']:+.4f}, "
          f"{c['twin_high']:+.4f}]",
          "-" if not c["twin"] else f"{100 * c['twin_relative']:+.2f}",
          p_text(c["twin_p_worse"])] for c in corpora])


def calibrations_table(rows: Sequence[dict[str, Any]]) -> str:
    checked = any("later_layers" in r for r in rows)
    return render_table(
        ["corpus", "seeds", "n - m", "R² (log)", "default plan",
         *(["later layers (plan - twin)"] if checked else []), "calibrated plan",
         "calibration's pick", "plan - pick [95%]", "p (worse)"],
        [[r["corpus"], r["seeds"], f"{r['order'] - r['width_order']:+.2f}", f"{r['r2']:.2f}",
          r["default_plan"], *([later_text(r)] if checked else []),
          r["plan"] if r["informative"] or r["plan"] != r["default_plan"]
          else "(R² <= 0: the default)",
          f"{r['pick']} ({r['pick_arch']})",
          f"{r['plan_minus_pick']:+.4f} [{r['plan_minus_pick_low']:+.4f}, "
          f"{r['plan_minus_pick_high']:+.4f}]", p_text(r["p_plan_worse_than_pick"])]
         for r in rows])


def later_text(row: dict[str, Any]) -> str:
    """The later layers' check of one calibration: what it kept, and the calibrated plan's
    mean calibration loss minus its twin's ("its own twin": nothing to check)."""
    if "later_layers" not in row:
        return "- (its own twin)"
    difference = row["calibration_loss_checked"] - row["calibration_loss_twin"]
    return f"{row['later_layers']} ({difference:+.4f})"


def set_line(s: dict[str, Any] | None) -> str:
    if s is None:
        return ""
    return (f"over the {s['corpora']} {s['role']} corpora: plan - best = "
            f"{100 * s['relative']:+.2f}% [{100 * s['low']:+.2f}%, {100 * s['high']:+.2f}%] "
            f"(95% over corpora), p (worse) {p_text(s['p_worse'])}: {s['verdict']}; per "
            f"corpus worse {s['worse']} ({s.get('worse_holm', '-')} with Holm's correction over "
            f"the {s['corpora']}), better {s['better']}, inconclusive {s['inconclusive']}; at "
            f"most 1% worse (95%) on {s['within_margin']}")


def models_table(c: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    title = (f"{c['corpus']} ({c['role']}, {c['kind']}, {c['megabytes']:.2f} MB, {c['seeds']} "
             f"paired seeds; SD of plan - best {c['difference_sd']:.4f}):")
    table = render_table(
        ["model", "rule", "architecture", "params", "loss [95%]", "plan - this [95%]",
         "p (plan worse)"],
        [[r["model"] + (" (best)" if r["best_rule"] else ""), r["rule"], r["arch"],
          r["params"] if r["params"] is not None else "-",
          f"{r['loss']:.4f} [{r['low']:.4f}, {r['high']:.4f}]",
          "-" if r["model"] == PLAN else
          f"{r['plan_minus_this']:+.4f} [{r['plan_minus_low']:+.4f}, "
          f"{r['plan_minus_high']:+.4f}]", p_text(r["p_plan_worse"])] for r in rows])
    return f"{title}\n{table}"


def p_text(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"
