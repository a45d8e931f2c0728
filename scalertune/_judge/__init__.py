"""Judging runs against the float32 reference, and the answer a study supports.

- ``_settings``: :class:`StudySettings`, the study's settings as one record, with the rules of
  the horizon, its phase windows and the tie margin;
- ``_target``: the float32 target and the smoothed loss;
- ``_stored``: what a study holds, checked before it is trusted (damaged evidence);
- ``_reference``: the float32 reference as one typed, versioned record, read and written there
  alone;
- ``_judged``: a run's judged figures (and a phase's verdict) as one typed, versioned record,
  written and read there alone;
- ``_outcome``: a stored run as an :class:`Outcome`;
- ``_view``: :class:`StudyView`, a study read incrementally: each finished trial checked and
  read once, the float32 reference of a seed found;
- ``_rank``: ranking, ties within the timing noise, the order of confirmation and where a
  candidate's confirmation stands;
- ``_phases``: a branch or a run from step 0 judged against float32 in a phase window;
- ``_horizon``: which configs hold for the horizon, the finalists, the seed spread;
- ``_pruned``: the pruned runs counted by kind, and where float16's forward overflowed;
- ``_stopping``: when a run stops (target reached, slower than the best), when sampling stops;
- ``_speedup``: the verdict against float32, with its spread;
- ``_findings``: :class:`Findings`, the evidence and the answer as plain data, and the
  speedup against float32 they support;
- ``_answer``: :func:`judge`, a study judged from its runs alone: the best AMP config,
  float32 at its clip, and the answer on this device (the search asks it what to run next);
- ``_policy``: the judge's own policy numbers (the reference's drop and noise, the study's
  patience, the tie's floor), each with its reason.
"""
