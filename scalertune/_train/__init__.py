"""The result file into training code, and the run's record into its study.

- ``_entry``: :func:`~scalertune._train._entry.load` and
  :func:`~scalertune._train._entry.attach`, which ``scalertune`` exports.
"""
