"""What optuna-dashboard shows for a scalertune study: notes in words, pictures as artifacts.

The loss curves (intermediate values), the judged trial attributes and the objective's name
are written by the search itself; this module adds what needs more than Optuna's core:

- a study note (Markdown): the float32 reference, the baselines' outcome, the
  recommendation, its verdict and the YAML itself;
- a trial note on every pruned or failed trial, saying why in words;
- the PNGs of the recommendation and of PyTorch's defaults, attached to the study as
  artifacts (Optuna core), which the dashboard previews on the study page. (Optuna refuses
  attributes, artifacts included, on a trial that has finished, and which trial is
  recommended is known only after all have.)

Notes need the optional ``optuna-dashboard`` package (``pip install 'scalertune[dashboard]'``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import optuna
import yaml

from scalertune._errors import UsageError

if TYPE_CHECKING:
    from scalertune._result import SearchResult

ARTIFACT_DIR_ATTR = "scalertune.artifact_dir"
DEFAULT_ARTIFACT_DIR = "scalertune-artifacts"
_INSTALL = "pip install 'scalertune[dashboard]'"


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
    """Attach ``pictures`` (trial number -> PNG) to the study as artifacts and, when
    optuna-dashboard is installed, write the study note and the notes of pruned and failed
    trials."""
    study = result.study
    if study is None:
        raise ValueError("the result has no study attached (build it with analyze())")
    if pictures:
        _upload(study, pictures, artifact_dir_of(study, artifact_dir))
    if have_dashboard():
        _write_notes(result)


def _upload(study: optuna.Study, pictures: dict[int, str], directory: str) -> None:
    from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact

    os.makedirs(directory, exist_ok=True)
    if study.user_attrs.get(ARTIFACT_DIR_ATTR) != directory:
        study.set_user_attr(ARTIFACT_DIR_ATTR, directory)
    store = FileSystemArtifactStore(directory)
    # A rerun draws the same pictures again; keep one copy per file name.
    existing = {meta.filename for meta in get_all_artifact_meta(study)}
    for path in pictures.values():
        if os.path.basename(path) not in existing:
            upload_artifact(artifact_store=store, file_path=path, study_or_trial=study,
                            mimetype="image/png")


def _write_notes(result: "SearchResult") -> None:
    from optuna_dashboard import get_note, save_note

    study = result.study
    body = study_note(result)
    if get_note(study) != body:
        save_note(study, body)
    for frozen in study.get_trials(deepcopy=False):
        body = trial_note(frozen)
        if body is None:
            continue
        trial = optuna.Trial(study, frozen._trial_id)  # noqa: SLF001
        if get_note(trial) != body:
            save_note(trial, body)


def trial_note(trial: optuna.trial.FrozenTrial) -> str | None:
    """Why a trial was pruned or failed, in words; ``None`` for trials that finished."""
    attrs = trial.user_attrs
    if trial.state == optuna.trial.TrialState.PRUNED and attrs.get("prune_reason"):
        step = attrs.get("first_nonfinite_step")
        return (f"### Pruned: {attrs.get('pruned_because')}"
                + (f" (first non-finite step {step})" if step is not None else "")
                + f"\n\n{attrs['prune_reason']}\n\nConfig: `{attrs.get('config')}`\n")
    if trial.state == optuna.trial.TrialState.FAIL and attrs.get("error"):
        return (f"### Failed\n\n`{attrs['error']}`\n\nThe error came from the workload's code "
                f"under this config; the search moved on.\n\nConfig: `{attrs.get('config')}`\n")
    return None


def study_note(result: "SearchResult") -> str:
    """The study note: the summary a reviewer needs first, then the YAML itself."""
    from scalertune._result import describe_outcome

    s = result.settings
    lines = [f"## scalertune: {result.study_name}", "",
             f"Workload `{s.get('factory')}`, {s.get('steps')} steps, seed {s.get('seed')}, "
             f"search space `{(s.get('space') or {}).get('name')}`, on {s.get('device')}.", ""]
    rec = result.recommended
    if rec is not None:
        seeds = [rec.seed, *sorted(result.confirmations.get(rec.number, {}))]
        lines.append(f"**Recommended:** trial {rec.number}, `{rec.config.describe()}`, "
                     f"confirmed on seeds {', '.join(map(str, seeds))}: {describe_outcome(rec)}.")
    else:
        lines.append("**Recommended:** float32 (no autocast, no scaler).")
    lines += ["", f"**Verdict:** {result.verdict}.", "",
              "| run | config | outcome |", "| --- | --- | --- |"]
    if result.reference:
        ref = result.reference
        lines.append(f"| float32 reference | float32 | target loss {ref['target_loss']:.4g}, "
                     f"{(ref.get('step_time_s') or 0) * 1e3:.3g} ms/step |")
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
    lines += ["", "### Recommendation YAML", "", "```yaml",
              yaml.safe_dump(result.to_dict(), sort_keys=False, width=100).rstrip(), "```", ""]
    return "\n".join(lines)


def serve(study: optuna.Study, *, host: str, port: int, artifact_dir: str | None = None) -> None:
    """Refresh the notes, then run the real optuna-dashboard server (blocks)."""
    if not have_dashboard():
        raise UsageError(f"optuna-dashboard is not installed: {_INSTALL}")
    from optuna.artifacts import FileSystemArtifactStore
    from optuna_dashboard import run_server

    from scalertune._result import analyze

    _write_notes(analyze(study))
    directory = artifact_dir_of(study, artifact_dir)
    store = FileSystemArtifactStore(directory) if os.path.isdir(directory) else None
    run_server(study._storage, host=host, port=port, artifact_store=store)  # noqa: SLF001
