"""The search: :func:`scalertune.search`, one worker's part of a study.

- ``_api``: :func:`search`, the pipeline from a factory to a recommendation;
- ``_space``, ``_sampler``: search spaces, and the sampler that keeps to their dtypes;
- ``_study``: the study's settings and the records a search writes;
- ``_references``: the float32 reference of each seed, and the step timing;
- ``_checkpoints``: the float32 reference's checkpoints: where they are saved, resumed from,
  and rebuilt when lost;
- ``_trials``: one trial: sample or take a queued run, reuse a twin, train, store;
- ``_isolate``: where runs execute (their own process with ``--isolate``);
- ``_progress``: the line per run on stderr, or the progress bar.
"""
