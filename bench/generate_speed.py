"""python -m bench.generate_speed --teacher DIR --student [NAME=]DIR ... [--context 2048]

What a compressed student buys at inference: tokens per second of a teacher folder (any
``transformers`` causal LM) and its student (``workers.compress --out DIR``, loaded with
``trust_remote_code``) through ``transformers``' own ``generate``, greedy, with its key/value
cache, from a random prompt of ``--context`` tokens per sequence. Reports the prefill seconds
(the prompt through the model once) and the decode tokens per second (each new token reads the
whole cache: at a long context and a large batch the cache, not the weights, is what each step
reads), median of ``--runs``, and each model's KV cache bytes at the end. On a CUDA device when
there is one (``--device``), else this CPU. ``--smoke-test`` makes a tiny Llama teacher and a
student cut to half its cache, here, and times them briefly.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.checkpoint_memory import token_folder
from common.cli import Parser, add_format, dump, int_in, render_table


def timed(model: Any, ids: Any, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens per second) of one greedy ``generate``, clocked at each
    step inside it: the prefill is the time to the first token's logits, the decode the time
    from there to the last (two separate calls, one of a single token, would leave the decode
    as the small difference of two long prefills, which at a long context on a CPU is noise)."""
    import torch
    import transformers

    def now() -> float:
        if ids.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    class Clock(transformers.LogitsProcessor):
        """Called once per generated token, as its logits are ready."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            self.times.append(now())
            return scores

    clock = Clock()
    with torch.no_grad():
        mask = torch.ones_like(ids)  # unpadded: random ids may hold the pad id
        start = now()
        model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False,
                       logits_processor=transformers.LogitsProcessorList([clock]))
    first, last = clock.times[0], clock.times[-1]
    return first - start, ids.shape[0] * (len(clock.times) - 1) / max(last - first, 1e-9)


def kv_bytes(model: Any, ids: Any) -> int:
    """Bytes of the key/value cache after the prompt."""
    import torch

    with torch.no_grad():
        out = model(ids, use_cache=True)
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache", None)
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if tensor is not None:
                total += tensor.numel() * tensor.element_size()
    return total


def run(teacher: Path, students: dict[str, Path], context: int, batch: int, new_tokens: int,
        runs: int, device: str, dtype: str = "float32") -> dict[str, Any]:
    """Each model's prefill seconds, decode tokens/s (median of ``runs``, the models taking
    turns within each run so that a busy machine slows them alike) and KV cache bytes."""
    import torch
    import transformers

    # typed Any: transformers' stubs type .to() on the class, not on a loaded model
    models: dict[str, Any] = {"teacher": transformers.AutoModelForCausalLM.from_pretrained(
        teacher, dtype=getattr(torch, dtype))}
    for name, folder in students.items():
        models[name] = transformers.AutoModelForCausalLM.from_pretrained(
            folder, trust_remote_code=True, dtype=getattr(torch, dtype))
    vocab = models["teacher"].config.vocab_size
    ids = torch.randint(0, vocab, (batch, context), generator=torch.Generator().manual_seed(0))
    result: dict[str, Any] = {"context": context, "batch": batch, "new_tokens": new_tokens,
                              "device": device, "dtype": dtype,
                              "threads": torch.get_num_threads()}
    prompt = ids.to(device)
    for model in models.values():
        model.to(torch.device(device)).eval()
        model.generation_config.pad_token_id = 0
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    for _ in range(runs):
        for name, model in models.items():
            times[name].append(timed(model, prompt, new_tokens))
    for name, model in models.items():
        result[f"{name}_prefill_s"] = statistics.median(t[0] for t in times[name])
        result[f"{name}_decode_tokens_per_s"] = statistics.median(t[1] for t in times[name])
        result[f"{name}_kv_cache_bytes"] = kv_bytes(model, prompt)
    for name in students:
        result[f"{name}_decode_speedup"] = (result[f"{name}_decode_tokens_per_s"]
                                            / result["teacher_decode_tokens_per_s"])
    return result


def longer_than_positions(teacher: Path, students: dict[str, Path], length: int) -> str | None:
    """Which model cannot hold ``length`` positions (its config's ``max_position_embeddings``),
    read before any weights; None if all can."""
    import transformers

    for name, folder in (("teacher", teacher), *students.items()):
        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
        limit = getattr(config, "max_position_embeddings", None)
        if isinstance(limit, int) and length > limit:
            return f"{length} positions, more than the {name}'s {limit}"
    return None


def smoke_models(folder: Path) -> tuple[Path, Path]:
    """A tiny random Llama and its student at half the KV cache, made here."""
    import torch
    import transformers

    torch.manual_seed(0)
    teacher = folder / "teacher"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    ).save_pretrained(teacher)
    tokens = token_folder(folder / "tokens", 128)
    plan, student = folder / "plan.yaml", folder / "student"
    for argv in (["-m", "workers.profile", "--checkpoint", str(teacher), "--data", str(tokens),
                  "--seq-len", "64", "--sample-tokens", "1024", "--rule", "loss", "--align",
                  "4", "--kv-cache", "0.5", "--out", str(plan), "--quiet"],
                 ["-m", "workers.compress", "--checkpoint", str(teacher), "--plan", str(plan),
                  "--out", str(student), "--quiet"]):
        subprocess.run([sys.executable, *argv], check=True, stdout=subprocess.DEVNULL)
    return teacher, student


def named_students(values: list[str]) -> dict[str, Path]:
    """``--student [NAME=]DIR`` values by name."""
    out = {}
    for k, value in enumerate(values):
        name, _, folder = value.rpartition("=")
        out[name or ("student" if k == 0 else f"student{k + 1}")] = Path(folder)
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.generate_speed", description=__doc__.split("\n\n")[1])
    p.add_argument("--teacher", type=Path)
    p.add_argument("--student", action="append", default=[], metavar="[NAME=]DIR",
                   help="a student folder (repeatable; NAME labels it, default student, "
                        "student2, ...)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the models' weights and cache on the device")
    p.add_argument("--context", type=int_in(1, 1 << 20), default=2048)
    p.add_argument("--batch", type=int_in(1, 4096), default=8)
    p.add_argument("--new-tokens", type=int_in(2, 1 << 16), default=32)
    p.add_argument("--runs", type=int_in(1, 100), default=3)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--smoke-test", action="store_true",
                   help="a tiny Llama and its half-cache student made here; brief timings")
    add_format(p)
    args = p.parse_args(argv)
    if not args.smoke_test and (args.teacher is None or not args.student):
        p.error("--teacher and --student: both needed (or --smoke-test)")
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke_test:
            teacher, student = smoke_models(Path(tmp))
            result = run(teacher, {"student": student}, 64, 2, 4, 1, device)
        else:
            students = named_students(args.student)
            too_long = longer_than_positions(args.teacher, students,
                                             args.context + args.new_tokens)
            if too_long:
                p.error(f"--context {args.context} + --new-tokens {args.new_tokens}: {too_long}")
            result = run(args.teacher, students, args.context, args.batch, args.new_tokens,
                         args.runs, device, args.dtype)
    if args.format == "table":
        print(render_table(["", "value"], [[k, f"{v:.4g}" if isinstance(v, float) else v]
                                           for k, v in result.items()], right=[False, True]))
    else:
        print(dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
