"""Finding trials whose worker died, failing them, and queueing their run again.

A trial belongs to the worker that runs it: the first thing a worker does with a trial it
takes (a fresh one, or one from the queue) is to write its own ``host:pid`` into the trial's
``worker`` attribute (:func:`take`). A RUNNING trial is stale when

- its worker is a process on this host that no longer exists (any storage; seen at once);
- on RDB storage, Optuna's heartbeat for it is older than ``HEARTBEAT_GRACE_S`` (any host);
- it has had no worker for ``HEARTBEAT_GRACE_S``, as this process watched it: its worker died
  between taking it and naming itself, before Optuna's heartbeat for it began.

A stale trial becomes FAIL, and a copy that says what to run (same params, same role, config
and seed) but not who ran it waits for the next free worker, at most ``MAX_RETRIES`` times.
Several workers may recover at once: the storage lets exactly one of them fail the trial, and
only that one queues the copy. A copy carries no ``worker`` until a worker takes it, so
nobody can mistake it, while it runs, for the dead worker's trial.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._storage import _policy as _storage_policy
from scalertune._storage._names import ROLE_SURPLUS
from scalertune._storage._open import heartbeat_enabled
from scalertune._storage._optuna import storage_of, study_id, trial_id
from scalertune._storage._trial_record import JOB_ATTRS, RETRY_ATTRS, Marks, Retry, role_of

#: Optuna's bookkeeping of retries and of enqueued parameters, which a copy keeps.
_JOB_SYSTEM_ATTRS = (*RETRY_ATTRS, "fixed_params")

_HOST = socket.gethostname()
#: ``host:pid`` of this process, recorded on every trial it runs.
WORKER = f"{_HOST}:{os.getpid()}"
#: (study id, trial id) -> when this process first saw that RUNNING trial without a worker.
_unowned: dict[tuple[int, int], float] = {}
#: (study id, trial id) of the trial this process is running, per study.
_current: dict[int, int] = {}


def take(trial: optuna.Trial) -> None:
    """Name this process as the worker of ``trial``: the first write to any trial it runs."""
    Marks(worker=WORKER).write(trial)
    _current[study_id(trial.study)] = trial_id(trial)


def retry(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Queue a copy of the failed ``trial`` (same params and job), unless it has been
    retried ``MAX_RETRIES`` times already, or it names no run (a surplus trial, left
    running by a worker that died before failing it); whether it was. Also Optuna's
    heartbeat callback on RDB storage."""
    if role_of(trial) == ROLE_SURPLUS:
        return False
    chain = Retry.sound(trial)
    history = (*chain.retry_history, trial.number)
    if len(history) > _policy.MAX_RETRIES:
        return False
    system_attrs = {k: v for k, v in trial.system_attrs.items() if k in _JOB_SYSTEM_ATTRS}
    system_attrs.update(Retry(chain.first(trial.number), history).attrs())
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k in JOB_ATTRS},
            system_attrs=system_attrs,
        )
    )
    return True


def recover(study: optuna.Study, log: Callable[[str], None]) -> None:
    """Fail and requeue every running trial whose worker is gone; say which."""
    storage = storage_of(study)
    if heartbeat_enabled(storage):
        was_running = {
            t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        }
        optuna.storages.fail_stale_trials(study)  # calls retry() for each trial it fails
        for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if trial.number in was_running:
                log(
                    f"trial #{trial.number} stopped sending heartbeats (its worker died): "
                    "marked failed, its run queued again"
                )
    now = time.monotonic()
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    seen = {(study_id(study), trial_id(t)) for t in running}
    for key in [k for k in _unowned if k[0] == study_id(study) and k not in seen]:
        del _unowned[key]
    for trial in running:
        worker = Marks.sound(trial).worker
        if worker is None:
            first = _unowned.setdefault((study_id(study), trial_id(trial)), now)
            if now - first < _storage_policy.HEARTBEAT_GRACE_S:
                continue
            why = f"trial #{trial.number} was taken by a worker that died before naming itself"
        elif worker_gone(worker):
            why = (
                f"trial #{trial.number} was left running by process "
                f"{worker.rpartition(':')[2]}, which is gone"
            )
        else:
            continue
        if _fail(storage, trial):
            queued = retry(study, storage.get_trial(trial_id(trial)))
            log(f"{why}: marked failed{', its run queued again' if queued else ''}")


def _fail(storage: Any, trial: FrozenTrial) -> bool:
    """Fail ``trial``; ``False`` when another worker finished or failed it first."""
    try:
        return bool(storage.set_trial_state_values(trial_id(trial), state=TrialState.FAIL))
    except UpdateFinishedTrialError:
        return False


def worker_gone(worker: str) -> bool:
    """Whether ``host:pid`` (optionally followed by ``:anything``) names a process on this host
    that no longer exists. A process on another host is never judged from here."""
    host, _, rest = worker.partition(":")
    pid = rest.partition(":")[0]
    return host == _HOST and pid.isdigit() and not _alive(int(pid))


@contextlib.contextmanager
def survive_lost_trial(study: optuna.Study, log: Callable[[str], None]) -> Iterator[None]:
    """Let this worker carry on when another one failed its running trial for dead.

    That happens only when this process stalled for longer than the heartbeat grace period
    (a suspended host, a swapping machine): the other worker queued the trial's run again,
    and Optuna refuses this worker's next write to the trial. The queued copy runs it.
    """
    try:
        yield
    except (UpdateFinishedTrialError, ValueError) as exc:
        # Optuna's words when the trial it is asked to finish is finished already.
        refused = isinstance(exc, UpdateFinishedTrialError) or str(exc).startswith("Cannot tell a ")
        running = _current.get(study_id(study))
        if not refused or running is None:
            raise
        trial = storage_of(study).get_trial(running)
        if trial.state != TrialState.FAIL or Marks.sound(trial).error is not None:
            raise
        log(
            f"trial #{trial.number} was failed by another worker, which took this one for "
            "dead (it stalled past the heartbeat grace period): its queued copy runs it"
        )
    finally:
        _current.pop(study_id(study), None)


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


def missing_of(trials: list[FrozenTrial]) -> dict[int, str]:
    """The runs whose evidence is missing: trial number (the first of its retries) -> why,
    for each run that failed without an error of its own for want of evidence (``missing``)
    and has no retry finished, queued or running."""
    chains: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        chains.setdefault(Retry.sound(t).first(t.number), []).append(t)
    out = {}
    for first, chain in chains.items():
        if any(t.state != TrialState.FAIL for t in chain):
            continue
        why = [m for t in chain if (m := Marks.sound(t).missing) is not None]
        if why:
            out[first] = why[-1]
    return out
