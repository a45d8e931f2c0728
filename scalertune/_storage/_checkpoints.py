"""Checkpoints in the study's artifact store, each carrying its checksum.

A checkpoint is two artifacts: the file ``torch.save`` wrote (``NAME``), and its manifest
(``NAME.json``: the file's SHA-256, its size and the step it holds), written once the file is
stored whole. A checkpoint without a manifest was never finished; one whose file does not
hash to its manifest is damaged (truncated, emptied, garbled). Reading one checks it, and a
checkpoint that is missing or damaged raises :class:`~scalertune._errors.MissingEvidence` with
one line naming it and what is wrong: what the search does then (an earlier checkpoint, step
0, a retry) is its caller's to say, never a verdict on a config.

A manifest is a checksum, not a signature: whoever can write a checkpoint's file can write
its manifest beside it. Where the user gives a study key (``SCALERTUNE_STUDY_KEY``, the same
on every worker), each manifest also carries an HMAC-SHA256, under that key, of the
checkpoint's name, step and file digest; with the key set, a checkpoint whose HMAC is missing
or wrong is damaged, so that a file planted by someone who can write the store but does not
hold the key is told apart from the study's own. The key is read from the environment when a
manifest is written or checked, and is never stored, printed or put into a message.

Names are fixed by what a checkpoint holds (``STUDY-TOKEN.reference-seed0-step750.pt``), so
that a worker finds the checkpoints another wrote, in this process or an isolated run's,
without an index; the study's name and instance token keep two studies of one name apart in
one store.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import hmac
import json
import os
import re
import shutil
import tempfile
from typing import IO, Any

from scalertune._errors import DamagedEvidence, MissingEvidence
from scalertune._storage._store import Store

#: Bytes hashed at a time.
_CHUNK = 2**20
#: A manifest is a few fields of JSON; one longer than this is not one (and is not read on).
_MANIFEST_BYTES = 4096
#: The environment variable that holds the study key (see the module's docstring).
STUDY_KEY_VARIABLE = "SCALERTUNE_STUDY_KEY"


@dataclasses.dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint of the study, by name, in the store at ``store.location``; where a run
    saves it (``local_path`` then ``publish``: the protocol of
    :func:`scalertune._run._checkpoint.save_checkpoint`) and where it is read from
    (:meth:`fetch`). It crosses to an isolated run's process as it is."""

    store: Store
    name: str

    def local_path(self) -> str:
        """Where the run writes the file before it is stored: the store's own folder, or this
        process's scratch folder for a bucket."""
        path = self.store.path(self.name)
        if path is not None:
            os.makedirs(self.store.location, exist_ok=True)
            return os.path.join(self.store.location, f".tmp-{os.getpid()}-{self.name}")
        return os.path.join(_scratch(), self.name)

    def publish(self, path: str, step: int, written: tuple[str, int] | None = None) -> None:
        """Store the file at ``path`` (removed afterwards), then its manifest: of ``written``
        (the digest and size taken as the bytes were written), else of the file as it is
        read now (another hand that can write the store could swap it in between)."""
        digest, size = written if written is not None else _digest_of_file(path)
        try:
            final = self.store.path(self.name)
            if final is not None:
                os.replace(path, final)
            else:
                self.store.write(self.name, path)
            manifest = os.path.join(_scratch(), f"{self.name}.json.{os.getpid()}")
            record: dict[str, Any] = {"sha256": digest, "bytes": size, "step": step}
            signature = _signature(self.name, step, digest)
            if signature is not None:
                record["hmac"] = signature
            with open(manifest, "w", encoding="utf-8") as f:
                json.dump(record, f)
            self.store.write(self.name + ".json", manifest)
            os.remove(manifest)
        except Exception as exc:  # a full disk, a read-only folder, a bucket refusing
            raise MissingEvidence(
                f"could not store {self.describe()}: {_why(exc)}: free "
                "space or fix the artifact store, and rerun"
            ) from None
        finally:
            if os.path.exists(path):
                os.remove(path)

    def manifest(self) -> dict[str, Any] | None:
        """The manifest (``sha256``, ``bytes``, ``step``); ``None`` when the checkpoint was
        never finished. :class:`MissingEvidence` when the manifest itself is damaged."""
        from optuna.artifacts.exceptions import ArtifactNotFound

        try:
            raw = self.store.read(self.name + ".json", lambda f: f.read(_MANIFEST_BYTES + 1))
        except ArtifactNotFound:
            return None
        except DamagedEvidence:  # a name that is not a file's
            raise
        except Exception as exc:  # unreadable: permissions, a bucket refusing
            raise MissingEvidence(f"{self.describe()} cannot be read: {_why(exc)}") from None
        try:
            found = json.loads(raw) if len(raw) <= _MANIFEST_BYTES else None
        except ValueError:
            found = None
        if (
            not isinstance(found, dict)
            or not isinstance(found.get("sha256"), str)
            # a digest, never a path: the file of a bucket's checkpoint is named by it here
            or not re.fullmatch("[0-9a-f]{64}", found["sha256"])
            or type(found.get("bytes")) is not int
            or type(found.get("step")) is not int
        ):
            raise MissingEvidence(
                f"{self.describe()} is damaged: its checksum record is not readable"
            )
        return dict(found)

    def fetch(self) -> str:
        """The checkpoint's file, checked against its manifest, as a path on this machine;
        :class:`MissingEvidence` naming it when it is missing or damaged."""
        return self.fetch_checked()[0]

    def fetch_checked(self) -> tuple[str, dict[str, Any]]:
        """:meth:`fetch`, with the manifest the file was checked against.

        What is checked is what is loaded: the file is read once, through the store (a
        regular file, no link followed), into this process's own scratch folder, which
        nobody else can write; the digest is of that copy, and the copy is what
        ``torch.load`` opens. A file swapped in the store after the check is never read."""
        from optuna.artifacts.exceptions import ArtifactNotFound

        manifest = self.manifest()
        if manifest is None:
            raise MissingEvidence(f"{self.describe()} is missing")
        self._check_signature(manifest)
        path = os.path.join(_scratch(), f"{manifest['sha256']}.pt")
        try:
            # a folder's file is read again each time (what it holds now is what is judged); a
            # bucket's copy, checked once, is kept for the process's later branches
            if self.store.path(self.name) is not None or not os.path.exists(path):
                # no further than the manifest's size: a longer file is not the one
                self.store.read(self.name, lambda f: _copy_to(f, path, manifest["bytes"]))
            digest, size = _digest_of_file(path)
        except (ArtifactNotFound, FileNotFoundError) as exc:
            refused = getattr(exc, "refused", None)  # a link, a FIFO in its place: not read
            if refused is not None:
                raise MissingEvidence(
                    f"{self.describe()} is damaged: its file {refused}, not read"
                ) from None
            raise MissingEvidence(f"{self.describe()} is missing its file") from None
        except Exception as exc:  # unreadable: permissions, a bucket refusing
            raise MissingEvidence(f"{self.describe()} cannot be read: {_why(exc)}") from None
        if (digest, size) != (manifest["sha256"], manifest["bytes"]):
            os.remove(path)
            raise MissingEvidence(
                f"{self.describe()} is damaged: its file is {size} bytes with another checksum "
                f"than the {manifest['bytes']} bytes written at step {manifest['step']}"
            )
        return path, manifest

    def _check_signature(self, manifest: dict[str, Any]) -> None:
        """:class:`MissingEvidence` when a study key is set and the manifest's HMAC is not
        the one that key gives (none at all included)."""
        expected = _signature(self.name, manifest["step"], manifest["sha256"])
        if expected is None:
            return
        found = manifest.get("hmac")
        if not isinstance(found, str):
            raise MissingEvidence(
                f"{self.describe()} is damaged: it carries no signature, and "
                f"{STUDY_KEY_VARIABLE} is set (a worker without the key wrote it, or "
                "someone else did)"
            )
        if not hmac.compare_digest(found, expected):
            raise MissingEvidence(
                f"{self.describe()} is damaged: its signature is not the study key's "
                "(written under another key, or by someone without it)"
            )

    def describe(self) -> str:
        return f"checkpoint {self.name} in {self.store.location}"


def _signature(name: str, step: int, digest: str) -> str | None:
    """The HMAC-SHA256 of a checkpoint's name, step and file digest under the study key;
    ``None`` when no key is set. The key stays in this function."""
    key = os.environ.get(STUDY_KEY_VARIABLE)
    if not key:
        return None
    message = json.dumps([name, step, digest]).encode("utf-8")
    return hmac.new(key.encode("utf-8"), message, hashlib.sha256).hexdigest()


def digest_of_file(path: str) -> str:
    """The SHA-256 of the file at ``path``, as a manifest holds it."""
    return _digest_of_file(path)[0]


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _digest_of_file(path: str) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


def _copy_to(stream: IO[bytes], path: str, most: int) -> None:
    """``stream`` into the file ``path``, no more than ``most`` bytes and one more (enough
    to tell a longer file from the one its manifest describes)."""
    tmp = f"{path}.{os.getpid()}.part"
    left = most + 1
    with open(tmp, "wb") as f:
        while left > 0 and (chunk := stream.read(min(_CHUNK, left))):
            f.write(chunk)
            left -= len(chunk)
    os.replace(tmp, path)


_SCRATCH: list[str] = []


def _scratch() -> str:
    """This process's own folder (``mkdtemp``: only its user may write it) for files on their
    way to or from a bucket, and the checked copies of checkpoints; removed at exit."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.mkdtemp(prefix="scalertune-"))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]
