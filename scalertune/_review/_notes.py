"""Each trial's note in optuna-dashboard: what the run is (its role), what happened, and where
its evidence is.

The dashboard puts a trial's note at the top of the trial's page, above the attributes, so
the note says in words what the attributes hold in figures: for a run, how it trained and,
over a long horizon, how its branches did; for a branch (role ``phase``), where it was
branched from, how it did against float32 over its window and which trials to select to see
float32's continuation beside it; for the recommendation, a mark and its picture.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._errors import DamagedEvidence
from scalertune._judge._findings import Findings
from scalertune._judge._horizon import behind_from, phases_of
from scalertune._judge._judged import Judged
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult
from scalertune._judge._reference import Reference
from scalertune._judge._stored import read_records
from scalertune._review._artifacts import Pictures
from scalertune._review._describe import describe_outcome, why_not
from scalertune._review._verdict import verdict
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_PHASE,
    ROLE_RECOMMENDED,
    ROLE_REFERENCE,
    ROLE_REPLAY,
    ROLE_SEARCH,
)
from scalertune._storage._optuna import study_id
from scalertune._storage._trial_record import Job, Marks, Recommendation, role_of
from scalertune._text import readable

#: What each value of a trial's ``role`` attribute means, as the study note lists them.
ROLES = {
    ROLE_REFERENCE: "float32, no autocast, no scaler: its final smoothed loss plus "
    f"{_policy.TARGET_TOLERANCE:.0%} is the target of every run on its seed; "
    "over a long horizon it trains to the horizon once, keeping checkpoints "
    "for the branches; the yardstick, not a candidate",
    ROLE_BASELINE: "`pytorch-default` (PyTorch's defaults) and `init-scale-4096` (the usual "
    "manual fix), and where the space tries float8 `torchao-default` (torchao's default "
    "recipe, tensorwise), run once per study",
    ROLE_SEARCH: "a config the sampler chose",
    ROLE_CONFIRM: "one of the best configs rerun on another seed, judged against that "
    "seed's own float32 reference",
    ROLE_FLOAT32_CLIP: "float32 clipped as the best AMP config is, when that differs from the "
    "workload's own clipping: what the clipping alone does, so that the "
    "verdict credits the precision only with its own gain",
    ROLE_PHASE: "a finalist (`of`) branched from the float32 reference's checkpoint at the "
    "first step of a phase window of the horizon (`start`-`end`), trained over "
    "the window and compared with float32's own continuation over the same "
    "steps, or (`start` 0) trained from step 0 and judged at every window it "
    "reached; evidence, not a candidate",
    ROLE_ISLAND: "a finalist (`island_of`) with one module kept in float32, proposed where "
    "a late phase found that module's precision limiting the fit; trained from "
    "the start and branched at the phases like the finalists",
    ROLE_REPLAY: "the float16 scaler setting the replay of float32's gradients found best "
    "over the horizon, trained to check it",
    ROLE_RECOMMENDED: "the study's answer: one more trial with the recommended config (float32 "
    "when no AMP config is faster here), added once the runs it rests on "
    "finished; it carries the curve, figures and time to target of the run "
    "it repeats (`recommends`), and `scalertune dashboard` shows it as the "
    "Best Trial",
}


@dataclasses.dataclass(frozen=True)
class _Records:
    """A trial's stored records, read once for its note."""

    trial: FrozenTrial
    job: Job
    marks: Marks
    judged: Judged

    @classmethod
    def of(cls, trial: FrozenTrial) -> _Records:
        """``trial``'s records; :class:`DamagedEvidence` where one is damaged."""
        return cls(trial, Job.of_trial(trial), Marks.of_trial(trial), Judged.of_trial(trial))


def is_recommended(trial: FrozenTrial, result: Findings) -> bool:
    """Whether ``trial`` is the answer: the run of the recommended config (float32 at the best
    AMP config's clip, or the float32 reference, when float32 is the answer), or the
    ``recommended`` trial that repeats it (one whose record is damaged is none)."""
    if role_of(trial) != ROLE_RECOMMENDED:
        return _is_chosen(trial.number, result)
    try:
        return Job.of_trial(trial).config == result.config
    except DamagedEvidence:
        return False


def _is_answer(read: _Records, result: Findings) -> bool:
    """:func:`is_recommended`, of the records read already."""
    if read.job.role == ROLE_RECOMMENDED:
        return read.job.config == result.config
    return _is_chosen(read.trial.number, result)


def _is_chosen(number: int, result: Findings) -> bool:
    """Whether trial ``number`` is the run of the recommended config."""
    chosen = result.recommended or result.float32_choice
    if chosen is not None:
        return number == chosen.number
    return result.reference is not None and number == result.reference.trial


def trial_note(
    trial: FrozenTrial, result: Findings, pictures: Pictures | None = None
) -> str | None:
    """What a trial is and what happened to it, in words; ``None`` while it runs."""
    if trial.state in (TrialState.RUNNING, TrialState.WAITING):
        return None
    why = result.damaged.get(trial.number)
    if why is None:
        try:
            read = _Records.of(trial)
        except DamagedEvidence as exc:  # in a part the judgement does not check, or since
            why = str(exc)
    if why is not None:
        return f"### Trial {trial.number}: damaged evidence\n\n{why}: left out.\n"
    job = read.job
    lines = [f"### Trial {trial.number}: {_mark(read, result)}{_title(read, result)}", ""]
    if job.role in ROLES:
        lines += [f"*{job.role}*: {ROLES[job.role]}.", ""]
    if job.config is not None:
        lines += [f"Config: `{job.config.describe()}`", ""]
    if job.role == ROLE_PHASE and trial.state != TrialState.FAIL:
        lines += branch_lines(read, result)
    else:
        lines += _what_happened(read, result)
        lines += _over_the_horizon(read, result)
    if _is_answer(read, result):
        lines += [_confirmed(result), ""]
    if trial.intermediate_values:
        lines += [_curve_line(read), ""]
    url = (pictures.trials if pictures else {}).get(trial.number)
    if url:
        lines += [
            f"![trial {trial.number}: loss over the float32 target"
            f"{', and loss scale' if _uses_scaler(job) else ''}]({url})",
            "",
        ]
    return "\n".join(lines)


def _title(read: _Records, result: Findings) -> str:
    job = read.job
    return {
        ROLE_REFERENCE: f"float32 reference, seed {job.seed}",
        ROLE_BASELINE: f"baseline `{job.baseline}`",
        ROLE_SEARCH: "search trial",
        ROLE_CONFIRM: f"confirmation of trial {job.confirms} on seed {job.seed}",
        ROLE_FLOAT32_CLIP: f"float32 with trial {job.clip_of}'s clipping",
        ROLE_PHASE: (
            f"trial {job.of}'s config from step 0 to {job.end}"
            if job.from_start
            else f"branch of trial {job.of} at steps {job.start}-{job.end}"
        ),
        ROLE_ISLAND: f"island of trial {job.island_of}",
        ROLE_REPLAY: "the replay's scaler setting",
        ROLE_RECOMMENDED: (
            "the recommendation" if _is_answer(read, result) else "an earlier recommendation"
        ),
    }.get(str(job.role), str(job.role or "no role recorded"))


def _mark(read: _Records, result: Findings) -> str:
    if _is_answer(read, result):
        return "★ " if read.job.role == ROLE_RECOMMENDED else "★ recommended, "
    best = result.best_amp
    if result.recommended is None and best is not None and read.trial.number == best.number:
        return "☆ best AMP config that holds (for a GPU), "
    return ""


def _confirmed(result: Findings) -> str:
    rec = result.recommended
    if rec is None:
        return f"**Recommended**: {result.config.describe()}. {_sentence(verdict(result))}."
    confirmations = sorted(result.confirmations.get(rec.number, {}).items())
    seeds = [rec.seed, *(seed for seed, _ in confirmations)]
    reruns = ", ".join(str(o.number) for _, o in confirmations)
    return (
        f"**Recommended**: trial {rec.number}'s config, confirmed on seeds "
        f"{', '.join(map(str, seeds))}" + (f" (trials {reruns})" if reruns else "") + "."
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _uses_scaler(job: Job) -> bool:
    return job.config is not None and job.config.uses_scaler


def _curve_line(read: _Records) -> str:
    job, steps = read.job, sorted(read.trial.intermediate_values)
    # a long run's curve is thinned: say the spacing it has
    every = steps[1] - steps[0] if len(steps) > 1 else _policy.READBACK_INTERVAL
    where = (
        f", at the absolute steps of its window ({steps[0]}-{steps[-1]})"
        if job.role == ROLE_PHASE
        else ""
    )
    return (
        f"Curve (intermediate values): log10 of the smoothed loss over seed "
        f"{job.seed}'s float32 target, one point per {every} steps{where}; 0 is "
        "the target, 1 ten times above it."
    )


def _what_happened(read: _Records, result: Findings) -> list[str]:
    trial, job, judged = read.trial, read.job, read.judged
    if trial.state == TrialState.FAIL:
        error = read.marks.error or "no error recorded (its worker died)"
        return [
            f"**Failed**: `{error}`",
            "",
            "The error came from the workload's code under this config; the search moved on.",
            "",
        ]
    if job.role == ROLE_RECOMMENDED:
        return _recommended_lines(read, result)
    if job.role == ROLE_REFERENCE:
        return _reference_lines(trial)
    if job.config is None:
        return []
    outcome = Outcome.from_trial(trial)
    if outcome.state == "pruned":
        return [
            f"**Pruned: {judged.pruned_because}**, after {judged.figures.steps_run} steps",
            "",
            f"{outcome.prune_reason}",
            "",
            "A pruned trial has no objective value: its curve ends where it was "
            "pruned, and the History plot leaves it out.",
            "",
        ]
    lines = [f"**Outcome**: {describe_outcome(outcome)}.", ""]
    if read.marks.duplicate_of is not None:
        lines += [
            f"The same config as trial {read.marks.duplicate_of}: its result is reused, "
            "nothing was trained again.",
            "",
        ]
    if not outcome.reached:
        lines += [
            "**Infeasible** in the dashboard: a run that never reaches the float32 "
            "target breaks the constraint `target_gap` <= 0, so it is never the best "
            "trial.",
            "",
        ]
    return lines + _figures(read)


def _reference_lines(trial: FrozenTrial) -> list[str]:
    try:
        ref = Reference.from_trial(trial)
    except DamagedEvidence as exc:  # left out of the judgement, and run again
        return [f"**Damaged**: {exc}.", ""]
    return [
        f"Target loss {as_g(ref.target_loss)}, reached after {ref.steps_to_target} steps "
        f"at {as_ms(ref.step_time_s)} per step; trained {ref.steps_run} steps.",
        "",
    ]


def _recommended_lines(read: _Records, result: Findings) -> list[str]:
    if not _is_answer(read, result):
        return [
            "The answer before later trials changed it; the note of the study names "
            "the current one.",
            "",
        ]
    try:
        recommendation = Recommendation.of_trial(read.trial)
    except DamagedEvidence:
        recommendation = Recommendation()
    source = recommendation.recommends
    repeats = (
        f"the float32 reference, trial {recommendation.reference_trial}"
        if source == "float32"
        else f"trial {source}"
    )
    return [
        f"The study's answer, added once the runs it rests on finished. It repeats "
        f"{repeats}: its curve and figures are that run's, and its value is that run's "
        "time to target as the summary prints it. `scalertune dashboard` shows it as the "
        "Best Trial, even where a faster run (one that did not hold, or was not "
        "confirmed) has a smaller value.",
        "",
        *_figures(read),
    ]


def _figures(read: _Records) -> list[str]:
    """The figures as the trial's page shows them: rounded for reading as its attributes
    are, then as the note says them."""
    figures = read.judged.figures
    said = [
        f"{label} {shown}"
        for label, shown in (
            ("time to target", as_s(readable(figures.time_to_target_s))),
            ("step time", as_ms(readable(figures.step_time_s))),
            ("skipped steps", figures.skipped_steps),
            (
                "loss scale down to",
                as_g(readable(figures.min_scale)) if _uses_scaler(read.job) else None,
            ),
            ("final loss / float32's", as_g(readable(figures.loss_vs_float32))),
        )
        if shown is not None
    ]
    return ["; ".join(said) + ".", ""] if said else []


def _over_the_horizon(read: _Records, result: Findings) -> list[str]:
    """A branched run's verdict over the horizon, with its branches' trial numbers."""
    trial = read.trial
    done = result.phases.get(trial.number)
    if not done or read.job.role == ROLE_RECOMMENDED:
        return []
    numbers = branch_numbers(result)
    cells = ", ".join(
        f"{p.describe()} (trial {numbers.get((trial.number, p.start), '?')})" for p in done
    )
    outcome = Outcome.from_trial(trial)
    holds = result.holds(outcome)
    verdict = {
        True: "**Holds for the horizon**",
        False: "**Does not hold for the horizon**",
        None: "**Over the horizon** (branches pending)",
    }[holds]
    said = f"{verdict}: its loss over float32's in each phase window, {cells}."
    return [
        said + (f" It {why_not(result, outcome)}." if holds is False else ""),
        "",
    ]


def branch_numbers(result: Findings) -> dict[tuple[int, int], int]:
    """(run number, window start) -> the trial number of its finished branch (the last one,
    where a branch was retried)."""
    if result.study is None:
        return {}
    out: dict[tuple[int, int], int] = {}
    for t in result.study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)
    ):
        job = _phase_job(t)
        if job is None or job.of is None:
            continue
        if job.from_start:  # one run from step 0 judged at every window it reached
            for p in _judged_phases(t, job.of):
                out[job.of, p.start] = t.number
        elif job.start is not None:
            out.setdefault((job.of, job.start), t.number)
    return out


def _phase_job(trial: FrozenTrial) -> Job | None:
    """A phase trial's job; ``None`` for another role, or a record that is damaged (left out,
    as the judgement leaves it)."""
    if role_of(trial) != ROLE_PHASE:
        return None
    try:
        return Job.of_trial(trial)
    except DamagedEvidence:
        return None


def branch_lines(read: _Records, result: Findings) -> list[str]:
    """A branch's note: what it is, how it did against float32, and where float32's own
    continuation over the same steps is."""
    trial, job = read.trial, read.job
    start, end, of = job.start, job.end, job.of
    ref = result.references.get(job.seed or 0)
    ref_trial = None if ref is None else ref.trial
    scale = readable(read.judged.initial_scale)
    scaler = (
        f"; its loss scaler started at {as_g(scale)} (`initial_scale`: where the replay "
        f"of this config over float32's gradients puts it by step {start}, not at "
        "`init_scale`, whose start-up back-offs a real run would have left behind)"
        if _uses_scaler(job) and scale is not None
        else ""
    )
    if job.from_start:
        judged = _judged_phases(trial, of) if of is not None else []
        return [
            f"**What it is**: trial {of}'s config trained from step 0 to step {end} on "
            "the batches float32 trained on, its scaler from `init_scale`, as your run "
            "will be (a branch shows whether a config can follow float32 from float32's "
            "weights; this run shows whether it gets there). It is judged at each phase "
            f"window it reached against float32's losses at the same steps: "
            f"{behind_from(judged)}.",
            "",
            *([_branch_verdict(judged[-1]), ""] if judged else []),
            _continuation(read, result, ref_trial),
            "",
        ]
    lines = [
        f"**What it is**: trial {of}'s config, branched from the float32 reference's "
        f"checkpoint at step {start} (trial {'?' if ref is None else ref.trial}: the weights, "
        "optimizer and scheduler state, data position and random state float32 had "
        f"there), trained for steps {start}-{end} on the batches float32 trained on"
        f"{scaler}.",
        "",
    ]
    judged = _judged_phases(trial, of) if of is not None else []
    if judged:
        lines += [_branch_verdict(judged[0]), ""]
    lines += [_continuation(read, result, ref_trial), ""]
    return lines


def _branch_verdict(phase: PhaseResult) -> str:
    half = phase.start + (phase.end - phase.start) // 2
    rule = (
        f"A branch falls behind when its loss is more than {_policy.PHASE_TOLERANCE:.0%} "
        f"above float32's and more than {_policy.PHASE_Z:g} standard errors of the paired "
        f"difference; it goes non-finite when more than "
        f"{_policy.PHASE_NONFINITE_SHARE:.0%} of its losses are inf/NaN or it was pruned."
    )
    if phase.nonfinite:
        return f"**Non-finite** over steps {phase.start}-{phase.end}. {rule}"
    said = "**Holds**" if phase.holds else "**Falls behind float32**"
    return (
        f"{said}: its loss is {readable(phase.ratio):g}x float32's over steps {half}-"
        f"{phase.end}, the window's last half, paired step by step ({readable(phase.z):g} "
        f"standard errors of the difference). {rule}"
    )


def _continuation(read: _Records, result: Findings, reference: int | None) -> str:
    trial, start, end = read.trial, read.job.start, read.job.end
    if reference is None:
        return "float32's continuation: its reference trial is not in this study."
    pages = ""
    if result.study is not None:
        sid = study_id(result.study)
        pages = (
            f" [Trials {reference} and {trial.number}](/dashboard/studies/{sid}/trials"
            f"?numbers={reference},{trial.number}) shows their pages side by side."
        )
    # optuna-dashboard draws every trial's curve in one plot, each a legend entry that
    # Plotly toggles: isolating two is how one selects them there
    return (
        f"**float32's continuation** over steps {start}-{end} is the reference's own "
        f"curve, trial {reference}: its intermediate values cover the whole horizon, "
        "against the same target. The study page's Intermediate values plot draws the "
        f"trials on one axis: in its legend, double-click `trial #{reference}` (it alone "
        f"stays), then click `trial #{trial.number}`, to see this branch beside float32 "
        f"at steps {start}-{end}.{pages}"
    )


def as_g(value: Any) -> str | None:
    """A figure rounded for reading (``None`` stays ``None``)."""
    return None if value is None else f"{readable(float(value)):g}"


def as_s(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value)):g} s"


def as_ms(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value) * 1e3):g} ms"


def _judged_phases(trial: FrozenTrial, of: int) -> list[PhaseResult]:
    """What phase run ``trial`` found of run ``of``, window by window, its records checked and
    read once; none where its evidence is damaged."""
    try:
        records = read_records(trial)
    except DamagedEvidence:
        return []
    return phases_of([trial], lambda _: records).get(of, [])
