"""What the command line checks of the files it is given: the storage's, the output's."""

from __future__ import annotations

import contextlib
import os
import re

from scalertune._amp._schema import TEMPORARY_SUFFIX_CHARS
from scalertune._errors import UsageError


def _remove_if_unused(storage: str, new_files: list[str]) -> None:
    """Remove the files this command created for a storage that holds no study: input
    refused after the storage was opened leaves nothing behind."""
    if not new_files:
        return
    import optuna

    from scalertune._storage._open import open_storage

    try:
        opened = open_storage(storage, must_exist=True)
        empty = not optuna.get_all_study_summaries(opened, include_best_trial=False)
        engine = getattr(opened, "engine", None)
        if engine is not None:
            engine.dispose()
    except Exception:  # nothing is removed that cannot be shown to be empty
        return
    if empty:
        for path in new_files:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _check_study_name(name: str) -> None:
    from scalertune._storage._optuna import max_study_name_length

    if not name.strip() or name.strip(".") == "":
        raise UsageError(
            f"--study-name {name!r} names nothing (the default YAML is named after the study, "
            "and would be hidden or have no name): pass a name, or leave the flag out"
        )
    longest = max_study_name_length()
    if len(name) > longest:
        raise UsageError(
            f"the study name is {len(name)} characters long; Optuna's storages hold "
            f"at most {longest}: pass a shorter --study-name"
        )


def _check_storage_and_output(
    storage: str, output: str | None, artifact_dir: str | None, inputs: dict[str, str]
) -> None:
    """The storage's own files must be usable, and the output YAML (and the PNGs written
    beside it) must be a new or regular file, in a folder that exists, that is none of the
    files the study owns or the search reads."""
    from scalertune._storage._open import check_local, owned_files
    from scalertune._storage._store import default_location, is_bucket, normalized

    check_local(storage)
    artifacts = normalized(artifact_dir) if artifact_dir else default_location(storage)
    if artifact_dir is not None and os.path.exists(artifacts) and not os.path.isdir(artifacts):
        raise UsageError(f"--artifact-dir {artifact_dir} is a file: name a folder")
    if artifact_dir is not None and any(_same(artifacts, f) for f in owned_files(storage)):
        raise UsageError(f"--artifact-dir {artifact_dir} is the study's storage: name a folder")
    if output is None:
        return
    path = os.path.abspath(output)
    if os.path.isdir(path):
        raise UsageError(
            f"--output {output} is a folder: name a file, e.g. {os.path.join(output, 'amp.yaml')}"
        )
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise UsageError(
            f"--output {output}: the folder {folder} does not exist: create it, "
            "or write the YAML elsewhere"
        )
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {output}: the folder {folder} is not writable")
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"--output {output} is not a regular file: name a YAML file")
    longest = os.path.splitext(os.path.basename(path))[0] + _LONGEST_PICTURE_SUFFIX
    limit = _name_max(folder)
    if len(os.path.basename(path)) + TEMPORARY_SUFFIX_CHARS > limit or len(longest) > limit:
        raise UsageError(
            f"--output {output}: the file names written there (up to "
            f"{len(longest)} characters) exceed this file system's {limit}: "
            "pass a shorter --output (or --study-name)"
        )
    owned = {f: "storage" for f in owned_files(storage)}
    owned.update({f: what for what, f in inputs.items() if f and os.path.isfile(f)})
    for file, what in owned.items():
        if _same(path, file):
            raise UsageError(
                f"--output {output} is the study's {what}: writing the YAML there "
                "would destroy it; pass another --output"
            )
    if not is_bucket(artifacts) and (path == artifacts or path.startswith(artifacts + os.sep)):
        raise UsageError(
            f"--output {output} is inside the artifact folder {artifacts}, which "
            "the study owns: pass another --output"
        )


def _check_not_narrower(output: str, horizon: int) -> None:
    """A result file is never rewritten with evidence over a shorter horizon than the one it
    holds (another study's answer, checked further): refused in one line, the file as it
    was. A file that is no result file is written over as before."""
    if not os.path.isfile(output):
        return
    from scalertune._amp._yaml import read_yaml

    try:
        data = read_yaml(output, what="a scalertune result file")
    except UsageError:
        return
    evidence = data.get("evidence") if isinstance(data, dict) else None
    if not isinstance(evidence, dict):
        return
    had = evidence.get("horizon")
    if isinstance(had, int) and not isinstance(had, bool) and had > horizon:
        raise UsageError(
            f"{output} holds evidence over steps 0-{had} (study "
            f"{evidence.get('study')!r}), and this answer's covers steps 0-{horizon}: it is "
            "not overwritten; pass another --output, or remove the file first"
        )


#: The longest name a picture written beside the YAML takes after its stem
#: (``STEM.deepspeed-default.trial-N.png``, N up to ten digits).
_LONGEST_PICTURE_SUFFIX = ".deepspeed-default.trial-0123456789.png"


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no answer
        return 255


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file: the same path, a symlink to it, or a hard link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _default_output(study_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", study_name) + ".yaml"
