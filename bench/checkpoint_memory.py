"""python -m bench.checkpoint_memory [--shape llama-8b] [--layers 4] [--dtype bfloat16]

What reading, profiling and compressing a large Llama-family checkpoint cost in memory and time.
A sharded random checkpoint is written in ``--dtype`` shards of 1 GB with an index, of one of
four shapes (``--layers`` sets the depth): ``tinyllama`` (TinyLlama-1.1B: D = 2048, 32 query
heads reading 4 key/value heads, SwiGLU 5632), ``llama-8b`` (Llama-3-8B / Mistral-7B: D = 4096,
32 heads reading 8, head dim 128, SwiGLU 14336), ``llama-300m`` (D = 1024, 16 heads reading 4,
SwiGLU 2816: 311 MB at 8 layers in bf16), each with a 32,000-token vocabulary, or the smoke
shape. Then, each in a process of its own while the parent samples the child's resident
memory every 20 ms (``RssAnon``: its own tensors, not the page cache the memory-mapped shards
occupy, which the kernel can drop; and the kernel's ``VmHWM``, everything resident):

- ``load``: ``workers.checkpoints.load``, the whole model as float32;
- ``profile``: ``python -m workers.profile --checkpoint`` on a sample of random tokens (streamed
  one decoder layer at a time);
- ``compress``: ``python -m workers.compress`` of that plan into a compact student folder.

Reports per stage the peaks, what the work adds to a bare interpreter's (torch and our modules
imported) RssAnon over one layer's float32 bytes, and seconds (per layer for profile and
compress).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, dump, int_in, render_table

SHARD_BYTES = 1 << 30
TINY_LLAMA = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
              "max_position_embeddings": 2048}
LLAMA_8B = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 4096}
# a small Llama a user holds: 8 layers of it in bf16 are 311 MB on disk
LLAMA_300M = {"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
              "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
              "max_position_embeddings": 2048}
SMOKE = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
         "max_position_embeddings": 256}


SHAPES = {"tinyllama": TINY_LLAMA, "llama-8b": LLAMA_8B, "llama-300m": LLAMA_300M,
          "smoke": SMOKE}


def write_checkpoint(folder: Path, shape: dict[str, int], layers: int,
                     dtype: str = "float32") -> int:
    """A random Llama folder of ``shape`` and ``layers`` in ``dtype`` shards; its bytes."""
    import torch
    from safetensors.torch import save_file

    from workers.checkpoints import llama_arch, stock_pairs

    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "num_hidden_layers": layers, "hidden_act": "silu", "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "dtype": dtype, **shape}
    arch = llama_arch(config)
    with torch.device("meta"):
        from workers.models import build_model

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
            tensor = (torch.randn(n, *shapes[ours][1:], generator=generator) * 0.02).to(
                getattr(torch, dtype))
            shard[name] = tensor
            total += tensor.numel() * tensor.element_size()
            if sum(t.numel() * t.element_size() for t in shard.values()) >= SHARD_BYTES:
                flush()
    if shard:
        flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return total


def _rows(arch: Any, ours: str, n: int, rows: int) -> list[int]:
    from workers.checkpoints import stock_row_split

    return stock_row_split(arch, ours, n) or [rows]


LOAD = """
import sys
from pathlib import Path
from workers.checkpoints import load
load(Path(sys.argv[1]))
"""


def _status(pid: int) -> dict[str, int]:
    """RssAnon and VmHWM of process ``pid``, in bytes (empty once it has ended)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines)
            if k in ("RssAnon", "VmHWM")}


def measured(argv: list[str]) -> dict[str, float]:
    """Run ``argv`` (a Python command) in its own process: its seconds and its peak RssAnon
    and VmHWM, sampled every 20 ms."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    peak = {"RssAnon": 0, "VmHWM": 0}

    def sample() -> None:
        while child.poll() is None:
            for key, value in _status(child.pid).items():
                peak[key] = max(peak[key], value)
            time.sleep(0.02)

    thread = threading.Thread(target=sample)
    thread.start()
    _, err = child.communicate()
    thread.join()
    if child.returncode:
        raise SystemExit(f"bench.checkpoint_memory: {' '.join(argv[:3])} failed: "
                         f"{err.strip().splitlines()[-1] if err.strip() else child.returncode}")
    return {"seconds": time.perf_counter() - start, "peak_anon": peak["RssAnon"],
            "peak_hwm": peak["VmHWM"]}


def token_folder(folder: Path, vocab: int) -> Path:
    """nanoGPT-style ``train.bin`` / ``val.bin`` of random tokens below ``vocab``."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, vocab, 400_000, dtype=np.uint16)
    tokens[:300_000].tofile(folder / "train.bin")
    tokens[300_000:].tofile(folder / "val.bin")
    return folder


def layer_bytes(shape: dict[str, int]) -> int:
    """One decoder layer's float32 bytes."""
    d, heads, kv, hd = (shape[k] for k in ("hidden_size", "num_attention_heads",
                                           "num_key_value_heads", "head_dim"))
    return 4 * (d * hd * (2 * heads + 2 * kv) + 3 * d * shape["intermediate_size"] + 2 * d)


def run(folder: Path, shape_name: str, layers: int, dtype: str, sample_tokens: int,
        seq_len: int) -> dict[str, Any]:
    shape = SHAPES[shape_name]
    checkpoint = write_checkpoint(folder / "model", shape, layers, dtype)
    tokens = token_folder(folder / "tokens", shape["vocab_size"])
    one = layer_bytes(shape)
    result: dict[str, Any] = {"shape": shape_name, "layers": layers, "dtype": dtype,
                              "checkpoint_bytes": checkpoint, "layer_float32_bytes": one,
                              "sample_tokens": sample_tokens, "seq_len": seq_len}
    model, plan = str(folder / "model"), str(folder / "plan.yaml")
    data = ["--data", str(tokens), "--seq-len", str(seq_len)]
    # the interpreter with torch and our modules imported: what every stage holds before work
    base = measured(["-c", "import torch, workers.compression.compressor, "
                     "workers.compression.measure, workers.profile"])
    result["baseline_anon_bytes"] = base["peak_anon"]
    stages = {
        "load": ["-c", LOAD, model],
        "profile": ["-m", "workers.profile", "--checkpoint", model, *data, "--sample-tokens",
                    str(sample_tokens), "--kv-cache", "0.75", "--out", plan, "--quiet"],
        "compress": ["-m", "workers.compress", "--checkpoint", model, "--plan", plan,
                     "--out", str(folder / "student"), "--force", "--quiet"]}
    for stage, argv in stages.items():
        got = measured(argv)
        result[f"{stage}_peak_anon_bytes"] = got["peak_anon"]
        result[f"{stage}_peak_hwm_bytes"] = got["peak_hwm"]
        result[f"{stage}_work_over_layer"] = (got["peak_anon"] - base["peak_anon"]) / one
        result[f"{stage}_seconds"] = got["seconds"]
        if stage != "load":
            result[f"{stage}_seconds_per_layer"] = got["seconds"] / layers
    return result


def render(result: dict[str, Any]) -> str:
    rows = [[k, f"{v:,}" if isinstance(v, int) else f"{v:.3g}" if isinstance(v, float) else v]
            for k, v in result.items()]
    return render_table(["", "value"], rows, right=[False, True])


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.checkpoint_memory", description=__doc__.split("\n\n")[1])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    p.add_argument("--layers", type=int_in(1, 64), default=4)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--sample-tokens", type=int_in(1), default=8192,
                   help="the profile's sample (random tokens)")
    p.add_argument("--seq-len", type=int_in(1), default=1024, help="the sample's window")
    p.add_argument("--smoke-test", action="store_true",
                   help="a 2-layer D = 256 checkpoint, 1,024 sample tokens of 64")
    p.add_argument("--dir", type=Path, default=Path("/tmp/bench-llama"))
    add_format(p)
    args = p.parse_args(argv)
    if args.smoke_test:
        result = run(args.dir, "smoke", 2, args.dtype, 1024, 64)
    else:
        result = run(args.dir, args.shape, args.layers, args.dtype, args.sample_tokens,
                     args.seq_len)
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
