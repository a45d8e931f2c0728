"""What optuna-dashboard shows for a scalertune study: the study note, the notes of the
trials (:mod:`._notes`), the pictures (:mod:`._artifacts`) and ``scalertune dashboard``.

The loss curves (intermediate values), the judged trial attributes, the constraints and the
objective's name are written by the search itself; this module adds what needs more than
Optuna's core:

- a study note (Markdown): the recommendation, its verdict, the horizon and what the
  evidence covers, the baselines, the finalists' phases, what the scaler will do, the
  pictures, how to read the dashboard's curves and roles, and the YAML itself;
- a note on every trial (:func:`._notes.trial_note`);
- the PNGs of the recommendation, of PyTorch's defaults and of the horizon, uploaded once
  each (by content) as study artifacts. optuna-dashboard 0.21 previews study artifacts as
  200 x 150 thumbnails that do not enlarge, so the notes embed the same artifacts at full
  size, as its own note editor does;
- the server (:func:`serve`), whose Best Trial is the recommendation (:mod:`._server`).

Notes need the optional ``optuna-dashboard`` package (``pip install 'scalertune[dashboard]'``).
"""

from __future__ import annotations

import optuna
import yaml

from scalertune import _policy
from scalertune._amp._config import defaults_words
from scalertune._amp._schema import result_document
from scalertune._errors import UsageError
from scalertune._judge._findings import Findings
from scalertune._judge._settings import StudySettings
from scalertune._judge._speedup import EMULATED, emulated
from scalertune._review._artifacts import Pictures, pictures_of, upload
from scalertune._review._describe import (
    describe_outcome,
    evidence_of,
    forecast_line,
    overflow_hint,
    unjudged,
    why_not,
)
from scalertune._review._document import document
from scalertune._review._horizon_plot import branched_runs
from scalertune._review._notes import (
    ROLES,
    as_g,
    as_ms,
    branch_numbers,
    is_recommended,
    trial_note,
)
from scalertune._review._runs import runs_lines
from scalertune._review._scaler_advice import (
    article_fix_line,
    replay_agreement,
    scaler_advice,
)
from scalertune._review._verdict import covers, verdict
from scalertune._storage._names import ROLE_RECOMMENDED
from scalertune._storage._optuna import trial_handle
from scalertune._storage._redact import redact
from scalertune._storage._store import location_of
from scalertune._storage._trial_record import role_of

_INSTALL = "pip install 'scalertune[dashboard]'"


def have_dashboard() -> bool:
    try:
        import optuna_dashboard  # noqa: F401
    except ImportError:
        return False
    return True


def publish(
    result: Findings, *, pictures: dict[int, str] | None = None, artifact_dir: str | None = None
) -> None:
    """Attach ``pictures`` (trial number -> PNG, as :meth:`SearchResult.write_pictures`
    returns them; the horizon's under the float32 reference's number) to the study as
    artifacts, skipping any whose content is already there, and, when optuna-dashboard is
    installed, write the study note and every trial's note."""
    study = result.study
    if study is None:
        raise ValueError("the result has no study attached (build it with analyze())")
    if pictures:
        upload(study, list(pictures.values()), location_of(study, artifact_dir))
    if have_dashboard():
        write_notes(result)


def write_notes(result: Findings) -> None:
    """The study note and every finished trial's note, each saved only where it changed."""
    from optuna_dashboard import get_note, save_note

    study = result.study
    if study is None:
        raise ValueError("the result has no study attached (build it with analyze())")
    pictures = pictures_of(study)
    body = study_note(result, pictures)
    if get_note(study) != body:
        save_note(study, body)
    for frozen in study.get_trials(deepcopy=False):
        note = trial_note(frozen, result, pictures)
        if note is None:
            continue
        trial = trial_handle(study, frozen)
        if get_note(trial) != note:
            save_note(trial, note)


def study_note(result: Findings, pictures: Pictures | None = None) -> str:
    """The study note: the summary a reviewer needs first, how to read the dashboard, then
    the YAML itself."""
    s = result.settings
    horizon = f", horizon {result.horizon} steps" if result.long else ""
    lines = [
        f"## scalertune: {result.study_name}",
        "",
        f"Workload `{s.factory}`, {s.steps} steps per trial{horizon}, seed {s.seed}, "
        f"search space `{s.space_name}`, on {s.device}.",
        "",
        _horizon_line(result),
        "",
        *_answer_lines(result),
        "",
        f"**Verdict:** {verdict(result)}.",
        "",
        *_runs_table(result),
    ]
    if result.long:
        lines += ["", *_phases_section(result)]
    advice = [
        text
        for text in (
            scaler_advice(result),
            article_fix_line(result),
            replay_agreement(result),
            forecast_line(result),
        )
        if text
    ]
    if advice:
        lines += [
            "",
            "### What the replay of float32's gradients says",
            "",
            *(f"- {_literal(a)}." for a in advice),
        ]
    hint = overflow_hint(result)
    if hint:
        lines += ["", hint]
    if result.runs:
        lines += ["", "### Real runs", "", "```", *runs_lines(result.runs), "```"]
    pruned = result.pruned_by_kind
    if pruned:
        lines += [
            "",
            "Pruned: "
            + ", ".join(f"{n} {k}" for k, n in sorted(pruned.items()))
            + ". Each pruned trial's note says why.",
        ]
    shown = yaml.safe_dump(result_document(document(result)), sort_keys=False, width=100)
    lines += [
        "",
        *_pictures_section(result, pictures or Pictures()),
        *_reading_guide(result),
        "### Recommendation YAML",
        "",
        "```yaml",
        shown.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _literal(text: str) -> str:
    """``text`` with Markdown's emphasis escaped: the replay writes powers as ``2**-8.5``."""
    return text.replace("*", r"\*")


def _horizon_line(result: Findings) -> str:
    steps = result.settings.steps
    covered = f"evidence covers {covers(result)}"
    if not result.long:
        return f"**Horizon:** the trial's {steps} steps (no `--horizon`): {covered}."
    windows = " and ".join(f"{a}-{b}" for a, b in result.windows)
    ref = result.reference
    where = f" (trial {ref.trial})" if ref else ""
    return (
        f"**Horizon:** {result.horizon} steps. The trials cover steps 0-{steps}; the "
        f"float32 reference{where} trained to the horizon, and each finalist was branched "
        f"from its checkpoints for steps {windows} and compared there with float32's own "
        f"continuation: {covered}."
    )


def _answer_lines(result: Findings) -> list[str]:
    rec, best = result.recommended, result.best_amp
    if rec is not None:
        seeds = [rec.seed, *sorted(result.confirmations.get(rec.number, {}))]
        return [
            f"**Recommended:** ★ trial {rec.number}, `{rec.config.describe()}`, confirmed "
            f"on seeds {', '.join(map(str, seeds))}: {describe_outcome(rec)}."
        ]
    choice = result.float32_choice
    if choice is not None:
        run = f": trial {choice.number} (role *float32-clip*)"
    else:
        run = (
            f": the float32 reference, trial {result.reference.trial}" if (result.reference) else ""
        )
    lines = [f"**Recommended:** {result.config.describe()} (no autocast, no scaler){run}."]
    if best is not None:
        seeds = [best.seed, *sorted(result.confirmations.get(best.number, {}))]
        holds = f"; {evidence_of(result, best)}" if result.long else ""
        speed = result.speedup
        device = result.settings.device
        if best.config.float8 and emulated(device):  # as the summary and the YAML: no speed
            said = f"ran float8 emulated on {device} ({EMULATED})"
        elif speed is not None:
            said = speed.verdict(device, note=False)
        else:
            said = f"not faster than float32 beyond the noise on {device}"
        lines += [
            "",
            f"**Best AMP config that holds:** ☆ trial {best.number}, "
            f"`{best.config.describe()}`, confirmed on seeds "
            f"{', '.join(map(str, seeds))}: {describe_outcome(best)}{holds}. "
            f"{said[0].upper()}{said[1:]}; on a GPU, use it (`evidence.best_amp` in the "
            "YAML) or run the search there.",
        ]
    return lines


def _runs_table(result: Findings) -> list[str]:
    lines = ["| run | config | outcome |", "| --- | --- | --- |"]
    if result.reference:
        ref = result.reference
        lines.append(
            f"| float32 reference (trial {ref.trial}) | float32 | target loss "
            f"{as_g(ref.target_loss)}, {as_ms(ref.step_time_s)} per step |"
        )
    for name, outcome in result.baselines.items():
        lines.append(
            f"| {name} (trial {outcome.number}) | `{outcome.config.describe()}` | "
            f"{describe_outcome(outcome)} |"
        )
    return lines


def _phases_section(result: Findings) -> list[str]:
    """Each branched run's loss over float32's in each window, with the branch's trial."""
    windows, numbers = result.windows, branch_numbers(result)
    lines = [
        "### Phases of the horizon",
        "",
        "Each finalist's loss over float32's over the last half of each window (its "
        "branch's trial in brackets); a branch falls behind above "
        f"{1 + _policy.PHASE_TOLERANCE:g}x when beyond the noise.",
        "",
        "| run | config | " + " | ".join(f"{a}-{b}" for a, b in windows) + " | holds |",
        "| --- | --- | " + " | ".join("---" for _ in windows) + " | --- |",
    ]
    for run in branched_runs(result):
        done = {p.start: p for p in result.phases.get(run.number, [])}
        cells = []
        for start, _ in windows:
            phase, branch = done.get(start), numbers.get((run.number, start))
            cell = (
                "-"
                if phase is None
                else "non-finite"
                if phase.nonfinite
                else (f"{phase.ratio:.3g}x" + (" behind" if phase.behind else ""))
            )
            cells.append(cell + (f" (trial {branch})" if branch is not None else ""))
        verdict = {
            True: "yes",
            False: "no",
            None: unjudged(result) + (" (an earlier one held)" if result.best_amp else ""),
        }[result.holds(run)]
        lines.append(
            f"| {run.label} (trial {run.number}) | `{run.config.describe()}` | "
            + " | ".join(cells)
            + f" | {verdict} |"
        )
    failed = [
        f"- {run.label}: {why_not(result, run)}."
        for run in branched_runs(result)
        if result.holds(run) is False
    ]
    return lines + (["", *failed] if failed else [])


def _pictures_section(result: Findings, pictures: Pictures) -> list[str]:
    shown = []
    best = result.recommended or result.best_amp
    if best is not None:
        what = (
            "the recommendation"
            if result.recommended is not None
            else "the best AMP config that holds"
        )
        shown.append((best.number, what))
    default = result.defaults
    if default is not None and all(n != default.number for n, _ in shown):
        shown.append((default.number, defaults_words(result.deepspeed)))
    lines = []
    for number, what in shown:
        if number in pictures.trials:
            lines += [
                f"![trial {number}, {what}: loss over the float32 target]"
                f"({pictures.trials[number]})",
                "",
            ]
    if pictures.horizon and result.long:
        lines += [
            f"![the horizon: each finalist's loss over float32's at the same step, "
            f"steps 0-{result.horizon}]({pictures.horizon})",
            "",
        ]
    return ["### Pictures", "", *lines] if lines else []


def _reading_guide(result: Findings) -> list[str]:
    rec = result.recommended or result.float32_choice
    trials = result.study.get_trials(deepcopy=False) if result.study is not None else []
    shown = [
        t.number for t in trials if role_of(t) == ROLE_RECOMMENDED and is_recommended(t, result)
    ]
    best = (
        f"trial {rec.number}"
        if rec is not None
        else f"float32 (the reference, trial {result.reference.trial})"
        if result.reference
        else "float32"
    )
    if shown:
        best = (
            f"trial {shown[-1]} (role *recommended*), which repeats {best}: its curve, "
            "figures and value (the time to target, as the summary prints it) are that "
            "run's"
        )
    return [
        "### Reading this study in the dashboard",
        "",
        "- **Objective**, *time to target (s)*: steps to the float32 target x step time. A "
        "run that never reaches the target is *infeasible* (its constraint "
        "`target_gap`, how far its best smoothed loss stayed above the target relative to the "
        "target, is > 0) and is never the best trial. Pruned trials have no value, so the "
        "History plot holds times to target only; float32 runs, confirmations and branches "
        "have the value inf (yardsticks and evidence, not candidates).",
        f"- **Best Trial** is the recommendation: {best}. `scalertune dashboard` shows it "
        "even where a faster run has a smaller value (one that did not hold for the horizon, "
        "or was not confirmed); plain `optuna-dashboard` shows the smallest value.",
        f"- **Intermediate values**: each run's smoothed loss against the float32 target of "
        f"its seed, as log10(loss / target), one point per {_policy.READBACK_INTERVAL}-step "
        "window. 0 is the target; 1 is ten times above it, -1 a tenth of it: losses that "
        "start thousands of times above the target read on the same axis as the last steps. "
        "A pruned run's curve stops where it was pruned. Confirmation runs are judged against "
        "their own seed's target. A branch (role *phase*) has its curve at the steps of its "
        "window: to see float32's continuation over the same steps beside it, double-click "
        "the float32 reference in the plot's legend (it alone stays), then click the "
        "branch.",
        "- **Roles**: every trial's `role` attribute, on its page (Trials) and in the table "
        "of the Smart Selection page:",
        "",
        "| role | the run |",
        "| --- | --- |",
        *(f"| {role} | {what} |" for role, what in ROLES.items()),
        "",
        "- **Notes**: each trial's note says what it is and what happened; ★ marks the "
        "recommended trial"
        + (
            "; ☆ the best AMP config that holds, for a GPU"
            if result.recommended is None and result.best_amp
            else ""
        )
        + ".",
        "",
    ]


def serve(
    studies: list[optuna.Study],
    *,
    storage_url: str,
    host: str,
    port: int,
    artifact_dir: str | None = None,
    writable: bool = False,
) -> None:
    """Refresh the notes of ``studies``, then run the real optuna-dashboard server on their
    storage, which shows every study it holds (blocks); its Best Trial of a scalertune study
    is the study's latest ``recommended`` trial (:func:`._server.recommended_best`). It
    refuses requests that would change the study unless ``writable``
    (:func:`._server.read_only`).

    Only notes change: the study note carries the storage URL it was given (redacted), as
    the search's own note does, so an unchanged study keeps the note it has.
    """
    if not have_dashboard():
        raise UsageError(f"optuna-dashboard is not installed: {_INSTALL}")
    from scalertune._review._analyze import analyze
    from scalertune._review._server import run

    locations = sorted({location_of(s, artifact_dir) for s in studies})  # refused first
    for study in studies:
        if StudySettings.of(study).stored:
            write_notes(analyze(study, storage=redact(storage_url)))
    run(studies, host=host, port=port, locations=locations, writable=writable)
