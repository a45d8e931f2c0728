"""The study's pictures as Optuna artifacts: uploaded once by content to the study's artifact
store (:mod:`scalertune._storage._store`), and found again by the notes that embed them.

Optuna refuses attributes, artifacts included, on a trial that has finished, and which trial
is recommended is known only after all have: every picture is a *study* artifact, and its
file name (:func:`~scalertune._review._plots.picture_path`, ``STEM.horizon.png``) says which
trial it shows, or that it is the horizon's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import IO, Any

import optuna

from scalertune._review._horizon_plot import is_horizon_picture
from scalertune._review._plots import picture_trial
from scalertune._storage._optuna import artifact_records, study_id
from scalertune._storage._store import Store, record_location

#: An artifact's id as Optuna gives it (a UUID): never a path.
_ARTIFACT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: The largest picture of ours is a few hundred KB; a stored file larger is not one.
_PICTURE_BYTES = 2**26


@dataclasses.dataclass(frozen=True)
class Pictures:
    """The dashboard's URLs of a study's pictures: one per trial drawn, and the horizon's."""

    trials: dict[int, str] = dataclasses.field(default_factory=dict)
    horizon: str | None = None


def upload(study: optuna.Study, paths: list[str], location: str) -> None:
    """Attach the PNGs at ``paths`` to ``study`` in the artifact store at ``location``,
    skipping any whose content is there; then record ``location`` as the study's store."""
    from optuna.artifacts import upload_artifact

    store = Store(location)
    # The same pictures come back under other names (`report -o other.yaml`, a resumed
    # search): compare contents, not names.
    stored = set()
    for meta in artifact_metas(study):
        digest = _stored_digest(store, meta.artifact_id)
        if digest is not None:
            stored.add(digest)
    for path in paths:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest not in stored:
            upload_artifact(
                artifact_store=store.inner,
                file_path=path,
                study_or_trial=study,
                mimetype="image/png",
            )
            stored.add(digest)
    # recorded once the pictures are there: a store that could not be written is not where
    # the study keeps its artifacts from now on
    record_location(study, location)


def _stored_digest(store: Store, artifact_id: str) -> str | None:
    """The SHA-256 of a stored picture, read a chunk at a time; ``None`` when there is
    none, or it is larger than a picture of ours (not one to compare with)."""
    from optuna.artifacts.exceptions import ArtifactNotFound

    def digest(f: IO[bytes]) -> str | None:
        sha, size = hashlib.sha256(), 0
        while chunk := f.read(2**20):
            sha.update(chunk)
            size += len(chunk)
            if size > _PICTURE_BYTES:
                return None
        return sha.hexdigest()

    try:
        return store.read(artifact_id, digest)
    except ArtifactNotFound:
        return None


def artifact_metas(study: optuna.Study) -> list[Any]:
    """Optuna's records of the study's artifacts (``ArtifactMeta``), those that are one: a
    record is read back from the study, which others may write to, so each is checked (JSON
    of a bounded size, a UUID for its id, text for its name and type). A record that is not
    one is passed over (its picture, where it was one of ours, is uploaded again)."""
    from optuna.artifacts import ArtifactMeta

    metas = []
    for text in artifact_records(study).values():
        try:
            found = json.loads(text) if isinstance(text, str) and len(text) < 4096 else None
        except ValueError:
            found = None
        if (
            isinstance(found, dict)
            and isinstance(found.get("artifact_id"), str)
            and _ARTIFACT_ID.fullmatch(found["artifact_id"]) is not None
            and isinstance(found.get("filename"), str)
            and isinstance(found.get("mimetype"), str)
            and (found.get("encoding") is None or isinstance(found["encoding"], str))
        ):
            metas.append(
                ArtifactMeta(
                    artifact_id=found["artifact_id"],
                    filename=found["filename"],
                    mimetype=found["mimetype"],
                    encoding=found.get("encoding"),
                )
            )
    return metas


def pictures_of(study: optuna.Study) -> Pictures:
    """The dashboard's URLs of the study's pictures (the last one uploaded, where one was
    drawn more than once: artifacts come back in the order they were stored)."""
    trials, horizon = {}, None
    for meta in artifact_metas(study):
        url = f"/artifacts/{study_id(study)}/{meta.artifact_id}"
        number = picture_trial(meta.filename)
        if number is not None:
            trials[number] = url
        elif is_horizon_picture(meta.filename):
            horizon = url
    return Pictures(trials, horizon)


class ArtifactStores:
    """Optuna's artifact store protocol over several stores: studies of one storage may each
    keep their artifacts in their own place, and the dashboard takes one store. Artifact ids
    are UUIDs, so an id names one file in one store."""

    #: Whether each folder is read as it was when the stores were made (:class:`Store`).
    pinned = False

    def __init__(self, locations: list[str]) -> None:
        self.locations = locations
        self._stores = [Store(location, pinned=self.pinned) for location in locations]
        if self.pinned:
            for store in self._stores:
                store.inner  # noqa: B018  (opened now: the folder as judged at the start)

    def open_reader(self, artifact_id: str) -> IO[bytes]:
        return self._in_each(artifact_id, lambda store: store.inner.open_reader(artifact_id))

    def write(self, artifact_id: str, content_body: IO[bytes]) -> None:
        self._stores[0].inner.write(artifact_id, content_body)

    def remove(self, artifact_id: str) -> None:
        self._in_each(artifact_id, lambda store: store.inner.remove(artifact_id))

    def _in_each(self, artifact_id: str, action: Any) -> Any:
        from optuna.artifacts.exceptions import ArtifactNotFound

        for store in self._stores:
            try:
                return action(store)
            except ArtifactNotFound:
                continue
        raise ArtifactNotFound(f"artifact {artifact_id} is in none of {self.locations}")
