"""Claims: how workers sharing one study agree that exactly one of them does a thing.

The float32 reference, the baselines and the confirmation runs happen once per study, however
many workers start at the same moment. Optuna's storages have no compare-and-set, so a claim
is written into the study's system attributes, left to settle for ``CLAIM_SETTLE_S`` and read
back: of two workers that raced, both read the later write, and only its writer goes ahead.
The holder refreshes the claim while it works; a claim left by a dead worker is taken over at
once when that worker was a process on this host, otherwise after ``CLAIM_STALE_S``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import optuna

from scalertune import _interrupt, _policy
from scalertune._storage import _policy as _storage_policy
from scalertune._storage._names import CLAIM_PREFIX
from scalertune._storage._optuna import storage_of, study_id
from scalertune._storage._outage import Outage
from scalertune._storage._recovery import WORKER, worker_gone


def _read(study: optuna.Study, key: str) -> dict | None:
    """The claim on ``key``; a value that is not one (a study's storage is written by others
    too) is no claim, and the next worker takes it over."""
    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    current = attrs.get(CLAIM_PREFIX + key)
    if (
        isinstance(current, dict)
        and isinstance(current.get("by"), str)
        and isinstance(current.get("at"), (int, float))
        and not isinstance(current["at"], bool)
    ):
        return current
    return None


def _write(study: optuna.Study, key: str, value: dict | None) -> None:
    storage_of(study).set_study_system_attr(study_id(study), CLAIM_PREFIX + key, value)


@contextlib.contextmanager
def claim(study: optuna.Study, key: str) -> Iterator[bool]:
    """Yield ``True`` to the one worker that holds ``key`` now, ``False`` to the others.

    A worker that gets ``False`` should wait (:func:`wait_released`) and look again.
    """
    current = _read(study, key)
    if _held(current):
        yield False
        return
    token = f"{WORKER}:{uuid.uuid4().hex[:8]}"
    _write(study, key, {"by": token, "at": time.time()})
    time.sleep(_storage_policy.CLAIM_SETTLE_S)
    current = _read(study, key)
    if current is None or current["by"] != token:
        yield False
        return
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(_storage_policy.CLAIM_REFRESH_S):
            try:
                _write(study, key, {"by": token, "at": time.time()})
            except KeyError:
                return  # the study was removed under the claim
            except Outage:
                return  # the worker's own next storage call says so, and ends it

    thread = threading.Thread(target=refresh, name=f"scalertune-claim-{key}", daemon=True)
    thread.start()
    try:
        yield True
    finally:
        stop.set()
        thread.join()
        # KeyError: the work removed the study (a float32 reference that did not learn)
        with contextlib.suppress(KeyError):
            _write(study, key, None)


def wait_released(study: optuna.Study, key: str) -> None:
    """Block until nobody holds a fresh claim on ``key``."""
    while held(study, key):
        _interrupt.sleep(_policy.POLL_S)


def held(study: optuna.Study, key: str) -> bool:
    """Whether another worker holds a fresh claim on ``key`` now."""
    return _held(_read(study, key))


def _held(current: dict | None) -> bool:
    """Whether a claim is held: refreshed lately, by a worker not known to be gone."""
    return (
        current is not None
        and time.time() - current["at"] < _storage_policy.CLAIM_STALE_S
        and not worker_gone(current["by"])
    )


class Once:
    """Does a piece of once-per-study work in exactly one worker; the others wait for it.

    Work done while holding one claim (the confirmations queue a reference run) needs no
    second claim: nobody else can be doing it.
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self._holding = False

    def __call__(self, key: str, work: Callable[[], None], done: Callable[[], bool]) -> None:
        """Run ``work`` here unless ``done()`` already, or another worker is on it."""
        while not done():
            if self._holding:
                work()
                return
            with claim(self.study, key) as mine:
                if mine:
                    self._holding = True
                    try:
                        work()
                    finally:
                        self._holding = False
                    return
            wait_released(self.study, key)
