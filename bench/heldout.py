"""python -m bench.heldout --model NAME=PATH [NAME=PATH ...] --eval DIR [DIR ...]

Perplexity of models on held-out token folders, in the windows ``experiments.kv_compress``
scores its students on: the first ``--tokens`` of each folder's ``train.bin`` then
``val.bin``, in consecutive windows of ``--seq-len`` (a window's next tokens included), the
mean next-token loss over the windows. A model is any checkpoint ``workers.checkpoints`` reads
(a ``transformers`` folder, a student folder of ``workers.compress``, a GGUF file, a ``.pt``),
run in float32. How a fine-tuned student compares with its cut and its teacher
(docs/results/kv-pretrained.md, "Distillation after the cut"); the CPU seconds of each model's
scoring are printed with it.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, dump, int_in, render_table


def windows(tokens: Any, length: int, limit: int) -> Any:
    """Consecutive windows of ``length + 1`` ids from the start of ``tokens``, ``limit``
    tokens in all at most (at least one window)."""
    import numpy as np
    import torch

    count = max(1, min(limit // length, (len(tokens) - 1) // length))
    ids = torch.from_numpy(np.asarray(tokens[:count * length + 1], dtype=np.int64))
    return torch.stack([ids[i * length:(i + 1) * length + 1] for i in range(count)])


def perplexity(model: Any, ids: Any, batch: int = 4) -> float:
    """exp of the mean over windows of each window's mean next-token loss."""
    import torch

    losses = []
    with torch.no_grad():
        for chunk in ids.split(batch):
            logits = model(chunk[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:],
                                                     reduction="none")
            losses.append(loss.double().mean(dim=1))
    return math.exp(float(torch.cat(losses).mean()))


def score(models: dict[str, Path], evals: list[Path], seq_len: int, tokens: int
          ) -> list[dict[str, Any]]:
    """One row per model: its perplexity on each held-out folder and the CPU seconds."""
    import numpy as np

    from userdata import DataSpec, open_tokens
    from workers.checkpoints import load

    streams = {}
    for path in evals:
        split = open_tokens(DataSpec(str(path)), seq_len + 1)
        streams[path.name] = windows(np.concatenate([split.train, split.val]), seq_len, tokens)
    rows = []
    for name, path in models.items():
        model = load(path).model.float().eval()
        cpu = time.process_time()
        row: dict[str, Any] = {"model": name, "path": str(path)}
        row |= {source: perplexity(model, ids) for source, ids in streams.items()}
        row["cpu_s"] = time.process_time() - cpu
        rows.append(row)
        print(f"heldout: {name}: " + ", ".join(f"{s} {row[s]:.3f}" for s in streams),
              file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.heldout", description=__doc__.split("\n\n")[1])
    p.add_argument("--model", nargs="+", required=True, metavar="NAME=PATH")
    p.add_argument("--eval", nargs="+", type=Path, required=True, metavar="DIR")
    p.add_argument("--seq-len", type=int_in(2), default=512)
    p.add_argument("--tokens", type=int_in(1), default=8192,
                   help="tokens of each folder scored (default 8192: 16 windows of 512)")
    add_format(p)
    args = p.parse_args(argv)
    models = {}
    for item in args.model:
        name, _, path = item.partition("=")
        models[name if path else Path(name).name] = Path(path or name)
    rows = score(models, args.eval, args.seq_len, args.tokens)
    if args.format != "table":
        print(dump(rows, args.format))
        return 0
    sources = [path.name for path in args.eval]
    print(render_table(["model", *sources, "CPU s"],
                       [[r["model"], *(f"{r[s]:.3f}" for s in sources), f"{r['cpu_s']:.0f}"]
                        for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
