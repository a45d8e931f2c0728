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

import contextlib
import json
import os
import signal
import threading
import types
from collections.abc import Iterator
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
    """Serve the storage of ``studies`` (every study it holds) until Ctrl-C or SIGTERM, with
    their artifact stores (folders that exist, and buckets) as the dashboard's one store;
    read-only (:func:`read_only`) unless ``writable``. optuna-dashboard's WSGI app, served
    as its ``run_server`` serves it (wsgiref), but stopped by the signal itself: a
    ``KeyboardInterrupt`` raised in a request is caught by wsgiref's error handler, and
    the server served on (with requests coming, Ctrl-C after Ctrl-C)."""
    from optuna_dashboard import wsgi

    store = Served([p for p in locations if is_bucket(p) or os.path.isdir(p)])
    storage: Any = storage_of(studies[0])
    app = wsgi(recommended_best(storage), artifact_store=store if store.locations else None)
    server = _server(host, port, app if writable else read_only(app))
    with _stopped_by_signals(server):
        server.serve_forever(poll_interval=0.2)
    server.server_close()


def _server(host: str, port: int, app: Any) -> Any:
    """A wsgiref server of ``app`` at ``host``:``port`` (IPv6 where ``host`` is)."""
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Handler(WSGIRequestHandler):
        def address_string(self) -> str:  # no reverse DNS lookup per request
            return str(self.client_address[0])

    server_class: Any = WSGIServer
    if ":" in host:

        class Server6(WSGIServer):
            address_family = socket.AF_INET6

        server_class = Server6
    return make_server(host, port, app, server_class=server_class, handler_class=Handler)


@contextlib.contextmanager
def _stopped_by_signals(server: Any) -> Iterator[None]:
    """In this scope Ctrl-C and SIGTERM stop ``server``: its loop ends after the request it
    is answering (``shutdown`` from a thread: the loop runs in this one)."""

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
