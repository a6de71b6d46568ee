"""The errors of ``search_spaces`` (under the project's one root, ``common.errors``)."""

from __future__ import annotations

from common.errors import TransformerAllocError


class SpaceError(TransformerAllocError):
    """An invalid search space, or an architecture outside one; the message names the file,
    the key and the rule."""
