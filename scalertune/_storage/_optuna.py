"""Optuna's private API, in one place: what scalertune needs that Optuna does not make public.

No other module of the package names a private part of Optuna; each one used here is
checked against the installed Optuna by ``tests/unit/test_optuna_private.py``, and
``pyproject.toml`` bounds optuna to the releases those tests passed on. What is used:

- a trial's and a study's storage ids (``Trial._trial_id``, ``FrozenTrial._trial_id``,
  ``Study._study_id``) and a study's storage (``Study._storage``): the storage's own
  methods, which are public, take the ids;
- the parameters a queued trial was given: the ``fixed_params`` system attribute that
  ``Study.enqueue_trial`` writes;
- a running trial's handle for a stored trial (``optuna.Trial(study, trial_id)``), which
  optuna-dashboard's notes take;
- the longest study name an RDB storage holds (``_rdb.models.MAX_INDEXED_STRING_LENGTH``);
- many intermediate values of a running trial in one write (:func:`write_points`), on an
  RDB storage through its session and models (``_rdb.storage._create_scoped_session``,
  ``_rdb.models``, the cache's ``_backend`` and the trial's ``_cached_frozen_trial``);
  elsewhere, or where any of those is missing, through ``Trial.report``, one value a call;
- the next waiting trial's id (``Study._pop_waiting_trial_id``), with which the tests take
  a queued trial the way a worker that dies at once would;
- where ``optuna.artifacts.upload_artifact`` records a study's artifacts: study system
  attributes named with ``optuna.artifacts._upload.ARTIFACTS_ATTR_PREFIX``, each the JSON
  text of an ``ArtifactMeta`` (read here as stored, and checked by the caller, where
  ``get_all_artifact_meta`` would fail on the first record that is not one);
- the file a study's storage keeps on this machine (:func:`storage_file`): an RDB storage's
  ``url`` (behind the cache's ``_backend``), a journal storage's ``_backend`` and its file
  backend's ``_file_path``.

Optuna is imported where it is used: the command line imports this module before it needs
Optuna.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The id the storage knows ``trial`` by (not its number, which counts within a study)."""
    return int(trial._trial_id)  # noqa: SLF001


def study_id(study: optuna.Study) -> int:
    """The id the storage knows ``study`` by; optuna-dashboard's URLs use it."""
    return int(study._study_id)  # noqa: SLF001


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` was opened on (behind Optuna's cache, where it has one)."""
    return study._storage  # noqa: SLF001


def storage_file(study: optuna.Study) -> str | None:
    """The SQLite database or journal file ``study`` is kept in, as an absolute path;
    ``None`` for a database server, memory, or a storage of another kind."""
    import optuna

    storage = storage_of(study)
    if isinstance(storage, optuna.storages.JournalStorage):
        path = getattr(storage._backend, "_file_path", None)  # noqa: SLF001
    else:
        storage = getattr(storage, "_backend", storage)  # Optuna's cache over an RDB storage
        path = None
        if isinstance(storage, optuna.storages.RDBStorage):
            from scalertune._storage._open import sqlite_path

            path = sqlite_path(str(storage.url))
    return os.path.abspath(path) if isinstance(path, str) else None


def set_system_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    """Write a system attribute of the running ``trial`` (Optuna 5's ``Trial`` writes only
    user attributes): big or exact figures that the dashboard's tables leave out."""
    trial.storage.set_trial_system_attr(trial_id(trial), key, value)


def fixed_params(trial: optuna.Trial) -> dict[str, Any]:
    """The parameters a queued trial was given (``study.enqueue_trial``)."""
    return trial.storage.get_trial_system_attrs(trial_id(trial)).get("fixed_params") or {}


def trial_handle(study: optuna.Study, trial: FrozenTrial) -> optuna.Trial:
    """A ``Trial`` for the stored ``trial``, as optuna-dashboard's ``save_note`` takes one
    (a finished trial's too: a note is a study attribute, not the trial's)."""
    import optuna

    return optuna.Trial(study, trial_id(trial))


def take_waiting_trial(study: optuna.Study) -> int | None:
    """Take the next waiting (queued) trial the way ``study.ask`` does, and return its id:
    RUNNING from here, with no attribute written yet."""
    found = study._pop_waiting_trial_id()  # noqa: SLF001
    return None if found is None else int(found)


def max_study_name_length() -> int:
    """The longest study name Optuna's RDB storages hold (an indexed string column)."""
    from optuna.storages._rdb.models import MAX_INDEXED_STRING_LENGTH

    return int(MAX_INDEXED_STRING_LENGTH)


def write_points(trial: Any, points: Sequence[tuple[float, int]]) -> None:
    """Store ``(value, step)`` points as intermediate values of the running ``trial``.

    ``trial.report`` writes one value per call, and on an RDB storage each call is a
    transaction of its own: a session, three queries and a commit, 2.3 ms of CPU per point
    on SQLite here. A trial's curve is written from a background thread while it trains, and
    that thread's CPU is the trial's too. On an RDB storage (behind Optuna's cache, which
    reads a running trial's values from the database anyway) the points of one flush go into
    one session that does what the storage's own per-value write does, with the trial's state
    and the steps already written read once for all of them; on any other storage, or an
    Optuna whose RDB storage lacks the parts used, each point goes through ``trial.report``.
    """
    if not points:
        return
    rdb = rdb_backend(trial)
    if rdb is None:
        for value, step in points:
            trial.report(value, step)
        return
    from optuna.storages._rdb.storage import _create_scoped_session

    from scalertune._storage._outage import RERUN, passing_rdb, retrying
    from scalertune._storage._redact import redact

    def write() -> None:
        with _create_scoped_session(rdb.scoped_session, True) as session:
            _add_points(rdb, session, trial_id(trial), points)

    retrying(
        write,
        store=f"storage {redact(rdb.url)}",
        passing=passing_rdb,
        url=rdb.url,
        what_to_do=RERUN,
        refusing=True,
    )
    cached = getattr(trial, "_cached_frozen_trial", None)
    if cached is not None:  # what trial.report keeps, so the trial object reads the same
        cached.intermediate_values.update({step: float(value) for value, step in points})


def _add_points(rdb: Any, session: Any, trial_id: int, points: Sequence[tuple[float, int]]) -> None:
    """What the storage's per-value write does (the trial must be running; a step written
    before is overwritten), with the trial and the steps already written read once."""
    from optuna.storages._rdb import models

    rows = models.TrialIntermediateValueModel
    rdb.check_trial_is_updatable(
        trial_id, models.TrialModel.find_or_raise_by_id(trial_id, session).state
    )
    steps = [step for _, step in points]
    written = {
        row.step: row
        for row in session.query(rows).filter(rows.trial_id == trial_id, rows.step.in_(steps))
    }
    for value, step in points:
        stored, kind = rows.intermediate_value_to_stored_repr(float(value))
        row = written.get(step)
        if row is None:
            row = written[step] = rows(trial_id=trial_id, step=step)
            session.add(row)
        row.intermediate_value, row.intermediate_value_type = stored, kind


def rdb_backend(trial: Any) -> Any:
    """The trial's RDB storage (under Optuna's cache) if it has the parts
    :func:`write_points` uses, else ``None``."""
    storage = getattr(trial, "storage", None)
    backend = getattr(storage, "_backend", storage)
    try:
        from optuna.storages import RDBStorage
        from optuna.storages._rdb import models
        from optuna.storages._rdb import storage as rdb_module
    except ImportError:
        return None
    rows = getattr(models, "TrialIntermediateValueModel", None)
    if (
        isinstance(backend, RDBStorage)
        and hasattr(rdb_module, "_create_scoped_session")
        and hasattr(backend, "check_trial_is_updatable")
        and hasattr(trial, "_trial_id")
        and hasattr(models.TrialModel, "find_or_raise_by_id")
        and hasattr(rows, "intermediate_value_to_stored_repr")
    ):
        return backend
    return None


def artifact_records(study: optuna.Study) -> dict[str, Any]:
    """The study's artifact records as stored: attribute name -> the JSON text that
    ``optuna.artifacts.upload_artifact`` wrote (unchecked: a study is written by others
    too)."""
    from optuna.artifacts._upload import ARTIFACTS_ATTR_PREFIX

    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    return {key: value for key, value in attrs.items() if key.startswith(ARTIFACTS_ATTR_PREFIX)}
