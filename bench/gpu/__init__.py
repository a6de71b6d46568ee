"""``python -m bench.gpu``: every CUDA path of the product measured in one command on a lent GPU
machine, within a time limit (``cli``); its parts (``checks``, ``speed``, ``students``,
``training``), their sizes and time limits (``plan``), the report and the docs section it fills
(``report``), the GPU image's package list (``image``, ``image.yaml``), and the optional search
step that carries Ray, Optuna and SQLAlchemy there (``python -m bench.gpu.search``)."""
