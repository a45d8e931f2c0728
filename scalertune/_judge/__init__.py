"""Judging runs against the float32 reference.

- ``_settings``: :class:`StudySettings`, the study's settings as one record, with the rules of
  the horizon, its phase windows and the tie margin;
- ``_target``: the float32 target and the smoothed loss;
- ``_stored``: what a study holds, checked before it is trusted (damaged evidence);
- ``_outcome``: a stored run as an :class:`Outcome`, and the stored references;
- ``_rank``: ranking, ties within the timing noise, the order of confirmation;
- ``_phases``: a branch or a run from step 0 judged against float32 in a phase window;
- ``_horizon``: which configs hold for the horizon, the finalists, the seed spread;
- ``_stopping``: when a run stops (target reached, slower than the best), when sampling stops;
- ``_speedup``: the verdict against float32, with its spread;
- ``_policy``: the judge's own policy numbers (the reference's drop and noise, the study's
  patience, the tie's floor), each with its reason.
"""
