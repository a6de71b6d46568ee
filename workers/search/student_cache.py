"""What a student search measures of its teacher, once per study: ``ensure_cache``.

Every trial of a student search builds a student of the same teacher from the same
measurements, so they are made once, in the driver before Ray starts, and kept in a folder
under the search's storage path (``--storage-path``; on a cluster, a path every node shares),
named by a content address: the SHA-256 of the teacher's files, the calibration and held-out
data's files, and the settings that shape the measurement (window, sample sizes, RoPE parts,
seed; RoPE part 0 is the ``latent`` form's). A second search, a ``--resume`` or another worker
with the same inputs finds the folder and measures nothing (``COMPUTED`` counts the
measurements made in this process: tests read it).

The folder holds, per RoPE part, the curvature latent plan with every width priced
(``plan_r{R}.yaml``) and its maps at full rank (``plan_r{R}.factors.safetensors``), the held-out
windows and the teacher's loss on each (``eval.pt``), and ``meta.json`` (the settings, the
teacher's shape, each layer's Fisher information, written last: a folder without it is
incomplete and measured again). A trial's own plan goes to ``students/<allocation>/``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alloc.compression import (
    CompressionPlan,
    MeasureRequest,
    plan_compression,
    plan_for_allocation,
)
from common.progress import say
from search_spaces import Allocation, TeacherShape
from userdata import DataSpec, TaskSpec, open_tokens
from workers.compression import LatentFits
from workers.models import Model

log = logging.getLogger(__name__)
CACHE_FOLDER = "student-cache"
META, EVAL = "meta.json", "eval.pt"
STUDENTS = "students"  # each trial's plan, by its allocation's key
FACTORS = "plan.factors.safetensors"  # a trial's maps, beside its plan.yaml
COMPUTED: Counter[str] = Counter()  # cache keys measured in this process (tests read it)
EVAL_BATCH = 4  # held-out windows a forward takes at once


@dataclass(frozen=True)
class CacheSettings:
    """What shapes a study's measurement of its teacher (with the files, its address)."""

    teacher: Path
    data: DataSpec  # the calibration sample's source (its validation split)
    eval: DataSpec  # the held-out source (its validation split, from the start)
    seq_len: int
    sample_tokens: int
    eval_tokens: int
    rope_dims: tuple[int, ...]  # the RoPE parts (per key/value head) the plans are made at
    seed: int = 0

    def key(self) -> str:
        """The content address: the files' digests and the settings."""
        settings = {**dataclasses.asdict(self), "teacher": files_digest(self.teacher),
                    "data": files_digest(Path(self.data.path)),
                    "eval": files_digest(Path(self.eval.path)),
                    "data_spec": _spec(self.data), "eval_spec": _spec(self.eval)}
        text = json.dumps(settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def _spec(spec: DataSpec) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(spec).items() if k != "path"}


def files_digest(path: Path) -> str:
    """SHA-256 over a file, or over every file of a folder (by relative name and content)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                 and not p.name.startswith("."))
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode())
        with file.open("rb") as handle:
            for block in iter(functools.partial(handle.read, 1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class TeacherCache:
    """A study's measurements of its teacher, read from their folder."""

    folder: Path
    meta: Mapping[str, Any]

    @property
    def rope_dims(self) -> tuple[int, ...]:
        return tuple(int(r) for r in self.meta["rope_dims"])

    @property
    def shape(self) -> TeacherShape:
        s = self.meta["shape"]
        return TeacherShape(tuple(s["kv_heads"]), tuple(s["qk_dims"]), tuple(s["v_dims"]),
                            int(s["d_model"]), int(s["teacher_units"]))

    @property
    def fisher(self) -> list[float]:
        """Each layer's Fisher information, ``tr E[g g^T] tr E[x x^T]`` (Palu's shares)."""
        return [float(v) for v in self.meta["fisher"]]

    def plan(self, rope: int) -> CompressionPlan:
        return _read_plan(str(self.folder / f"plan_r{rope}.yaml"))

    def plans(self) -> dict[int, CompressionPlan]:
        return {r: self.plan(r) for r in self.rope_dims}

    def fits_file(self, rope: int) -> Path:
        return self.folder / f"plan_r{rope}.factors.safetensors"

    def eval_windows(self) -> tuple[Tensor, Tensor]:
        """The held-out windows (W, T + 1) and the teacher's loss on each (W,)."""
        saved = torch.load(self.folder / EVAL, weights_only=True)
        return saved["ids"], saved["losses"]

    def student_folder(self, allocation: Allocation) -> Path:
        return self.folder / STUDENTS / allocation.key()


@functools.lru_cache(maxsize=16)
def _read_plan(path: str) -> CompressionPlan:
    return CompressionPlan.from_yaml(Path(path).read_text())


def open_cache(folder: Path) -> TeacherCache:
    """The measurements in ``folder`` (complete: its ``meta.json`` written)."""
    return TeacherCache(folder, json.loads((folder / META).read_text()))


def ensure_cache(settings: CacheSettings, root: Path, quiet: bool = False) -> TeacherCache:
    """The study's measurements under ``root``: found by their address, else measured now
    (into a temporary folder renamed into place, so that a crash leaves nothing half made)."""
    key = settings.key()
    folder = root.resolve() / CACHE_FOLDER / key
    if (folder / META).is_file():
        say(f"student cache: the teacher's measurements found in {folder}", quiet=quiet)
        return open_cache(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
    try:
        _measure(settings, work, key, quiet)
        if folder.exists():  # an incomplete folder of a run that died
            shutil.rmtree(folder)
        os.replace(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    COMPUTED[key] += 1
    return open_cache(folder)


def _measure(settings: CacheSettings, folder: Path, key: str, quiet: bool) -> None:
    """Measure the teacher into ``folder``: the plans and maps at every RoPE part, the held-out
    windows and the teacher's losses on them, then ``meta.json``."""
    from workers.checkpoints import load
    from workers.compression import measure_latent_family, write_fits

    say(f"student cache: measuring {settings.teacher} once for the study (curvature on "
        f"{settings.sample_tokens:,} tokens of {settings.data.path}, held-out "
        f"{settings.eval_tokens:,} tokens of {settings.eval.path})", quiet=quiet)
    task = TaskSpec(data=settings.data, params={"length": settings.seq_len}, seed=settings.seed)
    request = MeasureRequest(settings.teacher, 2, task, seq_len=settings.seq_len,
                             sample_tokens=settings.sample_tokens, loss_sensitivity=True,
                             form="latent_rope" if any(settings.rope_dims) else "latent",
                             rope_dim=max(settings.rope_dims), quiet=quiet)
    family = measure_latent_family(request, settings.rope_dims, width_align=1)
    for rope in settings.rope_dims:
        plan = plan_compression(family.measured[rope], 1.0, rule="loss")
        name = f"plan_r{rope}"
        write_fits(folder / f"{name}.factors.safetensors", family.fits[rope])
        plan = dataclasses.replace(plan, factors=f"{name}.factors.safetensors")
        (folder / f"{name}.yaml").write_text(plan.to_yaml())
    teacher = load(settings.teacher).model.eval()
    ids = eval_windows(settings.eval, settings.seq_len, settings.eval_tokens)
    losses = window_losses(teacher, ids)
    torch.save({"ids": ids, "losses": torch.from_numpy(losses)}, folder / EVAL)
    arch = teacher.arch
    shape = {"kv_heads": [layer.heads[0].kv_heads for layer in arch.layers],
             "qk_dims": [layer.heads[0].qk_dim for layer in arch.layers],
             "v_dims": [layer.heads[0].v_dim for layer in arch.layers],
             "d_model": arch.d_model, "teacher_units": arch.kv_width}
    fisher = [float(c.grads.trace() * c.inputs.trace()) for c in family.curvature]
    meta = {"key": key, "settings": json.loads(json.dumps(dataclasses.asdict(settings),
                                                          default=str)),
            "rope_dims": list(settings.rope_dims), "shape": shape, "fisher": fisher,
            "teacher_loss": float(losses.mean()), "eval_windows": len(losses)}
    (folder / META).write_text(json.dumps(meta, indent=1))


def eval_windows(spec: DataSpec, seq_len: int, tokens: int, skip: int = 0) -> Tensor:
    """Consecutive windows of ``seq_len + 1`` ids from the held-out source's validation split
    after its first ``skip`` tokens, ``tokens`` in all at most (at least one window).

    Raises:
        DataError: fewer than one window after ``skip``.
    """
    from userdata import DataError

    stream = open_tokens(spec, seq_len + 1).val[skip:]
    if len(stream) < seq_len + 1:
        raise DataError(f"{spec.path}: its validation split has no window of {seq_len + 1} "
                        f"tokens after the first {skip:,}")
    count = max(1, min(tokens // seq_len, (len(stream) - 1) // seq_len))
    ids = torch.from_numpy(np.asarray(stream[:count * seq_len + 1], dtype=np.int64))
    return torch.stack([ids[i * seq_len:(i + 1) * seq_len + 1] for i in range(count)])


@torch.no_grad()
def window_losses(model: Model, ids: torch.Tensor, batch: int = 4) -> np.ndarray:
    """Each window's mean next-token loss in nats (``ids``: (W, T + 1) inputs and targets)."""
    out = []
    device = next(model.parameters()).device
    for chunk in ids.split(batch):
        chunk = chunk.to(device)
        logits = model(chunk[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), chunk[:, 1:],
                                                 reduction="none")
        out.append(loss.double().mean(dim=1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def student_plan(cache: TeacherCache, allocation: Allocation) -> CompressionPlan:
    """The plan of ``allocation``: each layer from the cached plan at its RoPE part, its maps
    in ``FACTORS`` beside it."""
    plan = plan_for_allocation(cache.plans(), allocation.latent_dims, allocation.rope_dims,
                               allocation.kv_cache)
    return dataclasses.replace(plan, factors=FACTORS)


def read_student_fits(cache: TeacherCache, allocation: Allocation) -> LatentFits:
    """Each layer's maps at its allocated width, from the RoPE part's file it was fitted at."""
    from safetensors import safe_open

    fits: dict[int, tuple[Tensor, Tensor]] = {}
    by_rope: dict[int, list[int]] = {}
    for i, rope in enumerate(allocation.rope_dims):
        by_rope.setdefault(rope, []).append(i)
    for rope, layers in by_rope.items():
        with safe_open(str(cache.fits_file(rope)), framework="pt") as handle:
            for i in layers:
                c = allocation.latent_dims[i]
                up = handle.get_tensor(f"layers.{i}.up")[:, :c].contiguous()
                down = handle.get_tensor(f"layers.{i}.down")[:c].contiguous()
                fits[i] = (up, down)
    return fits
