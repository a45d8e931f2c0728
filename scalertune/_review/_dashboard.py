"""What optuna-dashboard shows for a scalertune study: notes in words, pictures as artifacts.

The loss curves (intermediate values), the judged trial attributes, the constraints and the
objective's name are written by the search itself; this module adds what needs more than
Optuna's core:

- a study note (Markdown): the recommendation, its verdict, the baselines, the pictures, how
  to read the dashboard's curves and roles, and the YAML itself;
- a note on every trial: what the run is (its role), what happened, and for the
  recommended one a mark and its picture. The dashboard puts a trial's note at the top of the
  trial's page, above the attributes;
- the PNGs of the recommendation and of PyTorch's defaults, uploaded once each (by content)
  as study artifacts. (Optuna refuses attributes, artifacts included, on a trial that has
  finished, and which trial is recommended is known only after all have.) optuna-dashboard
  0.21 previews study artifacts as 200 x 150 thumbnails that do not enlarge, so the notes
  embed the same artifacts at full size, as its own note editor does.

Notes need the optional ``optuna-dashboard`` package (``pip install 'scalertune[dashboard]'``).
"""

from __future__ import annotations

import hashlib
import os
from typing import IO, TYPE_CHECKING, Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._errors import UsageError
from scalertune._judge._outcome import Outcome
from scalertune._review._describe import describe_outcome
from scalertune._review._plots import picture_trial
from scalertune._storage._names import (
    ARTIFACT_DIR_ATTR,
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_RECOMMENDED,
    ROLE_REFERENCE,
    ROLE_SEARCH,
    SETTINGS_ATTR,
)
from scalertune._storage._open import DEFAULT_ARTIFACT_DIR
from scalertune._storage._redact import redact
from scalertune._text import readable

if TYPE_CHECKING:
    from scalertune._review._result import SearchResult

_INSTALL = "pip install 'scalertune[dashboard]'"

#: What each value of a trial's ``role`` attribute means, as the study note lists them.
ROLES = {
    ROLE_REFERENCE: "float32, no autocast, no scaler: its final smoothed loss plus "
                    f"{_policy.TARGET_TOLERANCE:.0%} is the target of every run on its seed; "
                    "the yardstick, not a candidate",
    ROLE_BASELINE: "`pytorch-default` (PyTorch's defaults) and `init-scale-4096` (the usual "
                   "manual fix), run once per study",
    ROLE_SEARCH: "a config the sampler chose",
    ROLE_CONFIRM: "one of the best configs rerun on another seed, judged against that "
                  "seed's own float32 reference",
    ROLE_FLOAT32_CLIP: "float32 clipped as the recommendation is, when that differs from the "
                       "workload's own clipping: what the clipping alone does, so that the "
                       "verdict credits the precision only with its own gain",
    ROLE_RECOMMENDED: "the study's answer: one more trial with the recommended config (float32 "
                      "when no AMP config is confirmed), added after the confirmations so that "
                      "it is the dashboard's Best Trial",
}


def have_dashboard() -> bool:
    try:
        import optuna_dashboard  # noqa: F401
    except ImportError:
        return False
    return True


def artifact_dir_of(study: optuna.Study, override: str | None = None) -> str:
    """Where this study's artifacts live: ``override``, the stored one, or the default."""
    return os.path.abspath(override or study.user_attrs.get(ARTIFACT_DIR_ATTR)
                           or DEFAULT_ARTIFACT_DIR)


def publish(result: "SearchResult", *, pictures: dict[int, str] | None = None,
            artifact_dir: str | None = None) -> None:
    """Attach ``pictures`` (trial number -> PNG) to the study as artifacts, skipping any
    whose content is already there, and, when optuna-dashboard is installed, write the study
    note and every trial's note."""
    study = result.study
    if study is None:
        raise ValueError("the result has no study attached (build it with analyze())")
    if pictures:
        _upload(study, pictures, artifact_dir_of(study, artifact_dir))
    if have_dashboard():
        _write_notes(result)


def _upload(study: optuna.Study, pictures: dict[int, str], directory: str) -> None:
    from optuna.artifacts import (
        FileSystemArtifactStore,
        get_all_artifact_meta,
        upload_artifact,
    )

    os.makedirs(directory, exist_ok=True)
    if study.user_attrs.get(ARTIFACT_DIR_ATTR) != directory:
        study.set_user_attr(ARTIFACT_DIR_ATTR, directory)
    store = FileSystemArtifactStore(directory)
    # The same pictures come back under other names (`report -o other.yaml`, a resumed
    # search): compare contents, not names.
    stored = set()
    for meta in get_all_artifact_meta(study):
        digest = _stored_digest(store, meta.artifact_id)
        if digest is not None:
            stored.add(digest)
    for path in pictures.values():
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest not in stored:
            upload_artifact(artifact_store=store, file_path=path, study_or_trial=study,
                            mimetype="image/png")
            stored.add(digest)


def _stored_digest(store: Any, artifact_id: str) -> str | None:
    from optuna.artifacts.exceptions import ArtifactNotFound

    try:
        with store.open_reader(artifact_id) as f:
            return hashlib.sha256(f.read()).hexdigest()
    except ArtifactNotFound:
        return None


def pictures_of(study: optuna.Study) -> dict[int, str]:
    """Trial number -> the dashboard's URL of that trial's picture, among the study's
    artifacts (the last one uploaded, when a trial was drawn more than once)."""
    from optuna.artifacts import get_all_artifact_meta

    urls = {}
    for meta in get_all_artifact_meta(study):
        number = picture_trial(meta.filename)
        if number is not None:
            urls[number] = f"/artifacts/{study._study_id}/{meta.artifact_id}"  # noqa: SLF001
    return urls


def _write_notes(result: "SearchResult") -> None:
    from optuna_dashboard import get_note, save_note

    study = result.study
    pictures = pictures_of(study)
    body = study_note(result, pictures)
    if get_note(study) != body:
        save_note(study, body)
    for frozen in study.get_trials(deepcopy=False):
        body = trial_note(frozen, result, pictures)
        if body is None:
            continue
        trial = optuna.Trial(study, frozen._trial_id)  # noqa: SLF001
        if get_note(trial) != body:
            save_note(trial, body)


def _is_recommended(trial: FrozenTrial, result: "SearchResult") -> bool:
    """Whether ``trial`` is the answer: the run of the recommended config (the float32
    reference when float32 is recommended), or the ``recommended`` trial that repeats it."""
    if trial.user_attrs.get("role") == ROLE_RECOMMENDED:
        return trial.user_attrs.get("config") == result.config.to_dict()
    if result.recommended is not None:
        return trial.number == result.recommended.number
    return result.reference is not None and trial.number == result.reference["trial"]


def trial_note(trial: FrozenTrial, result: "SearchResult",
               pictures: dict[int, str] | None = None) -> str | None:
    """What a trial is and what happened to it, in words; ``None`` while it runs."""
    if trial.state in (TrialState.RUNNING, TrialState.WAITING):
        return None
    attrs = trial.user_attrs
    role = attrs.get("role")
    recommended = _is_recommended(trial, result)
    title = {
        ROLE_REFERENCE: f"float32 reference, seed {attrs.get('seed')}",
        ROLE_BASELINE: f"baseline `{attrs.get('baseline')}`",
        ROLE_SEARCH: "search trial",
        ROLE_CONFIRM: f"confirmation of trial {attrs.get('confirms')} on seed {attrs.get('seed')}",
        ROLE_FLOAT32_CLIP: f"float32 with trial {attrs.get('clip_of')}'s clipping",
        ROLE_RECOMMENDED: "the recommendation" if recommended else "an earlier recommendation",
    }.get(role, role or "no role recorded")
    mark = ("★ " if role == ROLE_RECOMMENDED else "★ recommended, ") if recommended else ""
    lines = [f"### Trial {trial.number}: {mark}{title}", ""]
    if role in ROLES:
        lines += [f"*{role}*: {ROLES[role]}.", ""]
    config = attrs.get("config")
    if isinstance(config, dict):
        from scalertune._amp._config import AmpConfig

        lines += [f"Config: `{AmpConfig.from_dict(config).describe()}`", ""]
    lines += _what_happened(trial, result)
    if recommended:
        lines += [_confirmed(result), ""]
    if trial.intermediate_values:
        lines += [f"Curve (intermediate values): log10 of the smoothed loss over seed "
                  f"{attrs.get('seed')}'s float32 target, one point per "
                  f"{_policy.READBACK_INTERVAL}-step window; 0 is the target, 1 ten times "
                  "above it.", ""]
    url = (pictures or {}).get(trial.number)
    if url:
        lines += [f"![trial {trial.number}: loss over the float32 target"
                  f"{', and loss scale' if _uses_scaler(config) else ''}]({url})", ""]
    return "\n".join(lines)


def _confirmed(result: "SearchResult") -> str:
    rec = result.recommended
    if rec is None:
        return (f"**Recommended**: float32. {result.verdict[:1].upper()}{result.verdict[1:]}.")
    confirmations = sorted(result.confirmations.get(rec.number, {}).items())
    seeds = [rec.seed, *(seed for seed, _ in confirmations)]
    reruns = ", ".join(str(o.number) for _, o in confirmations)
    return (f"**Recommended**: trial {rec.number}'s config, confirmed on seeds "
            f"{', '.join(map(str, seeds))}" + (f" (trials {reruns})" if reruns else "") + ".")


def _uses_scaler(config: Any) -> bool:
    return isinstance(config, dict) and config.get("dtype") == "float16"


def _what_happened(trial: FrozenTrial, result: "SearchResult") -> list[str]:
    attrs = trial.user_attrs
    if trial.state == TrialState.FAIL:
        error = attrs.get("error") or "no error recorded (its worker died)"
        return [f"**Failed**: `{error}`", "",
                "The error came from the workload's code under this config; the search "
                "moved on.", ""]
    if attrs.get("role") == ROLE_RECOMMENDED:
        if _is_recommended(trial, result):
            return ["The study's answer, added once its confirmations finished; its value is "
                    "the least time to target among the runs of this config (and of configs "
                    "as fast within the timing noise), so that it is the dashboard's Best "
                    "Trial.", ""]
        return ["The answer before later trials changed it; the note of the study names "
                "the current one.", ""]
    if attrs.get("role") == ROLE_REFERENCE:
        steps = attrs.get("steps_to_target")
        return [f"Target loss {_g(attrs.get('target_loss'))}, reached after {steps} steps "
                f"at {_ms(attrs.get('step_time_s'))} per step.", ""]
    if "config" not in attrs:
        return []
    outcome = Outcome.from_trial(trial)
    if outcome.state == "pruned":
        return [f"**Pruned: {attrs.get('pruned_because')}**, after "
                f"{attrs.get('steps_run')} steps", "", f"{outcome.attrs.get('prune_reason')}",
                ""]
    lines = [f"**Outcome**: {describe_outcome(outcome)}.", ""]
    if attrs.get("duplicate_of") is not None:
        lines += [f"The same config as trial {attrs['duplicate_of']}: its result is reused, "
                  "nothing was trained again.", ""]
    if not outcome.reached:
        lines += ["**Infeasible** in the dashboard: a run that never reaches the float32 "
                  "target breaks the constraint `target_gap` <= 0, so it is never the best "
                  "trial.", ""]
    figures = [f"{label} {shown}" for label, shown in (
        ("time to target", _s(attrs.get("time_to_target_s"))),
        ("step time", _ms(attrs.get("step_time_s"))),
        ("skipped steps", attrs.get("skipped_steps")),
        ("loss scale down to", _g(attrs.get("min_scale")) if _uses_scaler(attrs["config"])
         else None),
        ("final loss / float32's", _g(attrs.get("loss_vs_float32"))),
    ) if shown is not None]
    if figures:
        lines += ["; ".join(figures) + ".", ""]
    return lines


def _g(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value)):g}"


def _s(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value)):g} s"


def _ms(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value) * 1e3):g} ms"


def study_note(result: "SearchResult", pictures: dict[int, str] | None = None) -> str:
    """The study note: the summary a reviewer needs first, how to read the dashboard, then
    the YAML itself."""
    from scalertune._amp._schema import result_document
    s = result.settings
    lines = [f"## scalertune: {result.study_name}", "",
             f"Workload `{s.get('factory')}`, {s.get('steps')} steps, seed {s.get('seed')}, "
             f"search space `{(s.get('space') or {}).get('name')}`, on {s.get('device')}.", ""]
    rec = result.recommended
    if rec is not None:
        seeds = [rec.seed, *sorted(result.confirmations.get(rec.number, {}))]
        lines.append(f"**Recommended:** ★ trial {rec.number}, `{rec.config.describe()}`, "
                     f"confirmed on seeds {', '.join(map(str, seeds))}: {describe_outcome(rec)}.")
    else:
        reference = result.reference["trial"] if result.reference else None
        lines.append("**Recommended:** float32 (no autocast, no scaler)"
                     + (f": the float32 reference, trial {reference}" if reference is not None
                        else "") + ".")
    lines += ["", f"**Verdict:** {result.verdict}.", "",
              "| run | config | outcome |", "| --- | --- | --- |"]
    if result.reference:
        ref = result.reference
        lines.append(f"| float32 reference (trial {ref['trial']}) | float32 | target loss "
                     f"{_g(ref['target_loss'])}, {_ms(ref.get('step_time_s'))} per step |")
    for name, outcome in result.baselines.items():
        lines.append(f"| {name} (trial {outcome.number}) | `{outcome.config.describe()}` | "
                     f"{describe_outcome(outcome)} |")
    hint = result.forward_overflow_hint()
    if hint:
        lines += ["", hint]
    pruned = result.pruned_by_kind
    if pruned:
        lines += ["", "Pruned: " + ", ".join(f"{n} {k}" for k, n in sorted(pruned.items()))
                  + ". Each pruned trial's note says why."]
    document = yaml.safe_dump(result_document(result.to_dict()), sort_keys=False, width=100)
    lines += ["", *_pictures_section(result, pictures or {}), *_reading_guide(result),
              "### Recommendation YAML", "", "```yaml", document.rstrip(), "```", ""]
    return "\n".join(lines)


def _pictures_section(result: "SearchResult", pictures: dict[int, str]) -> list[str]:
    shown = []
    if result.recommended is not None:
        shown.append((result.recommended.number, "the recommendation"))
    default = result.baselines.get("pytorch-default")
    if default is not None and all(n != default.number for n, _ in shown):
        shown.append((default.number, "PyTorch's defaults"))
    lines = []
    for number, what in shown:
        if number in pictures:
            lines += [f"![trial {number}, {what}: loss over the float32 target]"
                      f"({pictures[number]})", ""]
    return (["### Pictures", "", *lines] if lines else [])


def _reading_guide(result: "SearchResult") -> list[str]:
    rec = result.recommended
    shown = [t.number for t in result.study.get_trials(deepcopy=False)
             if t.user_attrs.get("role") == ROLE_RECOMMENDED and _is_recommended(t, result)]
    best = (f"trial {rec.number}" if rec is not None
            else f"float32 (the reference, trial {result.reference['trial']})"
            if result.reference else "float32")
    if shown:
        best = f"trial {shown[-1]} (role *recommended*), which repeats {best}"
    lines = [
        "### Reading this study in the dashboard", "",
        "- **Objective**, *time to target (s)*: steps to the float32 target x step time. A "
        "run that never reaches the target is *infeasible* (its constraint "
        "`target_gap`, how far its best smoothed loss stayed above the target relative to the "
        "target, is > 0) and is never the best trial.",
        f"- **Best Trial** is the recommendation: {best}.",
        f"- **Intermediate values**: each run's smoothed loss against the float32 target of "
        f"its seed, as log10(loss / target), one point per {_policy.READBACK_INTERVAL}-step "
        "window. 0 is the target; 1 is ten times above it, -1 a tenth of it: losses that "
        "start thousands of times above the target read on the same axis as the last steps. "
        "A pruned run's curve stops where it was pruned. Confirmation runs are judged against "
        "their own seed's target.",
        "- **Roles**: every trial's `role` attribute, on its page (Trials) and in the table "
        "of the Smart Selection page:",
        "", "| role | the run |", "| --- | --- |",
        *(f"| {role} | {what} |" for role, what in ROLES.items()), "",
        "- **Notes**: each trial's note says what it is and what happened; ★ marks the "
        "recommended trial.", "",
    ]
    return lines


def serve(studies: list[optuna.Study], *, storage_url: str, host: str, port: int,
          artifact_dir: str | None = None) -> None:
    """Refresh the notes of ``studies``, then run the real optuna-dashboard server on their
    storage, which shows every study it holds (blocks).

    Only notes change: the study note carries the storage URL it was given (redacted), as
    the search's own note does, so an unchanged study keeps the note it has.
    """
    if not have_dashboard():
        raise UsageError(f"optuna-dashboard is not installed: {_INSTALL}")
    from optuna_dashboard import run_server

    from scalertune._review._analyze import analyze

    for study in studies:
        if study.user_attrs.get(SETTINGS_ATTR) is not None:
            _write_notes(analyze(study, storage=redact(storage_url)))
    folders = sorted({artifact_dir_of(s, artifact_dir) for s in studies})
    store = _ArtifactFolders([f for f in folders if os.path.isdir(f)])
    run_server(studies[0]._storage, host=host, port=port,  # noqa: SLF001
               artifact_store=store if store.folders else None)


class _ArtifactFolders:
    """Optuna's artifact store protocol over several folders: studies of one storage may
    each keep their artifacts in their own ``--artifact-dir``, and the dashboard takes one
    store. Artifact ids are UUIDs, so an id names one file in one folder."""

    def __init__(self, folders: list[str]) -> None:
        from optuna.artifacts import FileSystemArtifactStore

        self.folders = folders
        self._stores = [FileSystemArtifactStore(f) for f in folders]

    def open_reader(self, artifact_id: str) -> IO[bytes]:
        return self._in_each(artifact_id, lambda store: store.open_reader(artifact_id))

    def write(self, artifact_id: str, content_body: IO[bytes]) -> None:
        self._stores[0].write(artifact_id, content_body)

    def remove(self, artifact_id: str) -> None:
        self._in_each(artifact_id, lambda store: store.remove(artifact_id))

    def _in_each(self, artifact_id: str, action: Any) -> Any:
        from optuna.artifacts.exceptions import ArtifactNotFound

        for store in self._stores:
            try:
                return action(store)
            except ArtifactNotFound:
                continue
        raise ArtifactNotFound(f"artifact {artifact_id} is in none of {self.folders}")
