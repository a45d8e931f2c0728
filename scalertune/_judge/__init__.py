"""Judging runs against the float32 reference.

- ``_target``: the float32 target and the smoothed loss;
- ``_outcome``: a stored run as an :class:`Outcome`, and the stored references;
- ``_rank``: ranking, ties within the timing noise, the order of confirmation;
- ``_stopping``: when a run stops (target reached, slower than the best), when sampling stops;
- ``_speedup``: the verdict against float32, with its spread.
"""
