"""Search spaces over the vocabulary (``arch``): ``SearchSpace`` and its suggesters, the YAML
loader and the shipped ``*.yaml`` spaces; imports no torch or Ray. The public names are those
of ``__all__``, imported from here; every module is private to the package (tests/test_layering
checks)."""

from search_spaces.errors import SpaceError
from search_spaces.files import SpaceFile, load_space, shipped_spaces
from search_spaces.loader import parse_space
from search_spaces.schema import SAMPLER_KINDS, SAMPLERS, SamplerTraits
from search_spaces.space import PROBE_IO, SearchSpace
from search_spaces.students import (
    STUDENT_SAMPLERS,
    Allocation,
    StudentSpace,
    TeacherShape,
    fit_allocation,
    is_student_space,
    parse_student_space,
    read_student_space,
    repair,
    shipped_student_spaces,
)
from search_spaces.suggest import FixedSuggester, RandomSuggester, Suggester

__all__ = [
    "PROBE_IO",
    "SAMPLERS",
    "SAMPLER_KINDS",
    "STUDENT_SAMPLERS",
    "Allocation",
    "FixedSuggester",
    "RandomSuggester",
    "SamplerTraits",
    "SearchSpace",
    "SpaceError",
    "SpaceFile",
    "StudentSpace",
    "Suggester",
    "TeacherShape",
    "fit_allocation",
    "is_student_space",
    "load_space",
    "parse_space",
    "parse_student_space",
    "read_student_space",
    "repair",
    "shipped_spaces",
    "shipped_student_spaces",
]
