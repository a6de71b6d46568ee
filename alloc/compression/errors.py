"""The compression side's error."""

from __future__ import annotations

from common.errors import TransformerAllocError


class CompressionError(TransformerAllocError):
    """A plan that cannot be made or used: no measurer, a broken plan file, a plan for another
    model."""
