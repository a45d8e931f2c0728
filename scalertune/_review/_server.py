"""The optuna-dashboard server of ``scalertune dashboard``: Optuna's storage, with the
recommendation as each scalertune study's Best Trial, and one artifact store over the studies'
stores (what optuna-dashboard's own ``--artifact-dir`` would be for one folder).

optuna-dashboard 0.21 shows as a single-objective study's Best Trial what
``storage.get_best_trial(study_id)`` returns: Optuna's choice, the trial of least value. For a
scalertune study that may be a run faster to the early target that fell behind later in the
horizon, or one not confirmed on the other seeds. The answer is the study's latest
``recommended`` trial (added last, once the runs it rests on finished); the server's storage
answers that one question so, and everything else as Optuna does.
"""

from __future__ import annotations

import json
import os
import types
from typing import IO, Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from scalertune._review._artifacts import ArtifactStores
from scalertune._storage._names import ROLE_RECOMMENDED, SETTINGS_ATTR
from scalertune._storage._optuna import storage_of
from scalertune._storage._store import is_bucket
from scalertune._storage._trial_record import role_of


def recommended_best(storage: BaseStorage) -> BaseStorage:
    """``storage`` itself, its ``get_best_trial`` answering a scalertune study's latest
    ``recommended`` trial (Optuna's own answer for other studies, and for a scalertune study
    before its recommendation is stored)."""
    optunas = storage.get_best_trial

    def get_best_trial(self: BaseStorage, study_id: int) -> FrozenTrial:
        found = latest_recommended(self, study_id)
        return found if found is not None else optunas(study_id)

    # On the object, not a subclass: the storage the studies were opened with (RDB, journal,
    # Optuna's cache in front of either) keeps its class, connections and cache.
    storage.get_best_trial = types.MethodType(get_best_trial, storage)  # type: ignore[method-assign]
    return storage


def latest_recommended(storage: BaseStorage, study_id: int) -> FrozenTrial | None:
    """The scalertune study's ``recommended`` trial of highest number, or ``None``."""
    if SETTINGS_ATTR not in storage.get_study_user_attrs(study_id):
        return None
    trials = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
    recommended = [t for t in trials if role_of(t) == ROLE_RECOMMENDED]
    return max(recommended, key=lambda t: t.number, default=None)


def run(
    studies: list[optuna.Study],
    *,
    host: str,
    port: int,
    locations: list[str],
    writable: bool = False,
) -> None:
    """Serve the storage of ``studies`` (every study it holds) until interrupted, with their
    artifact stores (folders that exist, and buckets) as the dashboard's one store; read-only
    (:func:`read_only`) unless ``writable``. Served as optuna-dashboard's ``run_server``
    serves it: its WSGI app under bottle's ``run``."""
    from bottle import run as serve
    from optuna_dashboard import wsgi

    store = Served([p for p in locations if is_bucket(p) or os.path.isdir(p)])
    storage: Any = storage_of(studies[0])
    app = wsgi(recommended_best(storage), artifact_store=store if store.locations else None)
    serve(app if writable else read_only(app), host=host, port=port)


#: What a read-only dashboard answers a request that would change the study: in the body's
#: ``reason``, which optuna-dashboard's page shows.
READ_ONLY = (
    "this dashboard is read-only: scalertune dashboard --allow-writes lets whoever reaches it "
    "change notes and delete studies"
)


def read_only(app: Any) -> Any:
    """``app`` answering only requests that read (GET, HEAD, OPTIONS): optuna-dashboard has
    no login, and its API lets whoever reaches it rewrite notes, tell trials and delete a
    study (HTTP DELETE on ``/api/studies/ID``); any other method is refused, 403."""
    body = json.dumps({"reason": READ_ONLY}).encode()

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD", "GET").upper() in ("GET", "HEAD", "OPTIONS"):
            return app(environ, start_response)
        start_response(
            "403 Forbidden",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return guarded


class Served(ArtifactStores):
    """The stores as the dashboard serves them: an artifact that is not there (or is a link,
    a FIFO, anything but a file: the store refuses it) is HTTP 404, as optuna-dashboard
    answers it on its API; its ``/artifacts`` route lets the store's error through as a 500
    with a traceback in the server's log. Each folder is read as it was when the server
    started (a folder swapped for a link to another afterwards is not served)."""

    pinned = True

    def open_reader(self, artifact_id: str) -> IO[bytes]:
        from bottle import HTTPError
        from optuna.artifacts.exceptions import ArtifactNotFound

        try:
            return super().open_reader(artifact_id)
        except ArtifactNotFound:
            raise HTTPError(404, "Artifact is not found.") from None
