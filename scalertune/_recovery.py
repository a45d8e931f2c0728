"""Finding trials whose worker died, failing them, and queueing their config for a retry.

On RDB storage Optuna's heartbeats find them (a trial with no heartbeat for the grace period).
On a journal file, which has no heartbeats, a trial is stale when the process that ran it, on
this host, no longer exists. Either way the trial becomes FAIL and a copy of it (same params,
same role and config) waits for the next free worker, at most ``MAX_RETRIES`` times.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from scalertune import _policy
from scalertune._storage import heartbeat_enabled


def recover(study: optuna.Study, log: Callable[[str], None]) -> None:
    """Fail and requeue every running trial whose worker is gone; say which."""
    storage = study._storage  # noqa: SLF001
    if heartbeat_enabled(storage):
        running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if trial.number in running:
                log(f"trial #{trial.number} stopped sending heartbeats (its worker died): "
                    "marked failed, its config queued for a retry")
    host = socket.gethostname()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker_host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        if worker_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)  # noqa: SLF001
        except UpdateFinishedTrialError:
            continue  # another worker got there first
        RetryHeartbeatStaleTrialCallback(max_retry=_policy.MAX_RETRIES)(
            study, storage.get_trial(trial._trial_id))  # noqa: SLF001
        log(f"trial #{trial.number} was left running by process {pid}, which is gone: "
            "marked failed, its config queued for a retry")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not reaped yet is a zombie: gone all the same
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
