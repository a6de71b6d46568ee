"""Search spaces over the vocabulary (``arch``): ``SearchSpace`` and its suggesters, the YAML
loader and the shipped ``*.yaml`` spaces; imports no torch or Ray."""

from search_spaces.loader import load_space, parse_space, shipped_spaces
from search_spaces.space import (
    FixedSuggester,
    RandomSuggester,
    SearchSpace,
    SpaceError,
    Suggester,
)

__all__ = [
    "FixedSuggester",
    "RandomSuggester",
    "SearchSpace",
    "SpaceError",
    "Suggester",
    "load_space",
    "parse_space",
    "shipped_spaces",
]
