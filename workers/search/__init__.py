"""The search driver: ``python -m workers.search`` (``driver``) opens the Optuna study, seeds it
from the allocator (``seeding``), and runs trials through Ray Tune (``tune``) with Optuna's
sampler inside a Tune searcher (``searcher``); ``protocol`` is what the driver and a trial
(``workers.trial``) tell each other. Ray is imported only by ``tune``, once the input is
checked."""
