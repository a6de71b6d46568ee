"""What a compression plan hands the builders of its student (``workers.compression.students``,
``workers.compression.latent_students``), besides the student's architecture: each RoPE key/value
head's frequency pairs in rank order, each layer's input RMS, the latent maps the plan fitted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

# (layer, group, key/value head) -> the frequency pairs a RoPE student keeps, in rank order
PairOrders = Mapping[tuple[int, int, int], Sequence[int]]
# layer -> the RMS of each input feature of its attention on the sample (d [+ 1] with biases)
InputScales = Mapping[int, Sequence[float]]
# layer -> its latent maps (up, down) fitted by the plan
# (workers.compression.latent_students.curvature_fit), at least as wide as the student's latent:
# their leading columns of up and rows of down are used
LatentFits = Mapping[int, tuple[Tensor, Tensor]]
