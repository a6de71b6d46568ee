"""Tables of study records, as text: what ``python -m studies`` and the search print of a trial
(no command-line parsing here, so any command can render them)."""

from __future__ import annotations

from common.cli import render_table
from studies.trials import TrialRecord


def allocation_table(t: TrialRecord, metric: str = "value") -> str:
    """A trial's per-layer allocation, headed by its ``metric`` (the study's task metric)."""
    from arch import attention_params

    assert t.arch is not None
    rows = [[i, layer.attention, layer.heads_str, layer.width,
             f"{layer.mlp_ratio:g}" if layer.mlp_ratio else "-",
             f"{attention_params(layer, t.arch.d_model, t.arch.bias).total:,}"]
            for i, layer in enumerate(t.arch.layers)]
    head = (f"trial {t.number}: {metric} {t.value:.6g}{training(t)}, trainable params "
            f"{t.params_trainable or 0:,}, steps {t.steps_reached if t.steps_reached else '-'}")
    table = render_table(["layer", "attention", "heads", "width", "mlp", "attn params"], rows,
                         right=[True, False, False, True, True, True])
    return head + "\n" + table


def training(t: TrialRecord) -> str:
    """The trial's sampled training fields, as they follow its value (``, lr 0.003``): trials
    of one architecture differ by them."""
    return "".join(f", {name} {value:g}" if isinstance(value, float) else f", {name} {value}"
                   for name, value in sorted(t.train.items()))
