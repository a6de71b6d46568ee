"""The public names of ``workers.compression`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from .compressor import compress as compress, read_plan as read_plan
from .curvature import LayerCurvature as LayerCurvature, layer_curvature as layer_curvature
from .distil import Distiller as Distiller, DistilSettings as DistilSettings
from .fits import read_fits as read_fits, write_fits as write_fits
from .heads import head_maps as head_maps
from .latent_measure import (
    DEROTATION_WINDOWS as DEROTATION_WINDOWS,
    curvature_latent as curvature_latent,
    derotation_orders as derotation_orders,
)
from .latent_students import latent_arch as latent_arch, latent_student as latent_student
from .loss_rule import IGNORE as IGNORE
from .measure import (
    SAMPLE_BATCH as SAMPLE_BATCH,
    LatentFamily as LatentFamily,
    measure_for_plan as measure_for_plan,
    measure_latent_family as measure_latent_family,
    measure_layers as measure_layers,
    measure_model as measure_model,
)
from .recording import head_statistics as head_statistics, record_attention as record_attention
from .records import (
    EVAL_TOKENS as EVAL_TOKENS,
    FINETUNE_LOSSES as FINETUNE_LOSSES,
    FINETUNE_PARAMS as FINETUNE_PARAMS,
    PROG as PROG,
    CompressRequest as CompressRequest,
    CompressResult as CompressResult,
)
from .rorope import rorope_spectra as rorope_spectra, rorope_student as rorope_student
from .student_inputs import LatentFits as LatentFits, PairOrders as PairOrders
from .students import build_student as build_student, pair_orders as pair_orders
