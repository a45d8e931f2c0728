"""Optuna storage and the study's artifact store: opening them, riding out their outages, hiding
passwords, recovering dead workers' trials.

- ``_names``: the names a study stores (its attributes, trial roles, a trial's curves);
- ``_trial_record``: what a trial runs and what the search noted of it, as typed records
  (one writer and one reader each);
- ``_open``: storage URLs, SQLite and journal files, heartbeats, one-line errors;
- ``_journal_lock``: a journal file's lock, taken over from a killed worker whatever the
  journal's path;
- ``_outage``: a storage (or artifact store) outage ridden out, up to a bound;
- ``_redact``: passwords hidden in URLs and messages;
- ``_recovery``: failing and retrying trials whose worker died;
- ``_claims``: once-per-study work among several workers;
- ``_store``: the study's artifact store (a folder or an S3 bucket), recorded in the study;
- ``_checkpoints``: checkpoints in that store, each carrying its checksum;
- ``_run_log``: a real run's record (its in-run checks and actions), written to its study
  in the background;
- ``_optuna``: Optuna's private API, in one place (ids, a running trial's system
  attributes, a trial's curve points many in one write), each part checked by a test;
- ``_policy``: storage's own policy numbers (heartbeats, an outage's bound and retries,
  claims, a journal's lock, a cold start), each with its reason.
"""
