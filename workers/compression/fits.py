"""A plan's fitted latent maps on disk: ``<plan>.factors.safetensors`` beside a latent plan fitted
to second order (docs/theory.md §10.6), written by ``workers.profile`` and read by
``workers.compress``. Per latent layer ``i``: ``layers.{i}.up`` (rows, latent_dim) and
``layers.{i}.down`` (latent_dim, d_model), the rows in the order
``workers.compression.latent_students`` stacks them (every key head's latent part, then every value
row)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from alloc.compression import CompressionError, CompressionPlan
from common.errors import Problem
from common.files import write_atomic
from workers.compression.student_inputs import LatentFits


def write_fits(path: Path, fits: Mapping[int, tuple[Tensor, Tensor]]) -> None:
    """Write ``fits`` (layer -> ``(up, down)``) to ``path`` (atomically)."""
    from safetensors.torch import save

    tensors = {}
    for i, (up, down) in fits.items():
        tensors[f"layers.{i}.up"] = up.float().contiguous()
        tensors[f"layers.{i}.down"] = down.float().contiguous()
    write_atomic(path, save(tensors, metadata={"format": "pt"}))


def read_fits(plan: CompressionPlan, folder: Path) -> LatentFits:
    """The fitted maps of ``plan`` (its ``factors`` file, in ``folder``), checked against its
    latent layers' widths; none for a plan that fitted none.

    Raises:
        CompressionError: the file is missing, unreadable, or not this plan's.
    """
    if plan.latent_fit != "curvature":
        return {}
    path = folder / plan.factors
    if not plan.factors or not path.is_file():
        raise CompressionError.of([Problem(
            "plan", "", f"its latent maps {str(path)!r} are missing; a latent plan fitted to "
            "second order keeps them beside the plan (profile again: python -m workers.profile "
            "--out)", shown="")])
    from safetensors import safe_open

    fits = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for layer in plan.layers:
                if not layer.latent_dim:
                    continue
                up = handle.get_tensor(f"layers.{layer.index}.up")
                down = handle.get_tensor(f"layers.{layer.index}.down")
                if up.shape[1] < layer.latent_dim or down.shape[0] < layer.latent_dim:
                    raise CompressionError(f"{str(path)!r}: layer {layer.index}'s maps are "
                                           f"{up.shape[1]} wide, the plan's latent "
                                           f"{layer.latent_dim}: not this plan's maps")
                fits[layer.index] = (up, down)
    except CompressionError:
        raise
    except Exception as err:  # safetensors raises its own kinds for a broken or foreign file
        raise CompressionError(f"{str(path)!r}: unreadable latent maps ({type(err).__name__}: "
                               f"{str(err).splitlines()[0] if str(err) else ''})") from None
    return fits
