"""The study's artifact store: where its files live (checkpoints, pictures), for every worker.

A study's files are written by one worker and read by others, on this host or another: the
float32 reference's checkpoints (the finalists branch from them), a finalist's own state
between its run from step 0 and its continuation, the pictures the dashboard shows. They go
to an Optuna artifact store (:mod:`optuna.artifacts`), named by a *location*:

- a folder (Optuna's ``FileSystemArtifactStore``, written atomically here): by default
  ``scalertune-artifacts`` beside a SQLite database or a journal file, or, for a database
  server, in the folder the study's first worker started in;
- ``s3://BUCKET``: an S3-compatible bucket through Optuna's own ``Boto3ArtifactStore``, for
  workers on several hosts. Its endpoint and credentials come from boto3's configuration
  (``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ``~/.aws``), never from the study.

The location is recorded in the study (``ARTIFACT_DIR_ATTR``, a folder as an absolute path)
by the worker that creates it, so every other worker, ``report``, ``analyze`` and
``scalertune dashboard`` find it whatever folder they start in. Calls to the store ride out
an outage as the storage's do (:func:`~scalertune._storage._outage.retrying`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from typing import IO, Any, TypeVar

from scalertune._errors import DamagedEvidence, UsageError
from scalertune._storage._names import ARTIFACT_DIR_ATTR
from scalertune._storage._open import is_rdb, sqlite_path
from scalertune._storage._open import storage_url as url_of
from scalertune._storage._outage import RERUN, retrying

_T = TypeVar("_T")

#: The folder name of a study's artifacts, where no location is given.
DEFAULT_ARTIFACT_DIR = "scalertune-artifacts"
S3 = "s3://"
#: Errors of a folder that pass (a network file system's hiccup); a full disk or a
#: read-only folder does not.
_PASSING_ERRNOS = (errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN)
#: The name of a file in a store: a plain name, never a path (names may come from a study,
#: which others can write to).
_PLAIN_NAME = re.compile(r"(?!\.)[A-Za-z0-9._-]{1,255}")


def is_bucket(location: str) -> bool:
    return location.startswith(S3)


def normalized(location: str) -> str:
    """A location as the study records it: ``s3://BUCKET``, or a folder's absolute path;
    :class:`UsageError` for an ``s3://`` location that names no bucket, or more than one."""
    if not is_bucket(location):
        return os.path.abspath(location)
    bucket = location[len(S3) :].rstrip("/")
    if not bucket or "/" in bucket:
        raise UsageError(
            f"--artifact-dir {location}: name a bucket, as s3://BUCKET (a "
            "folder inside it is not supported)"
        )
    return S3 + bucket


def default_location(storage_url: str) -> str:
    """``scalertune-artifacts`` beside a SQLite database or a journal file; in the current
    folder for a database server."""
    url = url_of(storage_url)
    path = url if not is_rdb(url) else sqlite_path(url)
    folder = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
    return os.path.join(folder, DEFAULT_ARTIFACT_DIR)


def location_of(study: Any, override: str | None = None) -> str:
    """Where ``study``'s artifacts live: ``override``, the recorded location, or (a study
    made before locations were recorded) ``scalertune-artifacts`` here. A recorded location
    that is not text is :class:`~scalertune._errors.DamagedEvidence`."""
    recorded = study.user_attrs.get(ARTIFACT_DIR_ATTR)
    if recorded is not None and not isinstance(recorded, str):
        raise DamagedEvidence(
            f"the study's artifact location ({ARTIFACT_DIR_ATTR}) is damaged: it is not a "
            "folder or s3://BUCKET but a " + type(recorded).__name__
        )
    return normalized(override or recorded or DEFAULT_ARTIFACT_DIR)


def settle_location(study: Any, *, given: str | None, default: str) -> str:
    """Record where ``study`` keeps its artifacts unless it has a place already, and return
    it; :class:`UsageError` when ``given`` names another place than the recorded one (the
    study's checkpoints are there)."""
    recorded = study.user_attrs.get(ARTIFACT_DIR_ATTR)
    mine = normalized(given or default)
    if recorded is None:
        study.set_user_attr(ARTIFACT_DIR_ATTR, mine)
        return mine
    if given is not None and normalized(recorded) != mine:
        raise UsageError(
            f"study {study.study_name!r} keeps its artifacts in {recorded}: rerun "
            f"without --artifact-dir, or with --artifact-dir {recorded}"
        )
    return normalized(recorded)


class Store:
    """The artifact store at a location, its calls riding out an outage. ``path(name)`` is the
    file of an artifact in a folder (``None`` in a bucket)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._inner: Any = None

    def __getstate__(self) -> dict[str, Any]:  # crosses to an isolated run's process
        return {"location": self.location, "_inner": None}

    @property
    def inner(self) -> Any:
        """Optuna's store object (made on first use: boto3 is imported only for a bucket)."""
        if self._inner is None:
            self._inner = _open(self.location)
        return self._inner

    def path(self, name: str) -> str | None:
        return None if is_bucket(self.location) else os.path.join(self.location, _plain(name))

    def read(self, name: str, into: Callable[[IO[bytes]], _T]) -> _T:
        """``into(stream)`` over the artifact ``name``; Optuna's ``ArtifactNotFound`` when
        there is none."""

        def call() -> _T:
            with self.inner.open_reader(_plain(name)) as stream:
                return into(stream)

        return self._retrying(call)

    def write(self, name: str, path: str) -> None:
        """Store the file at ``path`` as the artifact ``name``, whole or not at all."""

        def call() -> None:
            with open(path, "rb") as f:
                self.inner.write(_plain(name), f)

        self._retrying(call)

    def remove(self, names: list[str]) -> None:
        """Remove the artifacts ``names`` and their manifests, those there are (a folder that
        was never made is not made for it)."""
        from optuna.artifacts.exceptions import ArtifactNotFound

        if not is_bucket(self.location) and not os.path.isdir(self.location):
            return
        for name in names:
            for artifact in (name, name + ".json"):
                with contextlib.suppress(ArtifactNotFound):
                    self._retrying(functools.partial(self.inner.remove, artifact))

    def check(self) -> None:
        """:class:`UsageError` unless the store can be written, creating nothing: a folder
        that is one (or can be made in a folder that can be written), a bucket that exists
        and these credentials may use."""
        if is_bucket(self.location):
            self._retrying(self._head_bucket)
            return
        existing = self.location
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise UsageError(f"--artifact-dir {self.location}: {existing} is a file: name a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(
                f"--artifact-dir {self.location}: the folder {existing} is not "
                "writable: pass another --artifact-dir"
            )

    def _head_bucket(self) -> None:
        from botocore.exceptions import ClientError

        bucket = self.location[len(S3) :]
        try:
            self.inner.client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            if code in ("404", "NoSuchBucket"):
                raise UsageError(
                    f"artifact store {self.location}: there is no such bucket: create it first"
                ) from None
            if code in ("403", "AccessDenied"):
                raise UsageError(
                    f"artifact store {self.location}: access denied: check the "
                    "credentials boto3 uses (AWS_ACCESS_KEY_ID, ~/.aws)"
                ) from None
            raise

    def _retrying(self, call: Callable[[], _T]) -> _T:
        return retrying(
            call, store=f"artifact store {self.location}", passing=_passing, what_to_do=RERUN
        )


def _open(location: str) -> Any:
    if not is_bucket(location):
        os.makedirs(location, exist_ok=True)
        return _Folder(location)
    try:
        import boto3
        from optuna.artifacts import Boto3ArtifactStore
    except ImportError:
        raise UsageError(
            f"artifact store {location} needs boto3, which is not installed: pip install boto3"
        ) from None
    return Boto3ArtifactStore(location[len(S3) :], client=boto3.client("s3"))


class _Folder:
    """Optuna's artifact store protocol over a folder, laid out as its
    ``FileSystemArtifactStore`` lays it out (one file per artifact, named by its id: that
    store, or optuna-dashboard's ``--artifact-dir``, reads it as it is), each file written
    whole under a temporary name and then renamed: a reader never sees half a file, and a
    writer killed midway leaves none."""

    def __init__(self, base: str) -> None:
        self.base = base

    def open_reader(self, artifact_id: str) -> IO[bytes]:
        """The artifact's file, opened without following a link, and only where it is a
        regular file: a symbolic link (to ``/etc/shadow``), a FIFO or a device put in its
        place is no artifact (the dashboard serves what this returns)."""
        from optuna.artifacts.exceptions import ArtifactNotFound

        path = self._file(artifact_id)
        try:
            # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of hanging
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {artifact_id} in {self.base}") from None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise ArtifactNotFound(
                f"artifact {artifact_id} in {self.base} is a symbolic link: not read"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ArtifactNotFound(f"artifact {artifact_id} in {self.base} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def write(self, artifact_id: str, content_body: IO[bytes]) -> None:
        final = self._file(artifact_id)
        fd, tmp = tempfile.mkstemp(dir=self.base, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(content_body, f)
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    def _file(self, artifact_id: str) -> str:
        """The artifact's file: an id is a name in the folder, never a path out of it (the
        dashboard takes ids from URLs)."""
        if not artifact_id or os.sep in artifact_id or artifact_id.startswith("."):
            raise ValueError(f"invalid artifact id: {artifact_id!r}")
        return os.path.join(self.base, artifact_id)

    def remove(self, artifact_id: str) -> None:
        from optuna.artifacts.exceptions import ArtifactNotFound

        try:
            os.remove(self._file(artifact_id))
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {artifact_id} in {self.base}") from None


def _passing(exc: BaseException) -> bool:
    """Whether an artifact store's error passes: the server or network, not the request."""
    if isinstance(exc, OSError) and not type(exc).__module__.startswith("botocore"):
        return exc.errno in _PASSING_ERRNOS
    try:
        from botocore.exceptions import (
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )
    except ImportError:
        return False
    if isinstance(
        exc, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ConnectTimeoutError)
    ):
        return True
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return int(status) >= 500 or error.get("Code") in ("SlowDown", "RequestTimeout")
    return False


def plain(name: str) -> bool:
    """Whether ``name`` is a plain file name, which the store opens (:func:`_plain`)."""
    return isinstance(name, str) and _PLAIN_NAME.fullmatch(name) is not None


def _plain(name: str) -> str:
    """``name``, a plain file name; :class:`~scalertune._errors.DamagedEvidence` for anything
    else (a path, ``..``), which no name scalertune gives a file is."""
    if not plain(name):
        raise DamagedEvidence(f"{name!r} is not the name of a file in an artifact store")
    return name
