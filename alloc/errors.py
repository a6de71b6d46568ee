"""The errors of ``alloc`` (the allocator, profiles and compression planning), all under the
project's one root (``common.errors.TransformerAllocError``): each message is one line naming
the field, the value and the rule."""

from __future__ import annotations

from common.errors import TransformerAllocError


class CalibrationError(TransformerAllocError):
    """A study that cannot calibrate the bound's constants."""


class CompressionError(TransformerAllocError):
    """A plan that cannot be made or used: no measurer, a broken plan file, a plan for another
    model."""


class ConstantsError(TransformerAllocError):
    """A constants file that cannot be used; the message is one line naming the key and rule."""


class PilotError(TransformerAllocError):
    """A pilot that cannot run: an unknown task, or a model the data cannot train."""


class PlanError(TransformerAllocError):
    """Allocator inputs that break a rule, or a request the plan cannot meet (key/value heads
    its head groups cannot share)."""


class ProfileError(TransformerAllocError):
    """A profile file that cannot be used."""
