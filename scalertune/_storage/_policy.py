"""Storage's policy numbers, each with the reason for its value: the heartbeat of a running
trial, how long an outage is ridden out, the timing of claims, and a cold start's race.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: RDB storages (SQLite, PostgreSQL, MySQL) record a heartbeat for every running trial this
#: often (seconds). A trial whose heartbeat is older than ``HEARTBEAT_GRACE_S`` belongs to a
#: worker that died: it is marked failed and its config retried. The grace is three beats, so
#: one slow database write does not fail a healthy trial.
HEARTBEAT_INTERVAL_S = 5
HEARTBEAT_GRACE_S = 15

#: A storage (or artifact store) that fails in a way that passes (a restart, a failover, a
#: dropped connection) is retried for up to ``STORAGE_OUTAGE_S``, the wait between tries
#: doubling from ``STORAGE_RETRY_FIRST_S`` to ``STORAGE_RETRY_MAX_S``. A PostgreSQL restart
#: (``pg_ctl restart -m fast``) is gone in seconds; a managed database's failover takes one to
#: two minutes (60-120 s, as AWS documents for RDS Multi-AZ). Past two minutes the outage is
#: not a blip and needs a person: the worker ends, nothing lost, and a rerun resumes. The
#: first wait is short because most outages here are a dropped connection, made again at once;
#: 8 s between tries keeps a waiting fleet of workers from hammering a server coming back.
STORAGE_OUTAGE_S = 120.0
STORAGE_RETRY_FIRST_S = 0.5
STORAGE_RETRY_MAX_S = 8.0

#: Workers coordinate the once-per-study runs (the float32 reference, the baselines, the
#: confirmations) with a claim in the study: write it, wait this long, read it back. Writes take
#: milliseconds, so two workers racing for a claim both read the later one after the wait.
CLAIM_SETTLE_S = 0.25

#: A claim holder refreshes its claim this often while it works; a claim not refreshed for
#: ``CLAIM_STALE_S`` belongs to a worker that died, and another worker takes it over.
CLAIM_REFRESH_S = 5
CLAIM_STALE_S = 30

#: A journal file's lock is held for one append (milliseconds; seconds on a loaded host or a
#: network file system). One left unchanged this long belongs to a worker killed as it
#: appended, and the next worker takes it over: Optuna's own grace period for it.
JOURNAL_LOCK_GRACE_S = 30

#: Workers that start at once on a new RDB storage race to create its tables; the losers
#: open it again until the winner has made them. Creating Optuna's tables takes well under a
#: second, even on a loaded host; past this, the error is real and is reported.
COLD_START_S = 10
