"""The search driver: ``python -m workers.search`` (``cli`` reads the flags, ``driver`` runs the
search) opens the Optuna study, seeds it from the allocator (``seeding``), and runs trials
through Ray Tune (``tune``) with Optuna's sampler inside a Tune searcher (``searcher``);
``options`` is how a search runs, ``protocol`` what the driver and a trial (``workers.trial``)
tell each other. Ray is imported only by ``tune``, once the input is checked."""
