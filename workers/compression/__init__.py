"""A trained checkpoint measured and compressed: what its attention uses, what a
cut costs the loss, and the students built from a plan
(``python -m workers.compress``).

The public names are those of ``__all__``, imported from here: each loads its module on first
use (PEP 562), so that ``python -m workers.compress --help`` loads no torch. Every module is
private to the package: outside it, import its names from ``workers.compression``
(tests/test_layering checks). How many windows a batch runs at once is ``workers.chunks``,
below both this package and the trainer it fine-tunes with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.compression.compressor import compress
    from workers.compression.curvature import LayerCurvature, layer_curvature
    from workers.compression.fits import write_fits
    from workers.compression.heads import head_maps
    from workers.compression.latent_measure import (
        DEROTATION_WINDOWS,
        curvature_latent,
        derotation_orders,
    )
    from workers.compression.latent_students import latent_arch, latent_student
    from workers.compression.loss_rule import IGNORE
    from workers.compression.measure import (
        SAMPLE_BATCH,
        measure_for_plan,
        measure_layers,
        measure_model,
    )
    from workers.compression.recording import head_statistics, record_attention
    from workers.compression.records import PROG, CompressRequest, CompressResult
    from workers.compression.student_inputs import PairOrders
    from workers.compression.students import build_student, pair_orders

__all__ = [
    "DEROTATION_WINDOWS",
    "IGNORE",
    "PROG",
    "SAMPLE_BATCH",
    "CompressRequest",
    "CompressResult",
    "LayerCurvature",
    "PairOrders",
    "build_student",
    "compress",
    "curvature_latent",
    "derotation_orders",
    "head_maps",
    "head_statistics",
    "latent_arch",
    "latent_student",
    "layer_curvature",
    "measure_for_plan",
    "measure_layers",
    "measure_model",
    "pair_orders",
    "record_attention",
    "write_fits",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    if name == "compress":
        from workers.compression import compressor as module
    elif name in ("LayerCurvature", "layer_curvature"):
        from workers.compression import curvature as module  # type: ignore[no-redef]
    elif name == "write_fits":
        from workers.compression import fits as module  # type: ignore[no-redef]
    elif name == "head_maps":
        from workers.compression import heads as module  # type: ignore[no-redef]
    elif name in ("DEROTATION_WINDOWS", "curvature_latent", "derotation_orders"):
        from workers.compression import latent_measure as module  # type: ignore[no-redef]
    elif name in ("latent_arch", "latent_student"):
        from workers.compression import latent_students as module  # type: ignore[no-redef]
    elif name == "IGNORE":
        from workers.compression import loss_rule as module  # type: ignore[no-redef]
    elif name in ("SAMPLE_BATCH", "measure_for_plan", "measure_layers", "measure_model"):
        from workers.compression import measure as module  # type: ignore[no-redef]
    elif name in ("head_statistics", "record_attention"):
        from workers.compression import recording as module  # type: ignore[no-redef]
    elif name in ("CompressRequest", "CompressResult", "PROG"):
        from workers.compression import records as module  # type: ignore[no-redef]
    elif name == "PairOrders":
        from workers.compression import student_inputs as module  # type: ignore[no-redef]
    elif name in ("build_student", "pair_orders"):
        from workers.compression import students as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
