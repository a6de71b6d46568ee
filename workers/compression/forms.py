"""How each student form of ``alloc.compression.FORMS`` is measured on a sample, one row per
form: the function that finds each candidate's loss increase with one forward of the model per
candidate (the loss rule's forwards), or None where the form is estimated to second order only
(``workers.compression.latent_measure.curvature_latent``, a latent form's ``curvature``
estimate). Building a student follows from its ``LayerSpec``s (the attention kinds' table), so
measuring is the one thing a form adds on the torch side."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import Tensor

from alloc.compression import FormName, LayerMeasurement
from workers.compression.loss_rule import latent_sensitivity, loss_sensitivity
from workers.models.model import Model

# (model, sample ids (B, T), targets (B, T), measured layers, align, input RMS per layer,
# quiet) -> the layers with each candidate's loss increase
Sensitivity = Callable[[Model, Tensor, Tensor, list[LayerMeasurement], int,
                        Mapping[int, Sequence[float]], bool], list[LayerMeasurement]]

SENSITIVITY: Mapping[FormName, Sensitivity | None] = {
    "compact": loss_sensitivity,  # each head group's qk_dim and v_dim, alone cut
    "latent": latent_sensitivity,  # each mhsa layer alone made latent at each width
    "latent_rope": None,  # a decoupled RoPE part is planned to second order only
}
