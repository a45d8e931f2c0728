"""Riding out a storage outage: a database restart, a failover, a dropped connection.

Every call a search makes to an RDB storage (through Optuna or its own) is retried while the
storage fails in a way that passes (the server restarting or shutting down, a connection
dropped, SQLite busy), with a wait that doubles from ``STORAGE_RETRY_FIRST_S`` to
``STORAGE_RETRY_MAX_S``, for up to ``STORAGE_OUTAGE_S``; a read or write that failed wrote
nothing, so it is simply made again. Past the bound the storage is **down** for this process:
:class:`Outage` is raised, and every later call raises it at once. A trial that was running
stays so in the storage, as with any worker that died, and the next worker or rerun recovers
it: an outage is never recorded as a run's result. The artifact store's calls go through
:func:`retrying` the same way.

:class:`Outage` is a ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception``
on its way (Optuna's objective wrapper, a run's error handling) may take it for a run's own
failure. The search turns it into :class:`~scalertune._errors.StorageUnavailable`, and the
command line into one line and exit status 3.

A write the file system refuses for good (a full disk or quota, the file-size limit, a
read-only database or file system: :func:`refused_write`) is no outage to wait for: the
first one is :class:`Outage` at once, in one line that says which (Optuna's own message for
it speaks of "exceeding max length"), and every later call to that store in this process
raises it too, so nothing is written after a write that failed. The study is as it was
before that write; the same command, rerun with room, resumes it.

When a server cannot be reached at all while the storage is first opened (connection
refused, an unknown host), nothing has been written yet and a wrong URL is likelier than an
outage: that is said at once (:mod:`._open`), unless the user asked to wait for it
(``--wait-for-storage``: workers a scheduler starts while the database restarts, or before
its container is up; :func:`not_up_at_open`). A server that answers that it is starting or
shutting down is always waited for.
"""

from __future__ import annotations

import errno
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from scalertune import _interrupt
from scalertune._storage import _policy as _storage_policy
from scalertune._storage._redact import redact

_T = TypeVar("_T")

#: The RDB storage's methods that touch the database: the public ones, and the private ones
#: Optuna's cache in front of it calls (each is checked to exist, in the tests).
RDB_CALLS = (
    "create_new_study",
    "delete_study",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_all_studies",
    "create_new_trial",
    "_create_new_trial",
    "set_trial_param",
    "_set_trial_param",
    "get_trial_param",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial",
    "get_all_trials",
    "_get_trials",
    "get_n_trials",
    "get_best_trial",
    "_get_best_trial_id",
    "get_trial_params",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "_get_stale_trial_ids",
)
#: What a server says, refusing a connection, when it is restarting (a refused connection
#: carries no SQLSTATE in the driver's error: psycopg 3 gives only libpq's message).
_RESTARTING = (
    "starting up",
    "shutting down",
    "in recovery mode",
    "not yet accepting",
    "not currently accepting",
    "due to administrator command",
    "closed the connection unexpectedly",
)
_UNKNOWN_HOST = "could not translate host name"
#: ... and when it will refuse again whatever the wait: a wrong name, password or host.
_REFUSED_FOR_GOOD = (
    "does not exist",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    _UNKNOWN_HOST,
)
#: SQLSTATEs of a server that is going away or coming back (PostgreSQL's admin_shutdown,
#: crash_shutdown, cannot_connect_now; a database closed to connections for maintenance),
#: and the class of connection exceptions.
_PASSING_STATES = ("57P01", "57P02", "57P03", "55000")
_CONNECTION_CLASS = "08"


#: What to do about a storage past the bound.
RERUN = (
    "start it (or wait until it is back) and rerun the same command: the study resumes "
    "where it stopped"
)


class Outage(BaseException):
    """The storage (or the artifact store) stayed unreachable past ``STORAGE_OUTAGE_S``, or
    refused a write for good (:func:`refused_write`)."""


#: What a write the file system refuses says, by errno: no wait helps, and no retry.
_REFUSING_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file reached the file-size limit (ulimit -f)",
    errno.EROFS: "the file system is read-only",
}
#: ... by SQLite's result code (Python's ``sqlite_errorname``), and PostgreSQL's SQLSTATE.
_SQLITE_REFUSING = {
    "SQLITE_FULL": "the disk is full, or the database reached the file-size limit (ulimit -f)",
    "SQLITE_READONLY": "the database is read-only (its file, its folder or its file system)",
    "SQLITE_IOERR": "a write failed (disk I/O error: a full disk, the file-size limit "
    "(ulimit -f), or a failing disk)",
}
_SQLSTATE_REFUSING = {
    "53100": "the server's disk is full",
    "25006": "the server is read-only (a standby)",
}


class _Down:
    """Which stores this process has given up on, and what it says of them."""

    def __init__(self) -> None:
        self.messages: dict[str, str] = {}
        self.lock = threading.Lock()
        #: Says a line when an outage starts and ends (the main thread only).
        self.log: Callable[[str], None] | None = None


_down = _Down()


def set_log(log: Callable[[str], None] | None) -> None:
    """Where the lines about an outage go (``None``: nowhere)."""
    _down.log = log


def forget() -> None:
    """Try every store afresh: a new command (or search) in this process."""
    with _down.lock:
        _down.messages.clear()


def retrying(
    call: Callable[[], _T],
    *,
    store: str,
    passing: Callable[[BaseException], bool],
    what_to_do: str,
    url: str | None = None,
    quiet: bool = False,
    refusing: bool = False,
) -> _T:
    """``call()``, made again while it fails in a way ``passing`` says passes, for up to
    ``STORAGE_OUTAGE_S``; then :class:`Outage`, naming ``store`` and ``what_to_do``. The
    errors quoted are redacted against ``url``. The outage is said as it starts and ends,
    unless ``quiet`` (the caller already said it waits). With ``refusing``, a write the
    file system refuses (:func:`refused_write`) is :class:`Outage` at once (:func:`refused`)."""
    if store in _down.messages:
        raise Outage(_down.messages[store])
    deadline, wait, said = None, _storage_policy.STORAGE_RETRY_FIRST_S, False
    while True:
        try:
            result = call()
        except Exception as exc:
            why = refused_write(exc) if refusing else None
            if why is not None:
                raise refused(store, why) from None
            if not passing(exc):
                raise
            now = time.monotonic()
            deadline = deadline or now + _storage_policy.STORAGE_OUTAGE_S
            why = redact(reason(exc), url)
            if now >= deadline:
                message = (
                    f"{store} has been unreachable for {_storage_policy.STORAGE_OUTAGE_S:g} s "
                    f"({why}): {what_to_do}"
                )
                with _down.lock:
                    _down.messages.setdefault(store, message)
                raise Outage(_down.messages[store]) from None
            if not said and not quiet:
                said = say(
                    f"{store} is unreachable ({why}): retrying for up to "
                    f"{_storage_policy.STORAGE_OUTAGE_S:g} s"
                )
            pause(min(wait, max(0.0, deadline - now)))
            wait = min(wait * 2, _storage_policy.STORAGE_RETRY_MAX_S)
            continue
        if said:
            say(f"{store} is back")
        return result


def ride_out(storage: Any, url: str) -> Any:
    """``storage`` (an Optuna ``RDBStorage`` opened on ``url``) with its database calls
    retried through an outage (:func:`retrying`). The object keeps its class, so that Optuna
    treats it as the RDB storage it is."""
    for name in RDB_CALLS:
        method = getattr(storage, name)
        wrapped = _retried(method, name, url, RERUN)
        setattr(storage, name, types.MethodType(wrapped, storage))
    beat = storage.record_heartbeat

    def record_heartbeat(self: Any, trial_id: int) -> None:
        # a missed heartbeat is made up by the next, five seconds later; a trial whose beats
        # stop for longer is failed and run again, as after a dead worker
        try:
            beat(trial_id)
        except Exception as exc:  # noqa: BLE001 - any failure: the next beat tries again
            why = refused_write(exc)
            if why is not None:  # refused for good: the worker's own next call says so
                refused(f"storage {redact(url)}", why)
                return
            if not passing_rdb(exc):
                raise

    storage.record_heartbeat = types.MethodType(record_heartbeat, storage)
    return storage


def refused_write(exc: BaseException) -> str | None:
    """What refused a write for good, in words, where ``exc`` is (or was raised by) such a
    refusal: a full disk, a quota, the file-size limit, a read-only file or file system
    (an ``OSError``, SQLite's result code or PostgreSQL's SQLSTATE); ``None`` for any other
    error. Optuna wraps SQLite's in a message about "exceeding max length", which is not
    what happened."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _REFUSING_ERRNOS:
            return _REFUSING_ERRNOS[e.errno]
        code = getattr(e, "sqlite_errorname", None)
        if isinstance(code, str) and not code.endswith("READ"):  # SQLITE_IOERR_(SHORT_)READ
            found = next((w for c, w in _SQLITE_REFUSING.items() if code.startswith(c)), None)
            if found is not None:
                return found
        state = _sqlstate(e) if not isinstance(e, OSError) else None
        if state in _SQLSTATE_REFUSING:
            return _SQLSTATE_REFUSING[state]
    return None


def refused(store: str, why: str) -> Outage:
    """The :class:`Outage` of a store that refused a write for good (``why``, from
    :func:`refused_write`): every later call to it in this process raises it at once, so
    nothing is written after a write that may have been cut."""
    message = (
        f"{store} cannot be written: {why}: free space (or make it writable) and rerun the "
        "same command: nothing finished is lost, and the study resumes where it stopped"
    )
    with _down.lock:
        _down.messages.setdefault(store, message)
    return Outage(_down.messages[store])


def _retried(method: Callable[..., Any], name: str, url: str, what: str) -> Callable[..., Any]:
    from optuna.exceptions import UpdateFinishedTrialError

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        failed: list[BaseException] = []

        def once() -> Any:
            try:
                return method(*args, **kwargs)
            except UpdateFinishedTrialError:
                # A trial's end that was written before the connection dropped, and is
                # written again: the first write stood.
                if name == "set_trial_state_values" and failed and _ended_as(self, args, kwargs):
                    return True
                raise
            except Exception as exc:
                failed.append(exc)
                raise

        return retrying(
            once,
            store=f"storage {redact(url)}",
            passing=passing_rdb,
            what_to_do=what,
            url=url,
            refusing=True,
        )

    return call


def _ended_as(storage: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    trial_id = kwargs.get("trial_id", args[0] if args else None)
    state = kwargs.get("state", args[1] if len(args) > 1 else None)
    return trial_id is not None and storage.get_trial(trial_id).state == state


def passing_rdb(exc: BaseException) -> bool:
    """Whether an RDB storage's error is one that passes: the server going away or coming
    back, a dropped connection, SQLite busy. Not bad SQL, a constraint, a refused password."""
    from sqlalchemy import exc as sa

    for e in _chain(exc):
        if isinstance(e, sa.DBAPIError) and e.connection_invalidated:
            return True
        if isinstance(e, (sa.TimeoutError, sa.PendingRollbackError)):
            return True
        if isinstance(e, (sa.OperationalError, sa.InterfaceError)):
            return _passing_driver_error(e.orig)
    return False


def unreachable_at_open(exc: BaseException) -> bool:
    """Whether opening the storage failed because its server is starting or stopping: worth
    waiting for. (Nobody answering at all is said at once: see the module docstring.)"""
    from sqlalchemy import exc as sa

    for e in _chain(exc):
        if isinstance(e, (sa.OperationalError, sa.InterfaceError)):
            state = _sqlstate(e.orig)
            if state is not None:
                return state in _PASSING_STATES or state.startswith(_CONNECTION_CLASS)
            return any(words in str(e.orig).lower() for words in _RESTARTING)
    return False


def not_up_at_open(exc: BaseException) -> bool:
    """Whether opening the storage failed because nothing answered: the connection refused
    or timed out, the host unknown (a database container not yet up). Worth waiting for
    where the user asked to; a wrong password or database name is not."""
    from sqlalchemy import exc as sa

    for e in _chain(exc):
        if isinstance(e, (sa.OperationalError, sa.InterfaceError)):
            orig = e.orig
            if orig is None or type(orig).__module__.startswith("sqlite3"):
                return False
            text = str(orig).lower()
            return _sqlstate(orig) is None and not any(
                words in text for words in _REFUSED_FOR_GOOD if words != _UNKNOWN_HOST
            )
    return False


def _passing_driver_error(orig: BaseException | None) -> bool:
    if orig is None:
        return False
    text = str(orig).lower()
    if type(orig).__module__.startswith("sqlite3"):
        return "locked" in text or "busy" in text
    state = _sqlstate(orig)
    if state is None:  # no answer, or a refused connection (which carries no SQLSTATE)
        return not any(words in text for words in _REFUSED_FOR_GOOD)
    return state in _PASSING_STATES or state.startswith(_CONNECTION_CLASS)


def _sqlstate(orig: BaseException | None) -> str | None:
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was raised by) a storage error: Optuna's or SQLAlchemy's."""
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import SQLAlchemyError

    return any(isinstance(e, (StorageInternalError, SQLAlchemyError)) for e in _chain(exc))


def outage_behind(exc: BaseException) -> BaseException | None:
    """The :class:`Outage` (or ``KeyboardInterrupt``) that ``exc`` stands in front of, if any.
    Optuna's trial loop reads, after a failed write of a trial's end, a name that write never
    set: the ``UnboundLocalError`` it raises then hides what stopped the write."""
    return next((e for e in _chain(exc) if isinstance(e, (Outage, KeyboardInterrupt))), None)


def reason(exc: BaseException) -> str:
    """The first line of the deepest error: the driver's, not its wrappers'."""
    deepest = exc
    for e in _chain(exc):
        deepest = e
        orig = getattr(e, "orig", None)
        if orig is not None:
            deepest = orig
            break
    text = str(deepest).strip()
    return text.splitlines()[0] if text else type(deepest).__name__


def say(line: str) -> bool:
    if _down.log is not None and threading.current_thread() is threading.main_thread():
        _down.log(line)
    return True


def say_or_print(line: str) -> None:
    """``line`` through the command's log where one is set (a search's), else on stderr (a
    report opening a journal it had to mend)."""
    if _down.log is not None:
        say(line)
    else:
        print(line, file=sys.stderr)


def pause(seconds: float) -> None:
    """Wait between tries: Ctrl-C ends the wait at once on the main thread (nothing is half
    written: the failed call wrote nothing)."""
    if threading.current_thread() is threading.main_thread():
        _interrupt.sleep(seconds)
    else:
        time.sleep(seconds)
