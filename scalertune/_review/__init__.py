"""Reviewing a search: the result, the summary, the pictures, the dashboard's notes.

- ``_result``: :class:`SearchResult` and :func:`analyze`, recomputed from storage;
- ``_describe``: a run's outcome in words;
- ``_summary``: the terminal table;
- ``_plots``: the loss and loss-scale pictures;
- ``_dashboard``: notes and pictures for optuna-dashboard, and ``scalertune dashboard``.
"""
