"""The one error of reading and writing checkpoints."""

from common.errors import TransformerAllocError


class CheckpointError(TransformerAllocError):
    """A checkpoint that cannot be read or written; one line naming the file and the rule."""
