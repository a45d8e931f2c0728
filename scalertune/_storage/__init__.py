"""Optuna storage: opening it, hiding its passwords, recovering dead workers' trials.

- ``_names``: every name a study stores (attribute keys, trial roles);
- ``_open``: storage URLs, SQLite and journal files, heartbeats, one-line errors;
- ``_redact``: passwords hidden in URLs and messages;
- ``_recovery``: failing and retrying trials whose worker died;
- ``_claims``: once-per-study work among several workers;
- ``_optuna``: Optuna's private API, in one place (ids, a running trial's system
  attributes, a trial's curve points many in one write), each part checked by a test.
"""
