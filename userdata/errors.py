"""The errors of ``userdata`` (reading the user's data), all under the project's one root
(``common.errors.TransformerAllocError``): each message is one line naming the field, the value
and the rule."""

from __future__ import annotations

from common.errors import TransformerAllocError


class DataError(TransformerAllocError):
    """Data that cannot be used; the message is one line naming the file and the rule."""


class TaskError(TransformerAllocError):
    """Unknown task, size or parameter; the message lists the valid ones."""
