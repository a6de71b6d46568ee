"""Training a model on a task: the trainer behind ``python -m workers.train`` (the pilot of
``python -m workers.profile --data`` trains with it, ``workers.pilot``). The public names are
those of ``__all__``, imported from here by the top floor (``experiments/``, ``bench/``)."""

from workers.training.trainer import (
    Trainer,
    TrainResult,
    describe_run,
    evaluate,
    run_with_progress,
    train,
)

__all__ = ["TrainResult", "Trainer", "describe_run", "evaluate", "run_with_progress", "train"]
