"""``bench.gpu``'s report: the goals read off the parts, the Markdown that fills the "GPU"
section of docs/benchmarks.md (between ``BEGIN`` and ``END``), and the filling itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.cli import render_table
from common.errors import UsageError
from common.files import write_atomic

BEGIN, END = "<!-- bench.gpu: begin -->", "<!-- bench.gpu: end -->"
Rows = list[dict[str, Any]]


def part(report: dict[str, Any], name: str) -> dict[str, Any]:
    """The part ``name`` of a report (empty when it did not run)."""
    return next((p for p in report["parts"] if p["name"] == name), {"rows": [], "notes": []})


def speed(report: dict[str, Any], variant: str, compiled: bool) -> dict[str, Any] | None:
    rows = part(report, "compiled" if compiled else "throughput")["rows"]
    return next((r for r in rows if r["variant"] == variant), None)


def goal_rows(report: dict[str, Any]) -> Rows:
    """The GPU goals with what this run measured (``met`` None: not measured)."""
    goals: Rows = []
    mhsa = speed(report, "mhsa", True)
    mfu = None if mhsa is None else mhsa["mfu"]
    goals.append({"goal": "mhsa MFU with torch.compile >= 40%",
                  "measured": "-" if mfu is None else f"{mfu:.1%}",
                  "met": None if mfu is None else mfu >= 0.40})
    for kind, target in (("mixit", 1.3), ("frozen_qk", 1.2)):
        for compiled in (False, True):
            row = speed(report, kind, compiled)
            ratio = None if row is None else row["vs_mhsa"]
            goals.append({"goal": f"{kind} tokens/s >= {target}x mhsa's "
                                  f"({'compiled' if compiled else 'eager'})",
                          "measured": "-" if ratio is None else f"{ratio:.2f}x",
                          "met": None if ratio is None else ratio >= target})
    parity = part(report, "parity")["rows"]
    worst = max((r["bf16_ratio"] for r in parity), default=None)
    goals.append({"goal": "bf16 logits within bf16 tolerance of transformers' (ratio <= 2)",
                  "measured": "-" if worst is None else f"worst ratio {worst:.2f} "
                                                       f"({len(parity)} models)",
                  "met": None if not parity else all(r["passed"] for r in parity)})
    return goals


def fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub table; a ``|`` in a cell (an architecture's layers) escaped."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    body = ("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows)
    return "\n".join([*lines, *body])


def speed_table(report: dict[str, Any]) -> str:
    variants = [r["variant"] for r in part(report, "throughput")["rows"]] or [
        r["variant"] for r in part(report, "compiled")["rows"]]
    rows = []
    for v in variants:
        eager, comp = speed(report, v, False), speed(report, v, True)
        rows.append([v, *(fmt(None if x is None else x[k], s) for x in (eager, comp)
                          for k, s in (("tokens_per_s", ",.0f"), ("mfu", ".1%"),
                                       ("vs_mhsa", ".2f"))),
                     fmt(None if comp is None else comp["warm_s"], ".1f"),
                     fmt(None if comp is None else comp.get("graphs"), "d")])
    return markdown_table(["variant", "eager tokens/s", "eager MFU", "eager vs mhsa",
                           "compiled tokens/s", "compiled MFU", "compiled vs mhsa",
                           "compile + 2 steps, s", "graphs"], rows)


def checks_table(report: dict[str, Any]) -> str:
    rows = []
    for r in part(report, "checks")["rows"]:
        if "max_rel_diff" in r:
            measured = f"loss {r['final_loss']:.4f} vs {r['reference_loss']:.4f}, max rel " \
                       f"diff {r['max_rel_diff']:.1e} (tolerance {r['tolerance']:g})"
        else:
            measured = f"{r['reports']} reports, held {fmt(r['held_allocated'], ',d')} B " \
                       f"allocated, {fmt(r['held_reserved'], ',d')} B reserved"
        rows.append([r["check"], r["kind"], measured, fmt(r["passed"])])
    for r in part(report, "suite")["rows"]:
        rows.append(["suite: pytest -k " + repr(r["filter"]), r["tests"],
                     f"{r.get('passed', 0)} passed, {r.get('failed', 0)} failed, "
                     f"{r.get('skipped', 0)} skipped", fmt(not r.get("failed"))])
    return markdown_table(["check", "what", "measured", "passed"], rows)


def parity_table(report: dict[str, Any]) -> str:
    return markdown_table(
        ["model", "float32 max diff", "bf16 error, ours", "bf16 error, transformers", "ratio",
         "passed"],
        [[r["model"], f"{r['fp32_max_diff']:.1e}", f"{r['bf16_ours_err']:.2e}",
          f"{r['bf16_theirs_err']:.2e}", f"{r['bf16_ratio']:.2f}", fmt(r["passed"])]
         for r in part(report, "parity")["rows"]])


def decode_table(report: dict[str, Any]) -> str:
    return markdown_table(
        ["model", "prefill s", "decode tokens/s", "vs teacher", "KV cache bytes", "of teacher's"],
        [[r["model"], f"{r['prefill_s']:.3f}", f"{r['decode_tokens_per_s']:,.1f}",
          f"{r['decode_vs_teacher']:.2f}x", f"{r['kv_cache_bytes']:,}",
          f"{r['kv_vs_teacher']:.0%}"] for r in part(report, "decode")["rows"]])


def training_table(report: dict[str, Any]) -> str:
    return markdown_table(
        ["architecture", "layers", "parameters", "val loss", "train loss", "tokens/s"],
        [[r["architecture"], r["describe"], f"{r['params']:,}", fmt(r["val_loss"], ".4f"),
          fmt(r["train_loss"], ".4f"), fmt(r["tokens_per_s"])]
         for r in part(report, "training")["rows"]])


def parts_table(report: dict[str, Any]) -> str:
    return markdown_table(["part", "status", "seconds", "limit s", "notes"],
                          [[p["name"], p["status"], f"{p['seconds']:.1f}", f"{p['limit_s']:.0f}",
                            "; ".join(p["notes"]) or "-"] for p in report["parts"]])


SECTIONS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("throughput", "Training throughput", speed_table), ("checks", "Checks", checks_table),
    ("parity", "bf16 logits parity", parity_table), ("decode", "Decode", decode_table),
    ("training", "Training", training_table))


def markdown(report: dict[str, Any]) -> str:
    """The section's text: command, device, date, the goals, then a table per part."""
    d = report["device"]
    lines = [f"Last run: {report['date']}, {d['name']} (torch {d['torch']}, CUDA "
             f"{d['cuda'] or '-'}, transformers {d['transformers']}, Python {d['python']}), "
             f"{report['wall_s']:.0f} s:", "", f"    {report['command']}", "",
             markdown_table(["goal", "measured", "met"],
                            [[g["goal"], g["measured"], fmt(g["met"])]
                             for g in report["goals"]])]
    for name, title, table in SECTIONS:
        if part(report, name)["rows"] or (name == "checks" and part(report, "suite")["rows"]):
            lines += ["", f"**{title}** ({report['sizes'][name]})", "", table(report)]
    lines += ["", "**Parts**", "", parts_table(report)]
    return "\n".join(lines) + "\n"


def fill_docs_check(path: Path) -> tuple[str, int, int]:
    """``path``'s text and where its section starts and ends.

    Raises:
        UsageError: ``path`` cannot be read or lacks the two markers.
    """
    try:
        doc = path.read_text()
    except OSError as err:
        raise UsageError(f"--docs {str(path)!r}: cannot read it ({err.strerror})") from None
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise UsageError(f"--docs {str(path)!r}: needs the markers {BEGIN} and {END} "
                         "(in that order) around the section bench.gpu fills")
    return doc, start + len(BEGIN), end


def fill_docs(path: Path, text: str) -> None:
    """Replace what lies between ``BEGIN`` and ``END`` in ``path`` by ``text``.

    Raises:
        UsageError: as ``fill_docs_check``.
    """
    doc, start, end = fill_docs_check(path)
    write_atomic(path, doc[:start] + "\n" + text + doc[end:])


def summary(report: dict[str, Any]) -> str:
    """The terminal's table: each part's status and time, then the goals."""
    parts = render_table(["part", "status", "seconds", "limit s"],
                         [[p["name"], p["status"], f"{p['seconds']:.1f}", f"{p['limit_s']:.0f}"]
                          for p in report["parts"]], right=[False, False, True, True])
    goals = render_table(["goal", "measured", "met"],
                         [[g["goal"], g["measured"], fmt(g["met"])] for g in report["goals"]])
    return parts + "\n\n" + goals
