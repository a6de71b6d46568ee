"""Training a model on a task: the trainer behind ``python -m workers.train``, and
the pilot training of ``python -m workers.profile --data``."""
