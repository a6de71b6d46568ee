"""The errors of ``workers`` (the torch side: tasks, checkpoints, students, the search), all under
the project's one root (``common.errors.TransformerAllocError``): each message is one line
naming the field, the value and the rule."""

from __future__ import annotations

from common.errors import TransformerAllocError
from userdata import TaskError  # the task's error: a TaskSpec's too


class CheckpointError(TransformerAllocError):
    """A checkpoint that cannot be read or written; one line naming the file and the rule."""


class ExportError(CheckpointError):
    """A model the ``transformers`` export does not take, or a folder it will not replace."""


class SearchError(TransformerAllocError):
    """A search that cannot start or resume as asked (the study, its task or its space)."""


class SearchFaultError(TransformerAllocError):
    """A search stopped by a fault of the machine it runs on (a full results disk): not the
    user's input (exit code 1); ``--resume`` continues it once the fault is fixed."""


class CalibrationStopped(TransformerAllocError):
    """A calibration whose search stopped before its trainings were done (Ctrl-C, SIGTERM): not
    the user's input (exit code 1); ``--resume`` continues it."""


class FineTuneInterrupted(TransformerAllocError):
    """A student's fine-tune stopped by Ctrl-C, its checkpoint written: not the user's input
    (exit code 1); the same command continues it."""


class WarmStartError(TransformerAllocError):
    """A ``--warm-start`` study that cannot be used."""

__all__ = ["CalibrationStopped", "CheckpointError", "ExportError", "FineTuneInterrupted",
           "SearchError", "SearchFaultError", "TaskError", "WarmStartError"]
