"""A grouped-query Llama and its students, as a practitioner makes them: a random
``LlamaForCausalLM`` saved by ``transformers`` in bf16, profiled and compressed by the product's
commands (``workers.profile --checkpoint --rule loss --kv-cache F [--latent]``, then
``workers.compress --out DIR``) into a compact student (half the KV cache) and a latent one (a
quarter). They are made on the CPU in a background thread while the device measures the other
parts; ``parity`` and ``decode`` wait for them.

- ``parity``: logits of our model against ``transformers``' for the teacher (stock Llama code),
  the compact student (stock Llama code, in the padded layout ``save_llama`` writes; and our
  modelling file through ``trust_remote_code``) and the latent student (our modelling file),
  in float32 and in bf16 weights. bf16 is within tolerance when our bf16 logits are no further
  from ``transformers``' float32 ones than twice ``transformers``' own bf16 logits are.
- ``decode``: ``bench.generate_speed``'s prefill seconds, greedy decode tokens/s and KV cache
  bytes of each model through ``transformers``' ``generate``, at a long context.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.checkpoint_memory import token_folder
from bench.gpu.plan import Context, PartResult, Students, TeacherSize, TimeLimit, TimeUp

ROOT = Path(__file__).resolve().parents[2]
# name -> (KV cache fraction, extra workers.profile flags)
STUDENTS = {"compact": ("0.5", ()), "latent": ("0.25", ("--latent",))}
FP32_TOLERANCE = 1e-3  # relative to the largest logit
BF16_FACTOR = 2.0


def make_teacher(size: TeacherSize, folder: Path) -> Path:
    """A random GQA Llama saved in bf16, scaled like a trained one where it matters to parity:
    query and key maps of std ``2 / sqrt(hidden)`` (attention logits of std about 4, so that
    attention is peaked and a RoPE angle off shows), a head of std ``1 / sqrt(hidden)``
    (logits of order 1, not 0.02), norms perturbed (as the suite's Llama tests do)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads, max_position_embeddings=size.positions)
    model: Any = transformers.LlamaForCausalLM(config)  # Any: its stubs type .to() oddly
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
            elif "q_proj" in name or "k_proj" in name:
                p.normal_(std=2 / size.hidden**0.5)
            elif "lm_head" in name:
                p.normal_(std=1 / size.hidden**0.5)
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


class StudentsJob:
    """The teacher and its students, made in a background thread; ``wait`` returns their
    folders (``teacher``, ``compact``, ``latent``)."""

    def __init__(self, ctx: Context) -> None:
        self.size, self.folder = ctx.sizes.teacher, ctx.work / "students"
        self.paths: dict[str, Path] = {}
        self.error: str | None = None
        self.log: list[str] = []
        self.child: subprocess.Popen[str] | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="students", daemon=True)

    def start(self) -> StudentsJob:
        self.thread.start()
        return self

    def wait(self, limit: TimeLimit) -> dict[str, Path]:
        """The folders, once made; ``TimeUp`` when ``limit`` ends first."""
        self.thread.join(max(limit.left(), 0.0))
        if self.thread.is_alive():
            raise TimeUp("the students were not made within the limit "
                              f"({'; '.join(self.log) or 'nothing finished'})")
        if self.error is not None:
            raise RuntimeError(f"making the students failed: {self.error}")
        return self.paths

    def stop(self) -> None:
        """End the command that is running, if any, and start no other (the run is over)."""
        self.stopped = True
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
        self.thread.join(10)

    def _run(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.paths["teacher"] = make_teacher(self.size, self.folder / "teacher")
            tokens = token_folder(self.folder / "tokens", self.size.vocab)
            for name, (fraction, flags) in STUDENTS.items():
                self.paths[name] = self._student(name, tokens, fraction, flags)
        except Exception as err:  # reported by wait(), in the main thread
            self.error = f"{type(err).__name__}: {err}"

    def _student(self, name: str, tokens: Path, fraction: str, flags: tuple[str, ...]) -> Path:
        teacher, plan, out = self.paths["teacher"], self.folder / f"{name}.yaml", \
            self.folder / name
        s = self.size
        for argv in (["-m", "workers.profile", "--checkpoint", str(teacher), "--data",
                      str(tokens), "--seq-len", str(s.seq_len), "--sample-tokens",
                      str(s.sample_tokens), "--rule", "loss", "--align", str(s.align),
                      "--kv-cache", fraction, *flags, "--out", str(plan), "--quiet"],
                     ["-m", "workers.compress", "--checkpoint", str(teacher), "--plan",
                      str(plan), "--out", str(out), "--quiet"]):
            if self.stopped:
                raise RuntimeError("stopped: the run ended first")
            with subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=cpu_env(),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True) as self.child:
                _, err = self.child.communicate()
            if self.child.returncode != 0:
                last = (err.strip().splitlines() or ["(no output)"])[-1]
                raise RuntimeError(f"{argv[1]} for the {name} student: {last}")
            self.log.append(f"{argv[1]} {name}")
        return out


def cpu_env() -> dict[str, str]:
    """The environment of the CPU work beside the device's: all cores but two (the device's
    own process launches its kernels from one)."""
    cores = max(1, (os.cpu_count() or 2) - 2)
    return {**os.environ, "OMP_NUM_THREADS": str(cores)}


def load_theirs(folder: Path, dtype: torch.dtype, device: str, remote: bool = False) -> Any:
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, trust_remote_code=remote)
    return model.to(device).eval()


def load_ours(folder: Path, dtype: torch.dtype, device: str) -> Any:
    """Our model of ``folder``, its parameters in ``dtype`` and its buffers (RoPE's
    frequencies) kept in float32, as ``from_pretrained(dtype=...)`` holds ``transformers``'
    models: cast whole with ``.to(torch.bfloat16)``, either model turns position 1,000 by
    angles off by up to a radian, and its bf16 logits are 6x further from float32."""
    from workers.checkpoints import load

    model = load(folder).model.to(device)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.to(dtype)
    for name, b in buffers.items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, b)
    return model.eval()


@torch.no_grad()
def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return (out if isinstance(out, torch.Tensor) else out.logits).float()


def parity_row(name: str, ours: Path, theirs: Path, remote: bool, ids: torch.Tensor,
               device: str) -> dict[str, Any]:
    """Our model of ``ours`` against ``transformers``' of ``theirs``: float32 and bf16."""
    reference = logits(load_theirs(theirs, torch.float32, device, remote), ids)
    scale = float(reference.abs().max())
    fp32 = float((logits(load_ours(ours, torch.float32, device), ids) - reference).abs().max())
    theirs_bf16 = float((logits(load_theirs(theirs, torch.bfloat16, device, remote), ids)
                         - reference).abs().max())
    ours_bf16 = float((logits(load_ours(ours, torch.bfloat16, device), ids)
                       - reference).abs().max())
    ratio = ours_bf16 / max(theirs_bf16, 1e-12)
    return {"model": name, "tokens": int(ids.numel()), "max_logit": scale,
            "fp32_max_diff": fp32, "bf16_ours_err": ours_bf16, "bf16_theirs_err": theirs_bf16,
            "bf16_ratio": ratio,
            "passed": fp32 <= FP32_TOLERANCE * max(scale, 1.0) and ratio <= BF16_FACTOR}


def stock_compact(paths: dict[str, Path], result: PartResult) -> Path | None:
    """The compact student written in its teacher's stock Llama layout (cut pairs as zeros),
    which ``transformers``' own ``LlamaForCausalLM`` reads; None, with the reason in a line,
    when its plan cut values too (the stock layout holds fewer key dims only)."""
    from workers.checkpoints import CheckpointError, load, save_llama

    folder = paths["compact"].with_name("compact-stock")
    config = json.loads((paths["teacher"] / "config.json").read_text())
    try:
        save_llama(load(paths["compact"]).model, config, folder)
    except CheckpointError as err:
        result.note(f"compact student in the stock Llama layout: not compared ({err})")
        return None
    return folder


def students_of(ctx: Context) -> Students:
    if ctx.students is None:
        raise RuntimeError("the students were not started (bench.gpu starts them for parity "
                           "and decode)")
    return ctx.students


def run_parity(ctx: Context, result: PartResult, limit: TimeLimit,
               say: Callable[[str], None]) -> None:
    paths = students_of(ctx).wait(limit)
    size = ctx.sizes.teacher
    ids = torch.randint(0, size.vocab, (2, ctx.sizes.parity_tokens),
                        generator=torch.Generator().manual_seed(1)).to(ctx.device)
    stock = stock_compact(paths, result)
    cases = [("teacher (stock Llama)", paths["teacher"], paths["teacher"], False),
             ("compact student (stock Llama layout)", paths["compact"], stock, False),
             ("compact student (remote code)", paths["compact"], paths["compact"], True),
             ("latent student (remote code)", paths["latent"], paths["latent"], True)]
    for name, ours, theirs, remote in cases:
        if theirs is None:
            continue
        limit.check(f"parity of the {name}")
        result.rows.append(parity_row(name, ours, theirs, remote, ids, ctx.device))
        say(f"parity: {name}: bf16 ratio {result.rows[-1]['bf16_ratio']:.2f}")
    if not all(r["passed"] for r in result.rows):
        result.status = "failed"


def run_decode(ctx: Context, result: PartResult, limit: TimeLimit,
               say: Callable[[str], None]) -> None:
    """Each model's prefill and greedy decode through ``transformers``' ``generate``: bf16 on
    CUDA, float32 on the CPU."""
    from bench.generate_speed import kv_bytes, timed

    paths = students_of(ctx).wait(limit)
    s = ctx.sizes
    dtype = torch.bfloat16 if ctx.device == "cuda" else torch.float32
    ids = torch.randint(0, s.teacher.vocab, (s.batch, s.context),
                        generator=torch.Generator().manual_seed(0)).to(ctx.device)
    result.note(f"batch {s.batch} x context {s.context}, {s.new_tokens} new tokens, "
                f"{str(dtype).removeprefix('torch.')}, greedy, one run after a short warm-up")
    for name in ("teacher", "compact", "latent"):
        limit.check(f"decoding with the {name}")
        model = load_theirs(paths[name], dtype, ctx.device, remote=name != "teacher")
        model.generation_config.pad_token_id = 0
        timed(model, ids[:, :16], 2)  # kernels, allocator, the remote code's first call
        prefill, rate = timed(model, ids, s.new_tokens)
        result.rows.append({"model": name, "prefill_s": prefill, "decode_tokens_per_s": rate,
                            "kv_cache_bytes": kv_bytes(model, ids)})
        say(f"decode: {name} {result.rows[-1]['decode_tokens_per_s']:,.0f} tokens/s")
        del model
    teacher = result.rows[0]
    for row in result.rows:
        row["decode_vs_teacher"] = row["decode_tokens_per_s"] / teacher["decode_tokens_per_s"]
        row["kv_vs_teacher"] = row["kv_cache_bytes"] / max(teacher["kv_cache_bytes"], 1)
