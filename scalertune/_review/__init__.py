"""Reviewing a search: the result, the summary, the pictures, the dashboard's notes.

- ``_result``/``_views``/``_analyze``: :class:`SearchResult`, its views, and :func:`analyze`;
- ``_verdict``/``_document``/``_scaler``: the verdict, the YAML's evidence, the scaler advice;
- ``_describe``: a run's outcome in words;
- ``_summary``: the terminal table;
- ``_plots``: the loss and loss-scale pictures;
- ``_horizon_plot``: the horizon picture (each finalist's branches over float32's);
- ``_dashboard``: the study's note for optuna-dashboard, and ``scalertune dashboard``;
- ``_notes``: each trial's note (its role, its branches, its checkpoint);
- ``_artifacts``: uploading the pictures and finding them again;
- ``_server``: the dashboard's Best Trial as the study's recommended trial.
"""
