"""Opening Optuna storage: RDB URLs with heartbeats, journal files, and errors in one line.

- ``sqlite:///file.db``: one machine, one process at a time is safest (Optuna's advice).
- ``postgresql://user@host/db`` (or ``mysql://``): several workers on several hosts.
- a plain file path (``study.log``): Optuna's journal file, safe for several processes on one
  host, no database server needed.

RDB storages get heartbeats: a trial whose worker was killed is marked failed after
``HEARTBEAT_GRACE_S`` and retried by another worker. Journal files have no heartbeat; there a
worker that finds a running trial whose process (on this host) is gone fails and retries it.
"""

from __future__ import annotations

import os
import re
import socket
import warnings
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from scalertune import _policy
from scalertune._errors import UsageError

DEFAULT_STORAGE = "sqlite:///scalertune.db"

#: ``host:pid`` of this process, recorded on every trial it runs.
WORKER = f"{socket.gethostname()}:{os.getpid()}"


def redact(url: str) -> str:
    """The storage URL with any password replaced by ``***``: safe to print and store."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def is_rdb(url: str) -> bool:
    return "://" in url


def open_storage(url: str, *, must_exist: bool = False) -> Any:
    """The Optuna storage object for ``url``; :class:`UsageError` when it cannot be used."""
    if not is_rdb(url):
        return _journal(url, must_exist=must_exist)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        _check_path(path, url, "database", must_exist=must_exist)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                url,
                heartbeat_interval=_policy.HEARTBEAT_INTERVAL_S,
                grace_period=_policy.HEARTBEAT_GRACE_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                    max_retry=_policy.MAX_RETRIES),
            )
    except (ImportError, ModuleNotFoundError):
        raise UsageError(
            f"storage {redact(url)} needs a database driver that is not installed: "
            f"pip install {_driver_package(url)}"
        ) from None
    except Exception as exc:  # SQLAlchemy/Optuna raise many kinds for a bad or unreachable URL
        raise UsageError(
            f"cannot open storage {redact(url)}: {redact(first_line(exc))} (check the URL, e.g. "
            "sqlite:///scalertune.db, postgresql://user@host/db, or a journal file path)"
        ) from None


def _journal(path: str, *, must_exist: bool) -> Any:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    _check_path(path, path, "journal file", must_exist=must_exist)
    try:
        return JournalStorage(JournalFileBackend(path))
    except Exception as exc:
        raise UsageError(f"cannot open journal file {path}: {first_line(exc)}") from None


def _check_path(path: str, shown: str, what: str, *, must_exist: bool) -> None:
    if must_exist and not os.path.exists(path):
        raise UsageError(f"no such {what}: {shown} (check --storage)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot create {what} {shown}: the folder {folder} does not exist")


def _driver_package(url: str) -> str:
    scheme = url.split("://", 1)[0]
    if scheme in ("postgresql", "postgresql+psycopg"):
        return "'scalertune[postgresql]' (psycopg 3)"
    if scheme == "postgresql+psycopg2":
        return "psycopg2-binary"
    if scheme.startswith("mysql"):
        return "PyMySQL, and write the URL as mysql+pymysql://..."
    return f"the SQLAlchemy driver for {scheme}://"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def heartbeat_enabled(storage: Any) -> bool:
    return isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None


def load_existing_study(url: str, study_name: str | None) -> optuna.Study:
    """Load a study that must exist already; never creates a database or a study.

    Without ``study_name``, the storage must hold exactly one study.
    """
    storage = open_storage(url, must_exist=True)
    if study_name is None:
        names = optuna.get_all_study_names(storage=storage)
        if len(names) != 1:
            raise UsageError(f"{redact(url)} holds {len(names)} studies: "
                             "choose one with --study-name")
        study_name = names[0]
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(f"no study {study_name!r} in {redact(url)}: "
                         "check --study-name and --storage") from None


def load_existing_studies(url: str) -> list[optuna.Study]:
    """Every study in a storage that must exist already and hold at least one."""
    storage = open_storage(url, must_exist=True)
    names = optuna.get_all_study_names(storage=storage)
    if not names:
        raise UsageError(f"{redact(url)} holds no study: run scalertune search first")
    return [optuna.load_study(study_name=name, storage=storage) for name in names]
