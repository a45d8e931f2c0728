"""Opening Optuna storage: RDB URLs with heartbeats, journal files, and errors in one line.

- ``sqlite:///file.db``: one machine, one process at a time is safest (Optuna's advice).
- ``postgresql://user@host/db`` (or ``mysql://``): several workers on several hosts.
- a plain file path (``study.log``): Optuna's journal file, safe for several processes on one
  host, no database server needed.

RDB storages ride out an outage (:mod:`._outage`), and get heartbeats: a trial whose worker
was killed is marked failed after ``HEARTBEAT_GRACE_S`` and retried by another worker
(``_recovery``). Journal files have no
heartbeat; there a worker that finds a running trial whose process (on this host) is gone
fails and retries it.

A storage URL's password is never printed (:mod:`scalertune._storage._redact`). A path
ending in ``.db``, ``.sqlite`` or ``.sqlite3``, or an existing SQLite file, is SQLite: the
same as ``sqlite:///PATH``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any, BinaryIO

from scalertune._errors import UsageError

# optuna is imported where it is used: the command line imports this module before it
# handles Ctrl-C, and refuses bad input without waiting for it.
from scalertune._storage import _policy as _storage_policy
from scalertune._storage._outage import (
    RERUN,
    Outage,
    not_up_at_open,
    pause,
    reason,
    refused,
    refused_write,
    retrying,
    ride_out,
    say,
    say_or_print,
    unreachable_at_open,
)
from scalertune._storage._redact import HIDDEN, redact

DEFAULT_STORAGE = "sqlite:///scalertune.db"
#: A path with one of these suffixes names a SQLite database, not a journal file.
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
#: A path that starts like ``user:password@host``: a database URL that lost its scheme.
_CREDENTIALS = re.compile(r"^[^/:@]+:[^/@]*@")
#: A storage string that starts like a URL without ``://`` (``postgresql:/u:pw@h/db``): it
#: would be taken for a journal file's path, password included.
_URL_LIKE = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9+.-]+:/|(?:sqlite|postgres|postgresql|mysql|"
    r"mariadb|oracle|mssql)(?:\+[A-Za-z0-9]+)?:)"
)


def is_rdb(url: str) -> bool:
    return "://" in url


def storage_url(storage: str) -> str:
    """The URL a storage string stands for: a URL as it is; a path ending in ``.db``,
    ``.sqlite`` or ``.sqlite3``, or an existing SQLite file, as ``sqlite:///PATH``; any other
    path is a journal file's, and stays a path.

    >>> storage_url("study.db"), storage_url("study.log")
    ('sqlite:///study.db', 'study.log')
    """
    if is_rdb(storage) or _URL_LIKE.match(storage):
        return storage
    if storage.lower().endswith(SQLITE_SUFFIXES) and not _starts_with(storage, _JOURNAL_START):
        return "sqlite:///" + storage
    if _starts_with(storage, _SQLITE_START):
        return "sqlite:///" + storage
    return storage


def _starts_with(path: str, start: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(start)) == start
    except OSError:
        return False


def open_storage(
    url: str,
    *,
    must_exist: bool = False,
    on_stale_trial: Callable[[Any, Any], Any] | None = None,
    wait_s: float = 0.0,
) -> Any:
    """The Optuna storage object for ``url``; :class:`UsageError` when it cannot be used.

    On RDB storage, ``on_stale_trial(study, trial)`` is Optuna's heartbeat callback: what to
    do with a trial whose worker stopped beating (the search queues its run again). A server
    that is not up (nothing answers) is waited for up to ``wait_s`` seconds, then
    :class:`~._outage.Outage`; with no wait it is a :class:`UsageError` at once."""
    url = storage_url(url)
    if not is_rdb(url):
        return _journal(url, must_exist=must_exist)
    check_local(url, must_exist=must_exist)
    try:
        return _rdb(url, on_stale_trial, wait_s)
    except (ImportError, ModuleNotFoundError):
        raise UsageError(
            f"storage {redact(url)} needs a database driver that is not installed: "
            f"pip install {_driver_package(url)}"
        ) from None
    except Exception as exc:  # SQLAlchemy/Optuna raise many kinds for a bad or unreachable URL
        raise UsageError(
            f"cannot open storage {redact(url)}: {redact(first_line(exc), url)} "
            "(check the URL, e.g. "
            "sqlite:///scalertune.db, postgresql://user@host/db, or a journal file path)"
        ) from None


def _rdb(url: str, on_stale_trial: Callable[[Any, Any], Any] | None, wait_s: float) -> Any:
    """``RDBStorage`` with heartbeats. Workers that start at once on a new database all try
    to create its tables; the losers of that race get a unique-key error (SQLite's
    ``alembic_version``, PostgreSQL's ``pg_type``) and simply open it again, tables made.
    A server that is not up is tried again, with the outage's doubling pause, for up to
    ``wait_s`` (said once, and once more when it is up)."""
    import optuna
    from optuna.storages import RDBStorage
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    deadline = time.monotonic() + _storage_policy.COLD_START_S
    up_by = time.monotonic() + wait_s
    wait, waiting = _storage_policy.STORAGE_RETRY_FIRST_S, False

    def attempt() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                url,
                heartbeat_interval=_storage_policy.HEARTBEAT_INTERVAL_S,
                grace_period=_storage_policy.HEARTBEAT_GRACE_S,
                heartbeat_stale_trial_callback=on_stale_trial,
            )

    while True:
        try:
            storage = retrying(
                attempt,
                store=f"storage {redact(url)}",
                passing=unreachable_at_open,
                url=url,
                what_to_do=RERUN,
                quiet=waiting,  # a server starting up, after it was not up: one wait
                refusing=True,  # tables made on a full disk: not a bad URL
            )
            if waiting:
                say(f"storage {redact(url)} is up")
            return ride_out(storage, url)
        except (IntegrityError, OperationalError, ProgrammingError) as exc:
            if wait_s > 0 and not_up_at_open(exc):
                now, why = time.monotonic(), redact(reason(exc), url)
                if now >= up_by:
                    raise Outage(
                        f"storage {redact(url)} was not up after {wait_s:g} s of "
                        f"--wait-for-storage ({why}): check the URL, or start the server and rerun "
                        "the same command"
                    ) from None
                if not waiting:
                    waiting = say(
                        f"storage {redact(url)} is not up ({why}): waiting for it for up "
                        f"to {wait_s:g} s (--wait-for-storage)"
                    )
                pause(min(wait, up_by - now))
                wait = min(wait * 2, _storage_policy.STORAGE_RETRY_MAX_S)
                continue
            racing = isinstance(exc, IntegrityError) or "already exists" in str(exc)
            if not racing or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///`` URL (``None`` for other URLs and in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///") :].split("?", 1)[0]
    return path if path and path != ":memory:" else None


def owned_files(url: str) -> list[str]:
    """The files a storage keeps on this machine: a SQLite database and the files SQLite
    writes beside it, or a journal file and its lock. Nothing else may be written there."""
    url = storage_url(url)
    path = url if not is_rdb(url) else sqlite_path(url)
    if path is None:
        return []
    suffixes = (".lock",) if not is_rdb(url) else ("-journal", "-wal", "-shm")
    return [path, *(path + s for s in suffixes)]


#: What an Optuna journal file starts with: a JSON operation per line.
_JOURNAL_START = b"{"
#: What a SQLite database starts with.
_SQLITE_START = b"SQLite format 3\0"


def check_local(url: str, *, must_exist: bool = False) -> None:
    """Check what can be checked of a storage on this machine without creating anything: the
    folder of a SQLite file or journal file exists, the path is not a folder, and an existing
    journal file is one. :class:`UsageError` otherwise."""
    url = storage_url(url)
    if is_rdb(url):
        _check_url(url)
        path = sqlite_path(url)
        if path is not None:
            _check_path(path, url, "database", must_exist=must_exist)
        elif url.startswith("sqlite:"):
            raise UsageError(
                f"storage {url} is an in-memory SQLite database, gone when this process "
                "ends (the study with it: no report, no dashboard, no rerun, no other worker): "
                "pass a file, e.g. sqlite:///scalertune.db"
            )
        return
    if _CREDENTIALS.match(url):
        raise UsageError(
            f"storage {HIDDEN}@{url.split('@', 1)[1]} looks like a database URL without its "
            "scheme: write it as postgresql://user@host/db (a journal file's path holds no "
            "password)"
        )
    if _URL_LIKE.match(url) and not os.path.exists(url):
        scheme = url.split(":", 1)[0]
        raise UsageError(
            f"storage {scheme}:{HIDDEN} looks like a database URL without "
            f"'://': write it as {scheme}://user@host/db (a journal file's path "
            "cannot start with a scheme)"
        )
    _check_path(url, url, "journal file", must_exist=must_exist)
    if not os.path.exists(url):
        return
    try:
        with open(url, "rb") as f:
            start = f.read(len(_SQLITE_START))
    except OSError as exc:
        raise UsageError(f"cannot read journal file {url}: {exc.strerror}") from None
    if start and not start.startswith(_JOURNAL_START):
        raise UsageError(
            f"{url} is not an Optuna journal file: pass a new file name (a "
            "journal file), or a storage URL such as sqlite:///study.db"
        )


def _journal(path: str, *, must_exist: bool) -> Any:
    from optuna.storages.journal import JournalStorage

    check_local(path, must_exist=must_exist)
    try:
        mend_cut_record(path)
        return JournalStorage(_journal_file(path))
    except UsageError:
        raise
    except Exception as exc:
        why = refused_write(exc)
        if why is not None:
            raise refused(f"journal file {path}", why) from None
        raise UsageError(
            f"cannot open journal file {path}: {first_line(exc)} (a record in it is not one "
            "Optuna wrote: restore the file, or pass a new file name)"
        ) from None


def _journal_file(path: str) -> Any:
    """Optuna's journal file backend, whose appends a full disk cannot leave cut
    (``_WholeAppends``)."""
    from optuna.storages.journal import JournalFileBackend

    from scalertune._storage._journal_lock import JournalLock

    class _WholeAppends(JournalFileBackend):
        """Each append is whole or not at all: a write the file system refuses (a full
        disk, the file-size limit, a read-only file system) is cut back to the last whole
        record under the journal's lock, and every later append of this process is refused
        with it (:func:`~._outage.refused`: one line, the study as it was), where Optuna
        left a cut line and then failed on ``AssertionError: Should not reach.``. The
        records are written as Optuna's own ``append_logs`` writes them."""

        def __init__(self, path: str) -> None:
            self.guard = JournalLock(path)
            self.path = path
            super().__init__(path, lock_obj=self.guard)

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            text = "\n".join([json.dumps(log, separators=(",", ":")) for log in logs]) + "\n"
            retrying(
                functools.partial(self._append, text.encode("utf-8")),
                store=f"journal file {self.path}",
                passing=lambda exc: False,
                what_to_do=RERUN,
                refusing=True,
            )

        def _append(self, data: bytes) -> None:
            self.guard.acquire()
            try:
                with open(self.path, "ab", buffering=0) as f:
                    end = f.seek(0, os.SEEK_END)
                    try:
                        view = memoryview(data)
                        while view:  # a short write, then the error, as the disk fills
                            view = view[f.write(view) :]
                        os.fsync(f.fileno())
                    except OSError:
                        f.truncate(end)
                        raise
            finally:
                self.guard.release()

    return _WholeAppends(path)


#: How much of a journal is read at a time, from its end, to find where its last whole record
#: ends (a record holding a run's gradient trace may be longer: the search goes on back).
_TAIL_BYTES = 1 << 20


def mend_cut_record(path: str) -> str | None:
    """Set aside a journal's last record where it was cut mid-line (a worker killed, or a disk
    full, as it wrote): Optuna still reads the whole records before it, but the next append
    would continue the cut line into one no reader parses, and every later record with it.
    Under the journal's lock (Optuna's own, :mod:`._journal_lock`: a record another worker is
    writing is finished first), the cut bytes go to a side file beside it and the journal
    ends at its last whole record; said in one line. A last record cut only of its newline
    is whole: the line is ended instead. Returns the side file (``None``: none was needed)."""
    from scalertune._storage._journal_lock import JournalLock

    if not os.path.isfile(path) or os.path.getsize(path) == 0 or _ends_whole(path):
        return None
    lock = JournalLock(path)
    lock.acquire()
    try:
        if _ends_whole(path):  # another worker mended it while this one waited
            return None
        with open(path, "r+b") as f:
            keep = _last_whole_end(f)
            f.seek(keep)
            cut = f.read()
            if _whole_record(cut):  # cut between the record and its newline: end the line
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
                side = None
            else:
                side = _set_aside(path, cut)
                f.truncate(keep)
    finally:
        lock.release()
    if side is None:
        say_or_print(
            f"{path}: its last record lacked only its line end (a worker killed or a disk "
            "full as it wrote): the line ended, the record kept"
        )
        return None
    line = (
        f"{path}: its last record was cut mid-line (a worker killed or a disk full as it "
        f"wrote): its {len(cut)} bytes set aside in {side}; the study goes on from every whole "
        "record"
    )
    say_or_print(line)
    return side


def _last_whole_end(f: BinaryIO) -> int:
    """Where the journal's last whole record ends: after its last newline, read back from the
    end a chunk at a time however long the cut record is (0: no whole record)."""
    end = f.seek(0, os.SEEK_END)
    while end > 0:
        start = max(0, end - _TAIL_BYTES)
        f.seek(start)
        at = f.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def _set_aside(path: str, cut: bytes) -> str:
    """Write the cut bytes to a new file beside the journal, named for the time, and return
    its name: created, never opened through a link someone left at that name nor over an
    earlier side file (``mkstemp``: exclusive creation, a name of its own), and on disk
    before the journal is cut back."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, side = tempfile.mkstemp(prefix=f"{name}.cut-{int(time.time())}-", dir=folder)
    with os.fdopen(fd, "wb") as out:
        out.write(cut)
        out.flush()
        os.fsync(out.fileno())
    return os.path.join(os.path.dirname(path), os.path.basename(side))


def _whole_record(cut: bytes) -> bool:
    """Whether the bytes after a journal's last newline are a whole record (a JSON object
    as Optuna writes each): no prefix of one is, so only its newline was lost."""
    try:
        return isinstance(json.loads(cut), dict)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past reading
        return False


def _ends_whole(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _check_url(url: str) -> None:
    """Refuse a URL whose password or user holds an unescaped ``@``: SQLAlchemy would take
    the rest of the password for the host name and a driver's error would print it."""
    from sqlalchemy.engine import make_url

    try:
        host = make_url(url).host or ""
    except Exception:  # malformed: opening it says so, with the password hidden
        return
    if "@" in host:
        scheme = url.split("://", 1)[0]
        raise UsageError(
            f"storage {scheme}://{HIDDEN}: the user name or password holds an "
            "'@': write it as %40 (URL-encode it)"
        )


def _check_path(path: str, shown: str, what: str, *, must_exist: bool) -> None:
    if os.path.isdir(path):
        raise UsageError(f"{shown} is a folder: the storage needs a {what} path")
    if must_exist and not os.path.exists(path):
        raise UsageError(f"no such {what}: {shown} (check the storage)")
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
    from optuna.storages import RDBStorage

    return isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None


def load_existing_study(url: str, study_name: str | None) -> Any:
    """Load a study that must exist already; never creates a database or a study.

    Without ``study_name``, the storage must hold exactly one study.
    """
    import optuna

    url = storage_url(url)
    storage = open_storage(url, must_exist=True)
    if study_name is None:
        names = optuna.get_all_study_names(storage=storage)
        if not names:
            raise UsageError(f"{redact(url)} holds no study: run scalertune search first")
        if len(names) > 1:
            listed = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            raise UsageError(
                f"{redact(url)} holds {len(names)} studies ({listed}): name one with --study-name"
            )
        study_name = names[0]
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(
            f"no study {study_name!r} in {redact(url)}: check the study name and the storage"
        ) from None


def load_existing_studies(url: str) -> list[Any]:
    """Every study in a storage that must exist already and hold at least one."""
    import optuna

    url = storage_url(url)
    storage = open_storage(url, must_exist=True)
    names = optuna.get_all_study_names(storage=storage)
    if not names:
        raise UsageError(f"{redact(url)} holds no study: run scalertune search first")
    return [optuna.load_study(study_name=name, storage=storage) for name in names]
