"""The public names of ``workers.compression`` (``__init__.py`` loads each on first use, from this
list: the one place they are named)."""

from .compressor import compress as compress
from .curvature import LayerCurvature as LayerCurvature
from .curvature import layer_curvature as layer_curvature
from .fits import write_fits as write_fits
from .heads import head_maps as head_maps
from .latent_measure import (
    DEROTATION_WINDOWS as DEROTATION_WINDOWS,
)
from .latent_measure import (
    curvature_latent as curvature_latent,
)
from .latent_measure import (
    derotation_orders as derotation_orders,
)
from .latent_students import latent_arch as latent_arch
from .latent_students import latent_student as latent_student
from .loss_rule import IGNORE as IGNORE
from .measure import (
    SAMPLE_BATCH as SAMPLE_BATCH,
)
from .measure import (
    measure_for_plan as measure_for_plan,
)
from .measure import (
    measure_layers as measure_layers,
)
from .measure import (
    measure_model as measure_model,
)
from .recording import head_statistics as head_statistics
from .recording import record_attention as record_attention
from .records import (
    EVAL_TOKENS as EVAL_TOKENS,
)
from .records import (
    PROG as PROG,
)
from .records import (
    CompressRequest as CompressRequest,
)
from .records import (
    CompressResult as CompressResult,
)
from .student_inputs import PairOrders as PairOrders
from .students import build_student as build_student
from .students import pair_orders as pair_orders
