"""The embedded world: a generator of fully annotated scenes (``generator``: ``build_world`` writes shards, probe
CSVs and annotations; ``ensure_world`` builds a run's world once), its rendering (``render``), and its files in
every released layout negft reads (``formats``: the benchmarks a world build writes, and small examples of the
released training-data files the converters read). Captions come from ``negft.phrasings``. Neither the loader
(``negft.data``), the converters (``negft.convert``) nor the probes import this package: they read what it
writes.
"""

from negft.world import methods  # noqa: E402,F401  (registers the baselines' splits with the generator)
