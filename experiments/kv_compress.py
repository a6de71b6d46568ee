"""python -m experiments.kv_compress --teacher PATH --data TOKENS --eval DIR [DIR ...]

The published ways to shrink a trained GQA Llama's KV cache side by side with ours, at 50%, 25%
and 12.5% of what its teacher caches per token (docs/theory.md §10, the methods of
``kv_methods``: ``svd``, ``asvd``, ``palu``, ``mha2mla``, ``transmla``, ``ours``,
``ours-latent``, ``ours-mla``, ``ours-rorope``), on any Llama-family teacher: a ``transformers``
folder, a GGUF file or our checkpoint (``--teacher``; without it, the small Llama of
``llama_compress`` is trained here on Python's standard library and used). Each calibration seed
(``--seeds``) draws its own sample of ``--data`` (``--sample-tokens``, windows of
``--seq-len``), which every method calibrates on; the fine-tuning (``--finetune-steps``, at the
``--finetune`` fractions) trains on ``--data`` too. Every student is scored by its perplexity on
each ``--eval`` source (held-out text the calibration never saw; ``--eval-tokens`` of each, in
windows of ``--seq-len``), right after the cut and after fine-tuning, with a 95% interval of its
mean loss against the best other method, paired by window (bootstrap over windows).

Writes ``kv_compress.csv`` (per seed, size, method and source: loss and perplexity after the
cut and fine-tuned), ``kv_compress_windows.csv`` (every window's loss: the intervals are
recomputed from it), ``kv_compress_summary.csv`` and ``kv_compress.png``. A second run on the
same ``--out`` computes only the rows it lacks.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alloc.compression import CompressionPlan, plan_compression
from arch import TrainConfig, param_count
from common.cli import int_in, number, render_table
from common.errors import UsageError
from common.files import write_atomic, write_csv
from common.plots import new_figure, write_figure
from common.stats import paired_bootstrap
from experiments import harness
from experiments.kv_methods import (
    METHODS,
    Calibration,
    calibrate,
    calibration_state,
    layer_units,
)
from userdata import DataSpec, open_tokens
from userdata.corpora import write_code
from workers.compression import measure_model
from workers.models import Model
from workers.tasks import make_data_task
from workers.training import Trainer, describe_run, run_with_progress

NAME = "kv_compress"
FRACTIONS = (0.5, 0.25, 0.125)  # of the teacher's KV cache per token
BASELINE = "svd"  # the baseline to beat
BELOW_FLOOR = "below floor"  # a student its method cannot build at a size (its rows say so)
COMPARISONS = ("best_other", "vs_best_other", "vs_best_other_low", "vs_best_other_high",
               "vs_svd", "vs_svd_low", "vs_svd_high")


@dataclass(frozen=True)
class Sizes:
    seq_len: int
    sample_tokens: int
    eval_tokens: int
    finetune_steps: int
    finetune_batch: int
    align: int
    ours_tokens: int  # the compact loss plan's sample (one forward per cut)


FULL = Sizes(512, 16384, 8192, 100, 2, 8, 512)
SMOKE = Sizes(32, 256, 512, 3, 4, 2, 64)


@dataclass(frozen=True)
class Setup:
    """The teacher, its calibration source (also the fine-tuning data), the held-out
    sources' token streams and the sizes."""

    teacher: Model
    data: DataSpec
    evals: dict[str, np.ndarray]
    sizes: Sizes


def windows(tokens: np.ndarray, length: int, limit: int) -> torch.Tensor:
    """Consecutive windows of ``length + 1`` ids (inputs and next tokens) from the start of
    ``tokens``, ``limit`` tokens in all at most (at least one window)."""
    count = max(1, min(limit // length, (len(tokens) - 1) // length))
    ids = torch.from_numpy(np.asarray(tokens[:count * length + 1], dtype=np.int64))
    return torch.stack([ids[i * length:(i + 1) * length + 1] for i in range(count)])


@torch.no_grad()
def window_losses(model: Model, ids: torch.Tensor, batch: int = 4) -> np.ndarray:
    """Each window's mean next-token loss (nats)."""
    out = []
    for chunk in ids.split(batch):
        logits = model(chunk[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:],
                                                 reduction="none")
        out.append(loss.double().mean(dim=1).numpy())
    return np.concatenate(out)


def calibration(setup: Setup, seed: int, methods: list[str], quiet: bool, out: Path
                ) -> Calibration:
    """The sample of ``seed``: random windows of the calibration source's training split,
    measured once (kept in ``out``)."""
    sizes = setup.sizes
    tokens = open_tokens(setup.data, sizes.seq_len + 1).train
    rng = np.random.default_rng(seed)
    count = max(1, sizes.sample_tokens // sizes.seq_len)
    starts = rng.integers(0, len(tokens) - sizes.seq_len - 1, size=count)
    ids = torch.stack([torch.from_numpy(np.asarray(tokens[s:s + sizes.seq_len + 1],
                                                   dtype=np.int64)) for s in starts])
    x, targets = ids[:, :-1], ids[:, 1:]
    cache = out / f"calibration{seed}.pt"  # a re-run (or a crash) does not measure it again
    saved = torch.load(cache, weights_only=True) if cache.exists() else None
    cal = calibrate(setup.teacher, x, targets, seed, sizes.align, quiet, saved)
    if saved is None:
        torch.save(calibration_state(cal), cache)
    if "ours" in methods:  # the compact loss plan: one forward per cut, on a smaller sample
        path = out / f"loss_plan{seed}.yaml"
        if path.exists():
            plan = CompressionPlan.from_yaml(path.read_text())
        else:
            small = max(1, sizes.ours_tokens // sizes.seq_len)
            measured = measure_model(setup.teacher, x[:small], sizes.seq_len, sizes.align,
                                     sample="calibration", targets=targets[:small], quiet=quiet)
            plan = plan_compression(measured, 1.0, rule="loss")
            write_atomic(path, plan.to_yaml())
        cal = dataclasses.replace(cal, loss_plan=plan)
    return cal


def finetuned(student: Model, setup: Setup, seed: int, quiet: bool) -> Model:
    """``student`` after ``finetune_steps`` steps on the calibration source (its progress on
    stderr unless ``quiet``: minutes per student at a real model's size)."""
    sizes = setup.sizes
    task = make_data_task(setup.data, length=sizes.seq_len)
    trainer = Trainer(student.arch, task, TrainConfig(
        steps=sizes.finetune_steps, lr=1e-4, batch_size=sizes.finetune_batch,
        eval_every=sizes.finetune_steps, eval_batches=1, device="cpu", seed=seed,
        warmup=0.1))
    trainer.model.load_state_dict(student.state_dict())
    run_with_progress(trainer, "fine-tune", quiet, describe_run(trainer))
    return trainer.model.eval()


def describe(student: Model) -> str:
    """Per layer ``c24+r8`` (latent with a RoPE part), ``c24`` or ``k16/v8`` (compact)."""
    out = []
    for layer in student.arch.layers:
        g = layer.heads[0]
        out.append(f"c{layer.latent_dim}" + (f"+r{layer.rope_dim}" if layer.rope_dim else "")
                   if layer.kind.latent else f"k{g.qk_dim}/v{g.v_dim}")
    return " ".join(out)


class Store:
    """The rows and window losses measured so far, on disk as each is measured."""

    def __init__(self, out: Path) -> None:
        self.rows_path, self.windows_path = out / f"{NAME}.csv", out / f"{NAME}_windows.csv"
        self.rows = _read(self.rows_path)
        self.windows = _read(self.windows_path)

    def stages(self, seed: int, fraction: float, method: str) -> set[str]:
        """The stages (``cut``, ``finetuned``) measured for this student."""
        return {r["stage"] for r in self.rows if int(r["seed"]) == seed
                and float(r["fraction"]) == fraction and r["method"] == method}

    def add(self, rows: list[dict[str, Any]], windows: list[dict[str, Any]]) -> None:
        """One student's rows and window losses (replacing any windows of it left by a run
        that stopped before its rows were written)."""
        def key(r: dict[str, Any]) -> tuple[str, ...]:
            return str(r["seed"]), str(r["fraction"]), r["method"], r["stage"]
        keys = {key(r) for r in rows}
        self.windows = [w for w in self.windows if key(w) not in keys]
        self.rows += rows
        self.windows += windows
        write_csv(self.windows_path, self.windows)
        write_csv(self.rows_path, self.rows)

    def below_floor(self, fraction: float, method: str, stage: str, source: str) -> bool:
        """Whether this method's student was below its floor at this size (stored as such)."""
        return any(r["layers"] == BELOW_FLOOR for r in self.rows
                   if float(r["fraction"]) == fraction and r["method"] == method
                   and r["stage"] == stage and r["source"] == source)

    def losses(self, seed: int, fraction: float, method: str, stage: str, source: str
               ) -> np.ndarray:
        return np.array([float(w["loss"]) for w in self.windows
                         if int(w["seed"]) == seed and float(w["fraction"]) == fraction
                         and w["method"] == method and w["stage"] == stage
                         and w["source"] == source])


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def scored(model: Model | None, setup: Setup, key: dict[str, Any], stage: str
           ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Per held-out source: the row entries and the window losses of ``model`` (None: a
    method below its floor at this size)."""
    for source, tokens in setup.evals.items():
        if model is None:
            yield {**key, "stage": stage, "source": source, "loss": math.nan,
                   "perplexity": math.nan}, []
            continue
        losses = window_losses(model, windows(tokens, setup.sizes.seq_len,
                                              setup.sizes.eval_tokens))
        loss = float(losses.mean())
        yield ({**key, "stage": stage, "source": source, "loss": loss,
                "perplexity": math.exp(loss)},
               [{**key, "stage": stage, "source": source, "window": w, "loss": float(v)}
                for w, v in enumerate(losses)])


def missing_stages(store: Store, setup: Setup, args: argparse.Namespace, seed: int,
                   fraction: float, method: str) -> set[str]:
    """The stages this student still lacks: ``cut``, and ``finetuned`` at the
    ``--finetune`` fractions."""
    tuned = fraction in args.finetune and setup.sizes.finetune_steps
    return ({"cut", "finetuned"} if tuned else {"cut"}) - store.stages(seed, fraction, method)


def measure(setup: Setup, store: Store, args: argparse.Namespace, bar: Any) -> None:
    """Every method at every size for every calibration seed, but those already stored."""
    for seed in args.seeds:
        todo = [(f, m, missing) for f in args.fractions for m in args.methods
                if (missing := missing_stages(store, setup, args, seed, f, m))]
        if not todo:
            continue
        cal = calibration(setup, seed, args.methods, args.quiet, args.out)
        teacher_key = {"seed": seed, "fraction": 1.0, "method": "teacher"}
        if not store.stages(seed, 1.0, "teacher"):
            _store(store, scored(setup.teacher, setup, teacher_key, "cut"), teacher_key,
                   describe(setup.teacher), param_count(setup.teacher.arch).total,
                   setup.teacher.arch.kv_width)
        for fraction, method, missing in todo:
            student = METHODS[method](setup.teacher, cal, fraction)
            key = {"seed": seed, "fraction": fraction, "method": method}
            # a student fine-tuned in a later run than its cut was scored is cut again (the
            # cut is deterministic given the seed's sample) but not scored again
            results = list(scored(student, setup, key, "cut")) if "cut" in missing else []
            if "finetuned" in missing:  # (a student below its floor is stored as such)
                tuned = None if student is None else finetuned(student, setup, seed, args.quiet)
                results += list(scored(tuned, setup, key, "finetuned"))
            _store(store, iter(results), key, describe(student) if student else BELOW_FLOOR,
                   param_count(student.arch).total if student else 0,
                   student.arch.kv_width if student else 0)
            bar.update(1)
            scores = ", ".join(f'{r["source"]} {_perplexity(r["perplexity"])} ({r["stage"]})'
                               for r, _ in results)
            bar.event(f"seed {seed}, {fraction:.1%} of the KV cache, {method}: perplexity "
                      f"{scores}")


def _perplexity(value: float | None) -> str:
    """A perplexity as the tables show it: a student below its floor has none."""
    return BELOW_FLOOR if value is None or math.isnan(value) else f"{value:.2f}"


def _store(store: Store, results: Iterator[tuple[dict[str, Any], list[dict[str, Any]]]],
           key: dict[str, Any], layers: str, params: int, kv_units: int) -> None:
    rows, windows_ = [], []
    for row, wins in results:
        rows.append({**row, "layers": layers, "params": params, "kv_units": kv_units})
        windows_ += wins
    store.add(rows, windows_)


def summarise(store: Store, args: argparse.Namespace, sources: list[str]
              ) -> list[dict[str, Any]]:
    """Per size, stage, source and method: the mean loss over the seeds measured (``seeds``:
    how many; a stage run for some seeds only is summarised over those), its perplexity, and
    its mean difference from the best other method and from ``svd`` with 95% intervals, paired
    by seed and window over the seeds both have."""
    out = []
    for fraction in args.fractions:
        for stage in ("cut", "finetuned"):
            for source in sources:
                per_seed = {m: {s: x for s in args.seeds
                                if len(x := store.losses(s, fraction, m, stage, source))}
                            for m in args.methods}
                below = [m for m in args.methods if not per_seed[m]
                         and store.below_floor(fraction, m, stage, source)]
                per_seed = {m: v for m, v in per_seed.items() if v}
                pooled = {m: np.concatenate(list(v.values())) for m, v in per_seed.items()}
                teacher = np.concatenate([store.losses(s, 1.0, "teacher", "cut", source)
                                          for s in args.seeds])
                for method, seeds in per_seed.items():
                    losses = pooled[method]
                    entry = {"fraction": fraction, "stage": stage, "source": source,
                             "method": method, "seeds": len(seeds),
                             "loss": float(losses.mean()),
                             "perplexity": math.exp(float(losses.mean())),
                             "teacher_perplexity": math.exp(float(teacher.mean())),
                             "below_floor": False, **dict.fromkeys(COMPARISONS)}
                    others = [m for m in per_seed if m != method]
                    if others:  # (a row without one keeps None: one CSV header for all)
                        best = min(others, key=lambda m: float(pooled[m].mean()))
                        compared = _paired(seeds, per_seed[best])
                        if compared is not None:
                            entry |= {"best_other": best, **dict(zip(
                                ("vs_best_other", "vs_best_other_low", "vs_best_other_high"),
                                compared))}
                    if method != BASELINE and BASELINE in per_seed:
                        compared = _paired(seeds, per_seed[BASELINE])
                        if compared is not None:
                            entry |= dict(zip(("vs_svd", "vs_svd_low", "vs_svd_high"),
                                              compared))
                    out.append(entry)
                # a method that cannot reach this size keeps its row, marked (no perplexity)
                out += [{"fraction": fraction, "stage": stage, "source": source,
                         "method": method, "seeds": 0, "loss": None, "perplexity": None,
                         "teacher_perplexity": math.exp(float(teacher.mean())),
                         "below_floor": True, **dict.fromkeys(COMPARISONS)}
                        for method in below]
    return out


def _paired(ours: dict[int, np.ndarray], theirs: dict[int, np.ndarray]
            ) -> tuple[float, float, float] | None:
    """The paired bootstrap of two methods' window losses over the seeds both have."""
    common = [s for s in ours if s in theirs]
    if not common:
        return None
    return paired_bootstrap(np.concatenate([ours[s] for s in common]),
                            np.concatenate([theirs[s] for s in common]))


def verdicts(summary: list[dict[str, Any]]) -> list[str]:
    """Per size, stage and source: the lowest perplexity, and whether its lead over the next
    is outside the interval."""
    lines = []
    keys = sorted({(s["fraction"], s["stage"], s["source"]) for s in summary},
                  key=lambda k: (-k[0], k[1], k[2]))
    for fraction, stage, source in keys:
        mine = [s for s in summary if (s["fraction"], s["stage"], s["source"]) ==
                (fraction, stage, source) and not s["below_floor"]]
        if not mine:
            continue
        best = min(mine, key=lambda s: s["loss"])
        lead = ""
        if best["best_other"] is not None:
            holds = best["vs_best_other_high"] < 0
            lead = (f", {best['vs_best_other']:+.4f} nats vs {best['best_other']} "
                    f"[{best['vs_best_other_low']:+.4f}, {best['vs_best_other_high']:+.4f}]: "
                    + ("lower beyond the interval" if holds else "inconclusive"))
        lines.append(f"{fraction:.1%} {stage} on {source}: lowest {best['method']} "
                     f"(perplexity {best['perplexity']:.2f}, teacher "
                     f"{best['teacher_perplexity']:.2f}){lead}")
    return lines


def setup_for(args: argparse.Namespace) -> Setup:
    """The teacher and the sources the flags name (the small Llama of ``llama_compress``,
    trained here on the standard library, without ``--teacher``)."""
    from workers.checkpoints import load

    sizes = SMOKE if args.smoke_test else FULL
    sizes = Sizes(args.seq_len or sizes.seq_len, args.sample_tokens or sizes.sample_tokens,
                  args.eval_tokens or sizes.eval_tokens,
                  sizes.finetune_steps if args.finetune_steps is None else args.finetune_steps,
                  sizes.finetune_batch, sizes.align, sizes.ours_tokens)
    if args.teacher is None:
        if args.data is not None or args.eval:
            raise UsageError("--data and --eval: give --teacher too (without it, the teacher "
                             "and its data are the standard library's)")
        teacher, data = own_teacher(args)
        return Setup(teacher, data, {"stdlib (val)": open_tokens(data, 2).val}, sizes)
    if args.data is None or not args.eval:
        raise UsageError("--teacher: give --data (the calibration text, as tokens of the "
                         "teacher's vocabulary) and --eval (held-out sources)")
    loaded = load(args.teacher)
    teacher = loaded.model.eval()
    vocab = teacher.arch.vocab_size
    data = DataSpec(str(args.data), vocab_size=vocab)
    evals = {}
    for path in args.eval:
        tokens = open_tokens(DataSpec(str(path), vocab_size=vocab), sizes.seq_len + 1)
        evals[Path(path).name] = np.concatenate([tokens.train, tokens.val])
    return Setup(teacher, data, evals, sizes)


def own_teacher(args: argparse.Namespace) -> tuple[Model, DataSpec]:
    """The small GQA Llama of ``llama_compress``, trained here (seed 0) on the standard
    library's sources, and its data."""
    from experiments.llama_compress import FULL as LLAMA, SMOKE as LLAMA_SMOKE, teacher

    sizes = LLAMA_SMOKE if args.smoke_test else LLAMA
    corpus = write_code(args.out / "corpus", sizes.megabytes)
    data = DataSpec(str(corpus))
    task = make_data_task(data, length=sizes.length)
    folder = args.out / "teacher0"
    folder.mkdir(parents=True, exist_ok=True)
    return teacher(sizes, task, sizes.steps, 0, folder, args), data


def run(args: argparse.Namespace) -> dict[str, Any]:
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise UsageError(f"--methods {unknown[0]}: must be one of {', '.join(METHODS)}")
    harness.prepare(args)
    setup = setup_for(args)
    if setup.teacher.arch.positional != "rope" or any(
            layer.attention != "mhsa" for layer in setup.teacher.arch.layers):
        raise UsageError(f"--teacher {args.teacher}: the methods cut a RoPE model's mhsa "
                         "layers (a Llama-family teacher)")
    store = Store(args.out)
    todo = sum(bool(missing_stages(store, setup, args, s, f, m)) for s in args.seeds
               for f in args.fractions for m in args.methods)
    units = {f: layer_units(setup.teacher.arch, f) for f in args.fractions}
    with harness.runs(args, NAME, todo, "students",
                      start=f"every method at {', '.join(f'{f:.1%}' for f in args.fractions)} "
                            f"of the KV cache ({', '.join(map(str, units.values()))} units "
                            f"per layer), {len(args.seeds)} calibration seed(s)") as bar:
        measure(setup, store, args, bar)
    sources = list(setup.evals)
    summary = summarise(store, args, sources)
    write_csv(args.out / f"{NAME}_summary.csv", summary)
    plot(summary, sources, args.out / f"{NAME}.png")
    return {"summary": summary, "verdicts": verdicts(summary), "out": str(args.out),
            "teacher": str(args.teacher or "llama_compress's, trained here"),
            "seeds": args.seeds}


def plot(summary: list[dict[str, Any]], sources: list[str], path: Path) -> None:
    """Perplexity against the KV cache fraction per method, one panel per source and stage."""
    stages = [s for s in ("cut", "finetuned") if any(x["stage"] == s for x in summary)]
    fig, axes = new_figure(len(sources) * len(stages), (5.5 * len(sources) * len(stages), 4.2))
    axes = list(np.atleast_1d(axes))
    for ax, (stage, source) in zip(axes, [(s, o) for s in stages for o in sources]):
        mine = [x for x in summary if x["stage"] == stage and x["source"] == source
                and not x["below_floor"]]
        for k, method in enumerate(sorted({x["method"] for x in mine})):
            rows = sorted((x for x in mine if x["method"] == method),
                          key=lambda x: x["fraction"])
            ax.plot([x["fraction"] for x in rows], [x["perplexity"] for x in rows], "o-",
                    color=f"C{k}", label=method)
        if mine:
            ax.axhline(mine[0]["teacher_perplexity"], color="k", lw=0.8, ls=":",
                       label="teacher")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("KV cache per token (of the teacher's)")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{source}: {'right after the cut' if stage == 'cut' else 'fine-tuned'}")
        ax.legend(fontsize=7)
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    table = render_table(
        ["KV", "stage", "source", "method", "perplexity", "teacher", "vs best other (95%)"],
        [[f"{s['fraction']:.1%}", s["stage"], s["source"], s["method"],
          BELOW_FLOOR if s["below_floor"] else f"{s['perplexity']:.3f}",
          f"{s['teacher_perplexity']:.3f}",
          f"{s['vs_best_other']:+.4f} [{s['vs_best_other_low']:+.4f}, "
          f"{s['vs_best_other_high']:+.4f}] {s['best_other']}" if s["best_other"] else ""]
         for s in result["summary"]],
        right=[True, False, False, False, True, True, False])
    return "\n".join([f"teacher: {result['teacher']}; calibration seeds "
                      f"{', '.join(map(str, result['seeds']))}", table, *result["verdicts"],
                      f"wrote {result['out']}/{NAME}.csv, {NAME}_windows.csv, "
                      f"{NAME}_summary.csv, {NAME}.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--teacher", type=Path,
                        help="a Llama-family teacher: a transformers folder, a GGUF file or a "
                             "workers.train checkpoint (default: llama_compress's small "
                             "Llama, trained here on the standard library)")
    parser.add_argument("--data", type=Path,
                        help="with --teacher: the calibration and fine-tuning text, as tokens "
                             "of the teacher's vocabulary (a nanoGPT train.bin/val.bin folder)")
    parser.add_argument("--eval", type=Path, nargs="+", default=[],
                        help="with --teacher: held-out token folders, each scored on its "
                             "first --eval-tokens")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help=f"which methods (default: all of {', '.join(METHODS)})")
    parser.add_argument("--fractions", type=number(0, strict=True), nargs="+",
                        default=list(FRACTIONS), help="KV cache sizes, of the teacher's")
    parser.add_argument("--finetune", type=number(0, strict=True), nargs="*",
                        default=[0.25],
                        help="the fractions whose students are fine-tuned (the flag alone: "
                             "none; a later run fine-tunes those it lacks)")
    parser.add_argument("--seeds", type=int_in(0), nargs="+", default=[0, 1],
                        help="calibration seeds: each draws its own sample of --data")
    parser.add_argument("--seq-len", type=int_in(2), help="window (default 512)")
    parser.add_argument("--sample-tokens", type=int_in(1),
                        help="calibration sample per seed (default 16,384)")
    parser.add_argument("--eval-tokens", type=int_in(1),
                        help="tokens scored per held-out source (default 8,192)")
    parser.add_argument("--finetune-steps", type=int_in(0),
                        help="fine-tuning steps of two windows (default 100; 0: none)")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
