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

The location is recorded in the study (``ARTIFACT_DIR_ATTR``) by the worker that creates it,
so every other worker, ``report``, ``analyze`` and ``scalertune dashboard`` find it whatever
folder they start in: a folder inside the storage file's own folder as a path relative to it
(a copied study folder reads and writes its own store, not the original's), any other as an
absolute path. What the study records is used only where it can be trusted (whoever can write
the database chooses it): a bucket, a folder inside the storage file's folder, or one the user
names with ``--artifact-dir``. Calls to the store ride out
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
from scalertune._storage._outage import RERUN, retrying, say_or_print

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
#: (study, recorded location) of the moved studies said (:func:`location_of`): once each.
_SAID: set[tuple[str, str]] = set()


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
    """Where ``study``'s artifacts live: ``override`` (a place the user named), else the
    recorded location where it can be trusted (:func:`trusted`), else (a study made before
    locations were recorded) ``scalertune-artifacts`` here.

    Whoever can write the study's database chooses what it records: a folder outside the
    storage file's own (``/etc``) would have ``report`` run as root write its pictures there.
    Such a location is a :class:`UsageError` that names the flag which sets it, except a
    ``scalertune-artifacts`` folder recorded absolute by an older study that was moved or
    copied since: the one beside its storage file now is used, and said once. A recorded
    location that is not text is :class:`~scalertune._errors.DamagedEvidence`."""
    if override:
        return normalized(override)
    recorded = _recorded(study)
    if recorded is None:
        return normalized(DEFAULT_ARTIFACT_DIR)
    home = _home(study)
    location = _resolved(recorded, home)
    if trusted(location, home):
        return location
    mine = os.path.join(home or "", DEFAULT_ARTIFACT_DIR)
    if (
        home is not None
        and os.path.basename(location) == DEFAULT_ARTIFACT_DIR
        and not _inside(location, home)
        and trusted(mine, home)
    ):
        # An older study, copied or moved with its storage file: it recorded the store beside
        # where that file was, as an absolute path. Its store is the one beside it now.
        if (study.study_name, location) not in _SAID:
            _SAID.add((study.study_name, location))
            say_or_print(
                f"study {study.study_name!r} records its artifact store at {location}, "
                f"outside the folder of its storage file (moved or copied): {mine} is used"
            )
        return mine
    raise _untrusted(study.study_name, location, home)


def _untrusted(name: str, location: str, home: str | None, keeps: str = "records") -> UsageError:
    """The one line refusing a store the user did not name: outside the storage file's
    folder (the study's record chose it) or a link out of it (that folder's writer did)."""
    where = (
        f"outside the folder of its storage file ({home})"
        if home is not None
        else "on a database server, which names no folder of this machine"
    )
    who = "the study chooses it"
    if home is not None and _inside(location, home):  # by name: a link leads out
        where = f"a link to {os.path.realpath(location)}, {where}"
        who = "that folder leaves the link"
    return UsageError(
        f"study {name!r} {keeps} its artifact store at {location}, {where}: not used, since "
        f"whoever can write {who}: pass --artifact-dir {location} to use it (or another folder)"
    )


def trusted(location: str, home: str | None) -> bool:
    """Whether a location read from a study may be used unnamed by the user: a bucket (no
    file of this machine), a folder inside ``home`` (the folder of the study's SQLite or
    journal file) where it really is, not a link out of it that whoever can write that
    folder may leave in the store's place, or (a study on a database server) the folder the
    study would be given here by default."""
    if is_bucket(location):
        return True
    if home is not None:
        return _inside(os.path.realpath(location), os.path.realpath(home))
    return location == os.path.join(os.getcwd(), DEFAULT_ARTIFACT_DIR)


def record_location(study: Any, location: str) -> None:
    """Record ``location`` in ``study``: a folder inside its storage file's folder as a
    path relative to it (a copied study folder keeps its own store), else as it is."""
    home = _home(study)
    if not is_bucket(location) and home is not None and _inside(location, home):
        location = os.path.relpath(location, home)
    if study.user_attrs.get(ARTIFACT_DIR_ATTR) != location:
        study.set_user_attr(ARTIFACT_DIR_ATTR, location)


def settle_location(study: Any, *, given: str | None, default: str) -> str:
    """Record where ``study`` keeps its artifacts unless it has a place already, and return
    it; :class:`UsageError` when ``given`` names another place than the recorded one (the
    study's checkpoints are there), or when nothing is given and the recorded place is not
    to be trusted (:func:`location_of`)."""
    recorded = _recorded(study)
    mine = normalized(given or default)
    if recorded is None:
        if given is None and not trusted(mine, _home(study)):
            raise _untrusted(study.study_name, mine, _home(study), keeps="would keep")
        record_location(study, mine)
        return mine
    if given is None:
        return location_of(study)
    there = _resolved(recorded, _home(study))
    if there != mine:
        raise UsageError(
            f"study {study.study_name!r} keeps its artifacts in {there}: rerun "
            f"without --artifact-dir, or with --artifact-dir {there}"
        )
    return mine


def _recorded(study: Any) -> str | None:
    recorded = study.user_attrs.get(ARTIFACT_DIR_ATTR)
    if recorded is not None and not isinstance(recorded, str):
        raise DamagedEvidence(
            f"the study's artifact location ({ARTIFACT_DIR_ATTR}) is damaged: it is not a "
            "folder or s3://BUCKET but a " + type(recorded).__name__
        )
    return recorded or None  # an empty one: none


def _home(study: Any) -> str | None:
    """The folder of the study's SQLite database or journal file (``None``: a server)."""
    from scalertune._storage._optuna import storage_file

    path = storage_file(study)
    return None if path is None else os.path.dirname(path)


def _resolved(recorded: str, home: str | None) -> str:
    """A recorded location as a place: a bucket, or a folder's absolute path (one recorded
    relative to the storage file's folder found there; older studies recorded every folder
    absolute)."""
    if is_bucket(recorded) or os.path.isabs(recorded):
        return normalized(recorded)
    return os.path.normpath(os.path.join(home or os.getcwd(), recorded))


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it, by name: ``..`` cannot leave it."""
    path, folder = os.path.normpath(os.path.abspath(path)), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class Store:
    """The artifact store at a location, its calls riding out an outage. ``path(name)`` is the
    file of an artifact in a folder (``None`` in a bucket)."""

    def __init__(self, location: str, *, pinned: bool = False) -> None:
        self.location, self.pinned = location, pinned
        self._inner: Any = None

    def __getstate__(self) -> dict[str, Any]:  # crosses to an isolated run's process
        return {"location": self.location, "pinned": self.pinned, "_inner": None}

    @property
    def inner(self) -> Any:
        """Optuna's store object (made on first use: boto3 is imported only for a bucket)."""
        if self._inner is None:
            self._inner = _open(self.location, pinned=self.pinned)
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
        from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

        bucket = self.location[len(S3) :]
        try:
            self.inner.client.head_bucket(Bucket=bucket)
        except (NoCredentialsError, PartialCredentialsError):
            raise UsageError(
                f"artifact store {self.location}: boto3 finds no credentials: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials)"
            ) from None
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


def _open(location: str, *, pinned: bool = False) -> Any:
    if not is_bucket(location):
        os.makedirs(location, exist_ok=True)
        return _Folder(location, pinned=pinned)
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

    def __init__(self, base: str, *, pinned: bool = False) -> None:
        self.base = base
        # ``pinned`` (the dashboard, which judged the folder as it started): reads go to the
        # folder opened now, so one swapped for a link to another afterwards is not read
        self._folder = (
            os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if pinned else None
        )

    def open_reader(self, artifact_id: str) -> IO[bytes]:
        """The artifact's file, opened without following a link, and only where it is a
        regular file: a symbolic link (to ``/etc/shadow``), a FIFO or a device put in its
        place is no artifact (the dashboard serves what this returns)."""
        from optuna.artifacts.exceptions import ArtifactNotFound

        path = self._file(artifact_id)
        if self._folder is not None:
            path = os.path.basename(path)  # in the folder opened at the start
        try:
            # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of hanging
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self._folder)
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {artifact_id} in {self.base}") from None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise _refused(artifact_id, self.base, "is a symbolic link") from None
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            os.close(fd)
            raise _refused(artifact_id, self.base, "is not a regular file")
        if self._folder is not None and found.st_nlink != 1:
            # served to whoever reaches the dashboard: a file written here has one name, and
            # a hard link from outside (where the kernel allows one to a file the linker may
            # not read) is not served
            os.close(fd)
            raise _refused(artifact_id, self.base, "has other names")
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


def _refused(artifact_id: str, base: str, what: str) -> Exception:
    """Optuna's ``ArtifactNotFound`` for a file in the artifact's place that is not read
    (``what`` it is kept as ``refused``: a checkpoint's reader names it as damage)."""
    from optuna.artifacts.exceptions import ArtifactNotFound

    exc = ArtifactNotFound(f"artifact {artifact_id} in {base} {what}: not read")
    exc.refused = what  # type: ignore[attr-defined]
    return exc
