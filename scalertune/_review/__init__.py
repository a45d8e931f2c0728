"""Reviewing a search: what it found, and the ways to show it.

- ``_findings``: :class:`Findings`, the evidence and the answer as plain data, and the
  speedup against float32 they support;
- ``_analyze``: :func:`analyze`, a search's result rebuilt from the study alone;
- ``_result``: :class:`SearchResult`, the findings with the ways to show and use them;
- ``_describe``: runs, their evidence over the horizon, a forward overflow and the forecast,
  in words;
- ``_verdict``: the answer against float32 on this device, in one paragraph;
- ``_scaler_advice``: what GradScaler will do over the horizon, as the replay tells it;
- ``_document``: the result YAML's content (``config``, ``guard``, ``evidence``);
- ``_summary``: the terminal table;
- ``_runs``: the real runs that loaded the answer and checked themselves, as the study keeps
  them;
- ``_plots``, ``_horizon_plot``, ``_pictures``: a run's loss and scale, the horizon's
  picture, and the pictures written beside the YAML;
- ``_artifacts``: the pictures as study artifacts, uploaded once, found again;
- ``_notes``, ``_dashboard``: each trial's note and the study's, and ``scalertune
  dashboard``;
- ``_server``: the dashboard's Best Trial as the study's recommended trial;
- ``_policy``: the review's own policy number (the guard's margin), with its reason.
"""
