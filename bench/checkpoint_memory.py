"""python -m bench.checkpoint_memory [--layers 22] [--smoke-test] [--dir /tmp/bench-llama]

What reading a large Llama-family checkpoint costs in memory. A sharded random checkpoint of
TinyLlama-1.1B's shape (D = 2048, 32 query heads reading 4 key/value heads, SwiGLU 5632, a
32,000-token vocabulary; ``--layers`` sets the depth, 22 = 1.1 B parameters) is written in
float32 shards of 1 GB with an index, then ``workers.checkpoints.load`` reads it in a process of
its own while a thread samples the process's anonymous resident memory (``RssAnon``: the
model's tensors, not the page cache the memory-mapped shards occupy, which the kernel can drop).
Reports the checkpoint's bytes, the loaded model's bytes, the peak, and peak / checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, dump, int_in, render_table

SHARD_BYTES = 1 << 30
TINY_LLAMA = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
              "max_position_embeddings": 2048}
SMOKE = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
         "max_position_embeddings": 256}


def write_checkpoint(folder: Path, shape: dict[str, int], layers: int) -> int:
    """A random Llama folder of ``shape`` and ``layers`` in float32 shards; its bytes."""
    import torch
    from safetensors.torch import save_file

    from workers.checkpoints.llama import llama_arch, stock_pairs

    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "num_hidden_layers": layers, "hidden_act": "silu", "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "dtype": "float32", **shape}
    arch = llama_arch(config)
    with torch.device("meta"):
        from workers.model import build_model

        shapes = {k: tuple(v.shape) for k, v in build_model(arch).state_dict().items()}
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    total = 0

    def flush() -> None:
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    generator = torch.Generator().manual_seed(0)
    for ours, theirs in stock_pairs(arch):
        rows = _rows(arch, ours, len(theirs), shapes[ours][0])
        for name, n in zip(theirs, rows):
            tensor = torch.randn(n, *shapes[ours][1:], generator=generator) * 0.02
            shard[name] = tensor
            total += tensor.numel() * 4
            if sum(t.numel() * 4 for t in shard.values()) >= SHARD_BYTES:
                flush()
    if shard:
        flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return total


def _rows(arch: Any, ours: str, n: int, rows: int) -> list[int]:
    from workers.checkpoints.llama import stock_row_split

    return stock_row_split(arch, ours, n) or [rows]


PROBE = """
import json, sys, threading, time
from pathlib import Path
peak = [0]
def anon():
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon:'):
            return int(line.split()[1]) * 1024
    return 0
def sample(stop):
    while not stop.is_set():
        peak[0] = max(peak[0], anon()); time.sleep(0.005)
import torch
from workers.checkpoints import load
base = anon()
stop = threading.Event(); thread = threading.Thread(target=sample, args=(stop,)); thread.start()
start = time.perf_counter()
loaded = load(Path(sys.argv[1]))
seconds = time.perf_counter() - start
stop.set(); thread.join()
model = sum(t.numel() * t.element_size() for t in loaded.model.state_dict().values())
print(json.dumps({"base": base, "peak": max(peak[0], anon()), "model": model,
                  "seconds": seconds}))
"""


def run(folder: Path, layers: int, smoke: bool) -> dict[str, Any]:
    shape = SMOKE if smoke else TINY_LLAMA
    checkpoint = write_checkpoint(folder, shape, layers)
    out = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True,
                         text=True, check=True)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    grown = probe["peak"] - probe["base"]
    return {"layers": layers, "shards": len(list(folder.glob("*.safetensors"))),
            "checkpoint_bytes": checkpoint, "model_bytes": probe["model"],
            "peak_anon_bytes": grown, "peak_over_checkpoint": grown / checkpoint,
            "load_seconds": probe["seconds"]}


def render(result: dict[str, Any]) -> str:
    rows = [[k, f"{v:,}" if isinstance(v, int) else f"{v:.3g}"] for k, v in result.items()]
    return render_table(["", "value"], rows, right=[False, True])


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.checkpoint_memory", description=__doc__.split("\n\n")[1])
    p.add_argument("--layers", type=int_in(1, 64), default=22)
    p.add_argument("--smoke-test", action="store_true", help="a 2-layer D = 256 checkpoint")
    p.add_argument("--dir", type=Path, default=Path("/tmp/bench-llama"))
    add_format(p)
    args = p.parse_args(argv)
    result = run(args.dir, 2 if args.smoke_test else args.layers, args.smoke_test)
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
